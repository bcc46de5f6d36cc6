"""The command line: ``fsdp-lint [PATHS]...``. Exit codes: 0 clean, 1 findings, 2 bad input."""
from __future__ import annotations

import os
import sys
from typing import List, Optional, Tuple

import click

from fsdp_lint.cli_paths import (_SKIP_DIRS, BadInput, collect_files, missing_message,  # noqa: F401 - also cli.*
                                 not_python, skipped_note, split_script_args, use_color as _use_color,
                                 with_path as _with_path)
from fsdp_lint.script_runs import shell_runs as _shell_runs, with_unset_note as _with_unset_note
from fsdp_lint.version import __version__

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
_NO_MODEL = ": no model found"


def _split_codes(values) -> List[str]:
    out = []
    for v in values or ():
        out += [c.strip() for c in v.split(",") if c.strip()]
    return out


def _check_output(output: str) -> None:
    """`-o FILE` can be written: its folder exists and is a folder, and FILE is not a folder."""
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.exists(folder) else "is not a folder"
        raise BadInput(f"cannot write {output}: the folder {folder} {what}")
    if os.path.isdir(output):
        raise BadInput(f"cannot write {output}: it is a folder")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"cannot write {output}: the folder {folder} is not writable")


def plan_runs(files: List[Tuple[str, bool]], settings, script_args: Optional[List[str]]):
    """What to lint: (path, the script's argv, settings, named explicitly). A file with
    ``[[tool.fsdp-lint.entry]]`` tables runs once per entry (its args and settings) unless arguments
    were given after ``--``."""
    runs = []
    entries = list(getattr(settings, "entries", None) or [])
    for path, explicit in files:
        mine = [e for e in entries if os.path.abspath(e.path) == os.path.abspath(path)]
        if mine and script_args is None:
            for e in mine:
                overrides = dict(e.overrides)
                if "world_size" in overrides:   # issue 11: the entry's launch size (FSD703 compares)
                    overrides["world_size_source"] = "config"
                runs.append((path, list(e.args), settings.with_overrides(launched=True, **overrides), explicit, e.cwd))
        else:
            # `-- ARGS`, or a bare `--`: the file is launched (with no arguments), not screened
            launched = script_args is not None and explicit
            runs.append((path, list(script_args or []), settings.with_overrides(launched=launched), explicit, None))
    return runs


_DEFAULT_RUN_RANKS = 2     # --run without --nproc on a file whose launch says nothing: a quick real session


def _run_ranks(results, nproc: Optional[int], world_size: Optional[int]) -> int:
    """--run's ranks: --nproc; else the world the lint planned, which under --run is the launch's (a
    launch script, an [[entry]], the script's own ``Fabric(devices=4)``, a mesh shape) or 2; with
    --world-size (the plan of a larger job), 2 as before."""
    from fsdp_lint.humanize import display_path

    if nproc is not None:
        return nproc
    if world_size is not None:
        return _DEFAULT_RUN_RANKS
    sizes = {}
    for res in results:
        if getattr(res, "plan", None) is not None and not res.skipped:
            sizes.setdefault(res.plan.world_size, display_path(res.path))
    if len(sizes) > 1:
        shown = ", ".join(f"{path}: {size}" for size, path in sorted(sizes.items()))
        from fsdp_lint.run import RunError

        raise RunError(f"the files launch on different world sizes ({shown}): pass --nproc, or run them one at a time")
    return next(iter(sizes), _DEFAULT_RUN_RANKS)


def _reaches_fsdp(path: str) -> bool:
    """Whether a launched file wraps with FSDP (itself or through the project modules it imports): a launch
    script's other lines (a checkpoint conversion after training) do not, and their failure is a note."""
    from fsdp_lint.entry.project import reach

    try:
        return bool(reach(path).reaches_fsdp)
    except Exception:  # noqa: BLE001 - unreadable: the failure stays the error it is
        return True


def _print_rules() -> None:
    from fsdp_lint.check.rule import all_rules
    from fsdp_lint.report.width import fitted

    rows = [[r.code, r.name, r.severity, r.summary] for r in all_rules()]
    click.echo(fitted(rows, ["code", "name", "severity", "summary"], wrap=("summary",)))


def _explain(code: str) -> None:
    from fsdp_lint.check.rule import rule_by_code

    rule = rule_by_code(code)
    if rule is None:
        raise BadInput(f"unknown rule code {code!r} (see fsdp-lint --list-rules)")
    click.echo(f"# {rule.name} ({rule.code})\n\nDefault severity: {rule.severity}. "
               f"Applies to: {', '.join(a.upper() for a in rule.applies_to)}.\n\n{rule.doc()}")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--world-size", "-n", type=int, default=None,
              help="Ranks the job runs on (default 8); a file that builds a mesh is planned for its mesh.")
@click.option("--gpus-per-node", type=int, default=None,
              help="GPUs per node: HYBRID_SHARD's node groups, HSDP replicas across nodes (default 8).")
@click.option("--gpu", default=None, metavar="NAME",
              help="The simulated node's GPU: what CUDA probes answer and the device memory "
                   "(h100 by default; a100-40gb, a100-80gb, h200, b200, mi300x, l40s, l4, a10g, t4, v100).")
@click.option("--gpu-memory", default=None, metavar="SIZE",
              help="The device memory per rank the plan's peak is judged against (80GiB, 40GB; default: the --gpu "
                   "profile's), less the CUDA context, NCCL buffers and fragmentation (FSD801).")
@click.option("--fetch-configs", is_flag=True, default=None,
              help="Fetch the configs and tokenizer files (never weights) of a hub model the lint stops on into the "
                   "local Hugging Face cache, and lint the file again.")
@click.option("--allow-partial", is_flag=True, default=None,
              help="Report plans with elements fsdp-lint does not model (listed as unsupported) instead of exit 2.")
@click.option("--api", type=click.Choice(["fsdp1", "fsdp2"]), default=None,
              help="Override the FSDP API (default: what the file uses; fsdp2 without wrap code).")
@click.option("--wrap", multiple=True, metavar="CLASS_OR_FQN_GLOB",
              help="Make these modules units (class name or FQN glob; repeatable), then the root.")
@click.option("--use-orig-params/--no-use-orig-params", default=None, help="Override FSDP1 use_orig_params.")
@click.option("--model", "model_target", default=None, metavar="TARGET",
              help="The model: path.py:Class, path.py:factory, pkg.mod:factory, path.py:Class(num_layers=4).")
@click.option("--output-format", "--format", "fmt",
              type=click.Choice(["full", "concise", "json", "sarif", "github", "junit", "gitlab", "html"]),
              default="full", show_default=True, help="Output format (html: one self-contained file, use -o).")
@click.option("--quiet", "-q", is_flag=True,
              help="No line on stderr per named file that is not linted (no model or FSDP use): pre-commit runs.")
@click.option("--show-settings", is_flag=True,
              help="Show the settings in effect for the first path (config file, world size, rules) and exit.")
@click.option("--fix", "fix_", is_flag=True, help="Apply the safe fixes ([*]) to the files; report what remains.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply (and mark [*]) the fixes that may change behaviour.")
@click.option("--diff", "diff_", is_flag=True,
              help="Print the fixes as a unified diff instead of writing them (exit 1 when there is one).")
@click.option("--layout", type=click.Choice(["units", "params", "ranks", "diagram"]), default="units",
              show_default=True,
              help="Also show the per-parameter (params) or per-rank (ranks) layout, or draw it (diagram).")
@click.option("--compare-granularity", is_flag=True,
              help="Compare the plan with one unit for the whole model, one per repeated block and one per Linear.")
@click.option("--select", multiple=True, help="Rule codes or prefixes to enable (comma-separated; ALL).")
@click.option("--ignore", multiple=True, help="Rule codes or prefixes to disable (comma-separated).")
@click.option("--extend-select", multiple=True, help="Rule codes or prefixes to add to the selection.")
@click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default=None,
              help="Lowest severity that makes the exit code 1 (default warning).")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--statistics", is_flag=True, help="Show the number of findings per rule.")
@click.option("--explain", metavar="CODE", default=None, help="Show a rule's documentation and exit.")
@click.option("--list-rules", is_flag=True, help="List all rules and exit.")
@click.option("--config", "config_path", type=click.Path(), default=None,
              help="pyproject.toml to read [tool.fsdp-lint] from (default: the nearest one).")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout.")
@click.option("--accelerate-config", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="An accelerate config (YAML/JSON): lint as `accelerate launch --config_file FILE` runs the script; "
                   "with --hf-config and no PATHS, check the config on that model.")
@click.option("--hf-config", type=click.Path(), default=None, metavar="CONFIG_JSON",
              help="A Hugging Face model config (file or directory): used by from_pretrained() in the script "
                   "(nothing is downloaded); with no PATHS, lint that model alone.")
@click.option("--hf-class", default=None, metavar="AUTO_CLASS",
              help="The class --hf-config builds (AutoModelForCausalLM, AutoModelForSeq2SeqLM, LlamaForCausalLM, ...; "
                   "default: the config's architectures).")
@click.option("--run", "run_", is_flag=True, help="Confirm the findings in a short real FSDP session.")
@click.option("--simulate", is_flag=True,
              help="Measure the real peak memory per rank: the plan built for real on fake tensors under a "
                   "fake process group (torch's memory tracker; no GPU, no memory).")
@click.option("--suggest", is_flag=True,
              help="List plans that fit the device (activation checkpointing, the root resharded, CPU offload), "
                   "least communication first, with the change to make.")
@click.option("--nproc", type=int, default=None,
              help="--run: number of ranks [default: the world size of the launch fsdp-lint followed (a launch "
                   "script, an [[entry]], the script's own Fabric/Trainer devices, a mesh), else 2].")
@click.option("--steps", type=int, default=2, show_default=True, help="--run: training steps.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="--run: cuda (NCCL) or cpu (gloo).")
@click.option("--input-shape", default=None, metavar="D0,D1,...",
              help="The training input shape: activations in the memory estimate; --run/--simulate inputs.")
@click.option("--input-dtype", type=click.Choice(["float", "long", "bfloat16", "half"]), default=None,
              help="The training input dtype (default: long for a model that starts with an Embedding).")
@click.option("--run-timeout", type=float, default=300.0, show_default=True,
              help="--run/--simulate: seconds for the whole run.")
@click.option("--no-cache", is_flag=True, envvar="FSDP_LINT_NO_CACHE",
              help="Lint every file afresh (default: a file whose code, arguments, settings, config files and "
                   "environment are unchanged gets its cached result). Also FSDP_LINT_NO_CACHE=1.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Where results are cached (default: $FSDP_LINT_CACHE_DIR, else .fsdp_lint_cache in the "
                   "project root).")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="fsdp-lint")
def cli(paths, world_size, gpus_per_node, gpu, gpu_memory, fetch_configs, allow_partial, api, wrap, use_orig_params, model_target, fmt, layout,
        compare_granularity, select, ignore, extend_select, fail_on, exit_zero, statistics, explain, list_rules,
        config_path, output, accelerate_config, hf_config, hf_class, run_, simulate, suggest, nproc, steps, device,
        input_shape, input_dtype, run_timeout, no_cache, cache_dir, debug, fix_=False, unsafe_fixes=False, diff_=False,
        quiet=False, show_settings=False):
    """Lint PyTorch FSDP wrap code and show the plan FSDP will build.

    PATHS are training or model files, or directories (walked for *.py). Arguments after `--` are the
    script's own (`fsdp-lint train.py -- --config configs/8b.yaml`). Linting runs the entry point's
    setup code (its imports, model construction, wrap code) on the meta device up to the training
    boundary.

    Linting runs the repository's code, each file in a process of its own: run it on untrusted code
    only where you would run that code's tests (README: "What linting runs").
    """
    script_args = (click.get_current_context().obj or {}).get("script_args")
    discovery = []     # (start, --config) of each look-up of the settings: the stored output's inputs
    if list_rules:
        _print_rules()
        return EXIT_CLEAN
    if explain:
        _explain(explain)
        return EXIT_CLEAN
    if hf_class and not hf_config:
        raise BadInput("--hf-class needs --hf-config (the config of the model to build)")
    if not paths and not hf_config:
        discovery.append((os.getcwd(), config_path))
        if not _configured_entries(config_path):
            paths = (".",)      # ruff's default: the current directory
    if world_size is not None and world_size < 1:
        raise BadInput(f"--world-size must be at least 1, got {world_size}")
    if world_size is not None and world_size > (1 << 20):
        raise BadInput(f"--world-size must be at most 1,048,576 (2^20), got {world_size:,}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise BadInput(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if run_ and nproc is not None and nproc < 1:
        raise BadInput(f"--nproc must be at least 1, got {nproc}")
    # refused before anything is linted (issue 18): a bad value found after minutes of linting
    if steps < 1:
        raise BadInput(f"--steps must be at least 1, got {steps}")
    if not 0 < run_timeout <= 86400:
        raise BadInput(f"--run-timeout must be a positive number of seconds, at most 86,400 (a day), got {run_timeout:g}")
    if output:
        _check_output(output)

    from fsdp_lint.config import ConfigError, load_settings, validate
    from fsdp_lint.check.rule import SEVERITY_RANK
    from fsdp_lint.check.selection import check_all_selectors

    missing: List[str] = []
    files = collect_files(paths, missing)
    discovery.append((files[0][0] if files else os.getcwd(), config_path))
    try:
        base = load_settings(files[0][0] if files else os.getcwd(), config_path)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if not files and not hf_config and not missing:
        # no paths: the launch commands of [[tool.fsdp-lint.entry]]
        files = [(e.path, True) for e in dict((e.path, e) for e in base.entries).values()]
    cli_selection = {"select": _split_codes(select), "ignore": _split_codes(ignore),
                     "extend_select": _split_codes(extend_select)}
    settings = base.with_overrides(
        world_size=world_size, api=api, wrap=list(wrap), use_orig_params=use_orig_params, model=model_target,
        fail_on=fail_on, cli_selection=cli_selection if any(cli_selection.values()) else None,
        gpus_per_node=gpus_per_node, gpu=gpu, gpu_memory=gpu_memory, allow_partial=allow_partial or None,
        fetch_configs=fetch_configs or None,
        world_size_source="--world-size" if world_size is not None else None, script_world=True,
        accelerate_config=accelerate_config, hf_config=hf_config, hf_class=hf_class,
        input_shape=input_shape, input_dtype=input_dtype)
    input_shape, input_dtype = settings.input_shape, settings.input_dtype   # [tool.fsdp-lint] input-shape too
    if settings.world_size_source == "default" and settings.world_size != settings.gpus_per_node:
        # no world given: one node of the node's GPUs (`python train.py` on a node of 4 sees 4 devices)
        settings = settings.with_overrides(world_size=settings.gpus_per_node)
    if run_ and os.environ.get("WORLD_SIZE", "").isdigit() and os.environ.get("RANK") and os.environ.get("MASTER_ADDR"):
        nproc = int(os.environ["WORLD_SIZE"])   # under torchrun every process is one rank
    if run_ and world_size is None:
        settings = settings.with_overrides(world_size=nproc or _DEFAULT_RUN_RANKS)
    if suggest:
        # candidates are judged with activations: traced on the inputs --simulate would feed
        settings = settings.with_overrides(suggest=True, activations_for_inferred_inputs=True)
    if simulate:
        # the simulation runs on the inputs the estimate's activations are then traced with
        settings = settings.with_overrides(activations_for_inferred_inputs=True)
    try:
        validate(settings)
        check_all_selectors(settings)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    if show_settings:
        from fsdp_lint.report.text import settings_text

        click.echo(settings_text(settings, paths[0] if paths else files[0][0] if files else "."), nl=False)
        return EXIT_CLEAN

    from fsdp_lint.engine import LintError
    from fsdp_lint.isolation import lint_runs   # each file's code runs in a child process

    results = []
    failures = []  # (path, one-line message)
    for path in missing:   # reported, and the other paths are still linted (exit code 2 at the end)
        failures.append((path, missing_message(path)))
        click.echo(f"fsdp-lint: error: {missing_message(path)}", err=True)
    shell = [(p, e) for p, e in files if e and p.endswith((".sh", ".bash", ".sbatch", ".slurm"))]
    files = [(p, e) for p, e in files if (p, e) not in shell]
    runs = list(plan_runs(files, settings, script_args)) + _shell_runs(shell, settings, script_args, world_size)
    cache = None
    if not (no_cache or run_ or simulate):   # --run and --simulate are there to run
        from fsdp_lint.cache import Cache, default_dir

        cache = Cache(cache_dir or default_dir(base.config_path))
    to_lint = [(path, run_settings, argv, explicit, cwd) for path, argv, run_settings, explicit, cwd
               in runs if not (explicit and not_python(path))]
    record: dict = {}     # what decided each run's result (the stored output's inputs)
    err_notes: List[str] = []
    linted = lint_runs(to_lint, cache=cache, record=record)
    planned: set = set()        # the launch scripts a launch of which got its plan
    besides: list = []          # their launches that build no model
    for path, argv, run_settings, explicit, cwd in runs:
        if explicit and not_python(path):
            msg = _with_path(path, "not a Python file: fsdp-lint lints training scripts and model files (.py); "
                                   "to pass a config to a script, put it after --: "
                                   f"fsdp-lint train.py -- --config {path}")
            failures.append((path, msg))
            click.echo(f"fsdp-lint: error: {msg}", err=True)
            continue
        try:
            outcome = next(linted)
            if run_settings.fetch_configs:    # the hub files its error names, fetched, and the file linted again
                from fsdp_lint.hub_fetch import with_fetches

                outcome = with_fetches(outcome, _relint(lint_runs, (path, run_settings, argv, explicit, cwd), cache),
                                       LintError)
            res = outcome()
            results.append(res)
            planned.add(run_settings.launch_script)
            if res.skipped and explicit and not quiet:
                note = skipped_note(path, res.skipped)
                click.echo(note, err=True)
                err_notes.append(note + "\n")
        except LintError as exc:
            if debug and getattr(exc, "user_exception", None) is not None:
                import traceback

                user = exc.user_exception
                click.echo("".join(traceback.format_exception(type(user), user, user.__traceback__)).rstrip(),
                           err=True)
            elif debug and getattr(exc, "user_traceback", None):   # formatted in the child that linted it
                click.echo(exc.user_traceback.rstrip(), err=True)
            msg = _with_unset_note(_with_path(path, str(exc)), run_settings)
            if run_settings.launch_script and (_NO_MODEL in str(exc) or not _reaches_fsdp(path)):
                besides.append((path, msg, run_settings.launch_script))    # decided once every launch is linted
                continue
            failures.append((path, msg))
            click.echo(f"fsdp-lint: error: {msg}", err=True)
        except Exception as exc:  # a bug or an input we did not foresee: still one line
            if debug:
                raise
            kind = getattr(exc, "type_name", type(exc).__name__)   # isolation: the child's exception
            msg = _with_path(path, f"internal error: {kind}: {_first_line(exc)}"
                                   f" (rerun with --debug for the traceback)")
            failures.append((path, msg))
            click.echo(f"fsdp-lint: error: {msg}", err=True)
    linted.close()
    for path, msg, script in besides:
        # a launch script's line that builds no model (a conversion, an evaluation after training): a note where
        # the script's training launch got its plan, else the script's error
        if script in planned:
            click.echo(f"fsdp-lint: note: {msg} (a line of {os.path.basename(script)} besides its training launch, "
                       f"which is linted)", err=True)
        else:
            failures.append((path, msg))
            click.echo(f"fsdp-lint: error: {msg}", err=True)
    if not paths and hf_config:
        # --hf-config [--accelerate-config]: the model alone, wrapped as accelerate would wrap it
        from fsdp_lint.isolation import lint_call

        shown = accelerate_config or hf_config
        try:   # in a child process, as a file's lint (the config's model code runs)
            results.append(lint_call("fsdp_lint.config_only:lint_config", settings, shown))
        except LintError as exc:
            failures.append((shown, _with_path(shown, str(exc))))
            click.echo(f"fsdp-lint: error: {_with_path(shown, str(exc))}", err=True)
    errors = len(failures)

    run_summary = None
    if run_ and results:
        from fsdp_lint.run import RunError, RunOptions, confirm

        try:
            opts = RunOptions(nproc=_run_ranks(results, nproc, world_size), steps=steps, device=device,
                              input_shape=input_shape, input_dtype=input_dtype, timeout=run_timeout, debug=debug)
            run_summary = confirm(results, settings, opts)
        except RunError as exc:
            click.echo(f"fsdp-lint: error: --run: {exc}", err=True)
            run_summary = getattr(exc, "summary", None)
            errors += 1
        if run_summary is None and os.environ.get("RANK") and os.environ.get("RANK") != "0":
            return EXIT_ERROR if errors else EXIT_CLEAN
    elif run_ and os.environ.get("MASTER_ADDR") and os.environ.get("RANK", "0") != "0":
        return EXIT_ERROR if errors else EXIT_CLEAN   # torchrun, nothing to run: rank 0 reports

    if simulate and results:
        from fsdp_lint.run import RunError, RunOptions
        from fsdp_lint.run.simulate import simulate as run_simulation

        from fsdp_lint.process.reaper import RunGuard   # what a simulated rank starts dies with the run

        opts = RunOptions(input_shape=input_shape, input_dtype=input_dtype, timeout=run_timeout, debug=debug)
        try:
            with RunGuard():
                # progress on stderr, never on stdout (JSON stays parseable); --quiet silences it
                run_simulation(results, settings, opts, progress=None if quiet else
                               (lambda line: click.echo(f"fsdp-lint: {line}", err=True)))
        except RunError as exc:
            click.echo(f"fsdp-lint: error: --simulate: {exc}", err=True)
            errors += 1

    if compare_granularity:
        from fsdp_lint.report.granularity import compare_granularity as compare

        for res in results:
            if not res.skipped and res.plan is not None:
                res.granularity = compare(res, settings)

    fixes = {"unsafe": unsafe_fixes}
    if fix_ or diff_:
        from fsdp_lint.fix.apply import plan_fixes, write

        outcome = plan_fixes([f for r in results for f in r.findings], unsafe_fixes)
        if diff_:
            from fsdp_lint.humanize import display_path

            click.echo(outcome.diff(display_path), nl=False)
            if errors:
                return EXIT_ERROR
            return EXIT_FINDINGS if outcome.changed else EXIT_CLEAN
        write(outcome)
        done = {id(f) for f in outcome.fixed}
        for r in results:
            r.findings = [f for f in r.findings if id(f) not in done]
        fixes["fixed"] = len(outcome.fixed)

    from fsdp_lint.humanize import use_size_units
    from fsdp_lint.report import text as report

    use_size_units(settings)        # tables and summaries in the units of the user's size settings
    if fmt in ("json", "sarif", "github"):
        from fsdp_lint.report import machine

    layout_opt = None if layout == "units" else layout
    if fmt == "json":
        text = machine.render_json(results, layout=layout_opt, run_summary=run_summary, failures=failures)
    elif fmt == "html":
        from fsdp_lint.report.html import render_html

        text = render_html(results, run_summary=run_summary, failures=failures)
    elif fmt == "sarif":
        text = machine.render_sarif(results, failures=failures)
    elif fmt == "github":
        text = machine.render_github(results, failures=failures)
    elif fmt in ("junit", "gitlab"):
        from fsdp_lint.report import ci

        text = (ci.render_junit if fmt == "junit" else ci.render_gitlab)(results, failures=failures)
    else:
        text = report.render_text(results, full=fmt == "full", layout=layout_opt, statistics=statistics,
                                  run_summary=run_summary, failures=failures, fixes=fixes,
                                  color=_use_color(output))
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise BadInput(f"cannot write {output}: {exc}") from None
    else:
        click.echo(text, nl=False, color=True if fmt in ("full", "concise") and _use_color(output) else None)

    if errors:
        return EXIT_ERROR
    threshold = SEVERITY_RANK[settings.fail_on]
    failing = any(SEVERITY_RANK[f.severity] >= threshold for r in results for f in r.findings)
    code = EXIT_FINDINGS if failing and not exit_zero else EXIT_CLEAN
    argv = (click.get_current_context().obj or {}).get("argv")
    if cache is not None and argv is not None and not (output or fix_ or (not paths and hf_config)):
        # a re-run with nothing changed prints this again without importing click or the pipeline
        # (fastpath); what it wrote, as click wrote it (ANSI codes stripped off a stream that is no terminal)
        from fsdp_lint import fastpath

        color = fmt in ("full", "concise") and _use_color(output)
        written = text if color or fastpath._isatty(sys.stdout) else click.unstyle(text)
        notes = "".join(err_notes) if fastpath._isatty(sys.stderr) else click.unstyle("".join(err_notes))
        fastpath.store(cache, argv, script_args, paths, files, discovery, to_lint, record, written, notes, code)
    return code


def _relint(lint_runs, run, cache):
    def lint():
        again = lint_runs([run], cache=cache)
        try:
            return next(again)()
        finally:
            again.close()
    return lint


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _configured_entries(config_path: Optional[str]) -> bool:
    from fsdp_lint.config import ConfigError, load_settings

    try:
        return bool(load_settings(os.getcwd(), config_path).entries)
    except ConfigError:
        return config_path is not None      # the error is reported when the settings are loaded


def main(argv: Optional[List[str]] = None) -> None:
    own, script_args = split_script_args(argv if argv is not None else sys.argv[1:])
    debug = "--debug" in own
    try:
        import warnings

        # torch CPU wheels do not depend on numpy and warn on import without it: noise for a linter
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
        from fsdp_lint.process.reaper import EXIT_TERMINATED, Terminated, sigterm_as_interrupt
    except KeyboardInterrupt:
        click.echo("fsdp-lint: interrupted", err=True)
        sys.exit(130)

    try:
        with sigterm_as_interrupt():   # SIGTERM cleans up as Ctrl-C does
            code = cli.main(args=own, prog_name="fsdp-lint", standalone_mode=False,
                            obj={"script_args": script_args, "argv": own})
    except Terminated:
        click.echo("fsdp-lint: terminated (SIGTERM); the processes it started were stopped", err=True)
        code = EXIT_TERMINATED
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        click.echo(f"fsdp-lint: error: {exc.format_message()}", err=True)
        code = EXIT_ERROR
    except click.exceptions.Abort:
        click.echo("fsdp-lint: interrupted", err=True)
        code = 130
    except BadInput as exc:
        click.echo(f"fsdp-lint: error: {exc}", err=True)
        code = EXIT_ERROR
    except KeyboardInterrupt:
        click.echo("fsdp-lint: interrupted", err=True)
        code = 130
    except Exception as exc:
        if debug:
            raise
        click.echo(f"fsdp-lint: error: internal error: {type(exc).__name__}: {_first_line(exc)} (rerun with --debug)",
                   err=True)
        code = EXIT_ERROR
    sys.exit(code if isinstance(code, int) else 0)
