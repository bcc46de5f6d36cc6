"""The pipeline for one file: source -> replay/tree -> plan -> layout -> rules. Never prints."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from fsdp_lint.config import Settings
from fsdp_lint.check.rule import Finding


class LintError(Exception):
    """The file cannot be linted (bad input); message is one line, exit code 2."""


# where the lint is: the file's code ("setup": the replay; "forward": the model's forward, traced for
# the activations) or fsdp-lint's own "analysis" (tree, plan, layout, rules), with the model's size.
# ``fsdp_lint.isolation`` keeps a deadline per phase from outside: replay-timeout for the file's code,
# its own limit for the analysis, and a timeout names which one ran out.
_phase_listener = None

# a model nested deeper than this is refused as soon as its replay ends: fsdp-lint's analysis, as
# torch's own module walks, names every module by its full path (``inner.inner...``), so its cost grows
# with the square of the depth (a 3,000-deep chain: minutes; 9,000: over ten), and torch's walks
# recurse once per level. Real models nest tens of levels.
MAX_MODEL_DEPTH = 2_000


def _phase(name: str, **info: int) -> None:
    if _phase_listener is not None:
        _phase_listener(name, info)


def model_shape(model) -> "tuple[int, int]":
    """(modules, depth) of a module tree, walked without recursion (each module once)."""
    seen, deepest = set(), 0
    stack = [(model, 1)]
    while stack:
        m, depth = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        deepest = max(deepest, depth)
        children = getattr(m, "_modules", None) or {}
        stack.extend((c, depth + 1) for c in children.values() if c is not None)
    return len(seen), deepest


@dataclass
class FileResult:
    path: str
    skipped: Optional[str] = None
    target: Optional[str] = None
    facts: Any = None
    tree: Any = None
    plan: Any = None
    layout: Any = None
    findings: List[Finding] = field(default_factory=list)
    replay: Any = None
    notes: List[str] = field(default_factory=list)          # what the report says about the replay
    stopped: Any = None                                      # (reason, Position) of the training boundary
    argv: List[str] = field(default_factory=list)            # the script's arguments
    skipped_statements: List[Any] = field(default_factory=list)
    cwd: Optional[str] = None                                # launched from (an entry's config folder)
    simulated: Optional[dict] = None      # --simulate: the measured peak (fsdp_lint.run.simulate)
    granularity: Optional[list] = None    # --compare-granularity: rows (fsdp_lint.report.granularity)
    # project files the lint's process had imported when it finished (importlib calls, registries:
    # beyond what the syntax trees reach); the result cache checks them before serving the result
    imported_files: List[str] = field(default_factory=list)
    budget: Any = None                    # the peak against the device (fsdp_lint.plan.budget.Budget)
    suggestions: Optional[list] = None    # --suggest: plans that fit


@dataclass
class Screened:
    """A file that needs a replay: its source facts and the project modules it reaches."""
    facts: Any
    project: Any = None


def analyse(path: str, settings: Settings, *, keep_model: bool = False, argv: Optional[List[str]] = None,
            explicit: bool = True, cwd: Optional[str] = None) -> FileResult:
    """Build tree, plan and layout for `path` (no rules). Raises LintError on bad input.

    `argv`: the script's own arguments; `explicit`: the file was named on the command line (a
    directory walk skips files that only import a model and do not use FSDP)."""
    screened = screen(path, settings, explicit=explicit)
    if isinstance(screened, FileResult):
        return screened
    return analyse_facts(screened, settings, keep_model=keep_model, argv=argv, explicit=explicit, cwd=cwd)


# the files a command's fast path (``fastpath.plain_output``) screened and skipped before it handed the
# command over to the full command line: (path, explicit) -> its FileResult, taken from here once
# instead of being screened again (None outside such a command; a screen depends on the settings only
# through ``model``, which that path leaves unset)
SCREENED: Optional[Dict[Tuple[str, bool], "FileResult"]] = None


def screen(path: str, settings: Settings, *, explicit: bool = True):
    """The file's source and the project modules it imports, read, never run (no torch): a skipped
    FileResult, or what `analyse_facts` replays. Raises LintError."""
    from fsdp_lint.entry.project import launched_as

    with launched_as(path, settings.launch_module):     # `-m training.run` from the launch's folder
        return _screen(path, settings, explicit=explicit)


def _screen(path: str, settings: Settings, *, explicit: bool = True):
    if SCREENED and not settings.model:
        done = SCREENED.pop((path, explicit), None)
        if done is not None:
            return done
    from fsdp_lint.entry.project import reach, with_console_call
    from fsdp_lint.entry.quick import may_matter, skips
    from fsdp_lint.entry.source import SourceError, parse_source, read_text

    try:
        text = with_console_call(path, read_text(path))
        launched = bool(getattr(settings, "launched", False))     # an entry point: a launch script runs it
        if not settings.model and not launched and not may_matter(text) and skips(path, text):
            # the quick screen (entry.quick): no word a model, wrap or framework needs, and no import
            # of a project module -- the full screen would skip it for this reason too
            return FileResult(path=path, skipped=NOTHING_TO_LINT)
        facts = parse_source(path, text)
    except SourceError as exc:
        raise LintError(str(exc)) from None
    project = None
    if not settings.model:
        try:
            project = reach(path, facts)
        except (OSError, SourceError) as exc:   # pragma: no cover - the entry itself parsed
            raise LintError(str(exc)) from None
        why = skip_reason(project, explicit)
        if why and not (launched and why == NOTHING_TO_LINT):
            # a launched file (a launch script's, an [[entry]], one named with `-- ARGS`) is replayed even
            # where its syntax reaches no model: it may pick its recipe from the config at run time (a CLI
            # dispatching to a `_target_`); a plan or the reason there is none, never a silent skip
            return FileResult(path=path, facts=facts, skipped=why)
    return Screened(facts, project)


def analyse_facts(screened: Screened, settings: Settings, *, keep_model: bool = False,
                  argv: Optional[List[str]] = None, explicit: bool = True, cwd: Optional[str] = None) -> FileResult:
    """Replay the file (its code runs), then tree, plan and layout. Raises LintError."""
    from fsdp_lint.replay import frameworks
    from fsdp_lint.entry.detect import install_hint, missing_packages
    from fsdp_lint.replay.frameworks.options import FrameworkOptions, OptionError
    from fsdp_lint.replay import ModelTarget, NoModelError, ReplayError, replay
    from fsdp_lint.replay.records import WorldSizeFromScript

    facts, project, path = screened.facts, screened.project, screened.facts.path
    imported = set(facts.framework_imports)
    if project is not None:
        for other in project.modules.values():
            imported |= other.framework_imports
    missing = missing_packages(imported)
    if missing:
        raise LintError(f"{os.path.basename(path)}: {install_hint(missing)}")
    try:
        target = ModelTarget.parse(settings.model) if settings.model else None
        options = FrameworkOptions.from_settings(settings)
        try:
            with frameworks.configured(options):
                result = replay(facts, settings.world_size, target=target, timeout=settings.replay_timeout,
                                argv=argv, project=project, cwd=cwd, gpus_per_node=settings.gpus_per_node)
        except WorldSizeFromScript as exc:      # Fabric(devices=4) run as `python train.py`: its own world
            settings = replace(settings, world_size=exc.size, world_size_source=exc.source, script_world=False)
            options = FrameworkOptions.from_settings(settings)
            with frameworks.configured(options):
                result = replay(facts, settings.world_size, target=target, timeout=settings.replay_timeout,
                                argv=argv, project=project, cwd=cwd, gpus_per_node=settings.gpus_per_node)
            result.notes.append(f"world size {exc.size}: {exc} when run as `python {os.path.basename(path)}`; "
                                f"pass --world-size for another launch")
    except NoModelError as exc:
        if not explicit and project is not None and not project.reaches_fsdp:
            # a model file in a directory walk whose constructor needs arguments: not an FSDP entry
            # point; reported as skipped, with what to pass
            return FileResult(path=path, facts=facts, skipped=str(exc).split(": ", 1)[-1])
        err = LintError(str(exc))
        err.user_exception = getattr(exc, "user_exception", None)
        raise err from None
    except ReplayError as exc:
        err = LintError(str(exc))
        err.user_exception = getattr(exc, "user_exception", None)
        err.follow = getattr(exc, "follow", None)       # a launch the setup starts in a subprocess
        raise err from None
    except OptionError as exc:
        raise LintError(str(exc)) from None
    modules, depth = model_shape(result.model)
    _phase("analysis", modules=modules, depth=depth)
    if depth > MAX_MODEL_DEPTH:
        raise LintError(f"{os.path.basename(path)}: the model nests modules {depth:,} deep ({modules:,} modules); "
                        f"fsdp-lint analyses models nested at most {MAX_MODEL_DEPTH:,} deep (its cost grows with "
                        f"the square of the depth; real models nest tens of levels)")
    with frameworks.configured(options):
        tree, plan, layout = plan_replay(result, settings)
    from fsdp_lint.plan.budget import budget_for

    res = FileResult(path=path, target=result.target, facts=facts, tree=tree, plan=plan, layout=layout,
                     replay=result if keep_model else None, budget=budget_for(layout.memory, settings))
    if settings.suggest:
        res.suggestions = _suggest(result, tree, plan, layout, settings)
    res.notes = list(settings.launch_notes) + list(result.notes) + _api_override_note(result, settings)
    res.stopped = result.stopped
    res.argv = list(result.argv)
    res.skipped_statements = list(result.skipped)
    return res


def plan_replay(result, settings: Settings):
    """Tree, plan and layout of a replay's records (the file's, a framework's, or ``fsdp_lint.record()``'s).
    Raises LintError for a plan with elements fsdp-lint does not model (unless --allow-partial)."""
    from fsdp_lint.model.tree import build_module_tree
    from fsdp_lint.plan.build import PlanOptions, build_plan
    from fsdp_lint.plan.frameworks import annotate_plan
    from fsdp_lint.plan.layout import compute_layout

    state = {}
    for call in result.wrap_calls:
        state.update(call.state)
    tree = build_module_tree(result.model, state)
    plan = build_plan(result, tree, PlanOptions(world_size=settings.world_size, api=settings.api,
                                                wrap=list(settings.wrap), use_orig_params=settings.use_orig_params,
                                                gpus_per_node=settings.gpus_per_node,
                                                world_size_source=settings.world_size_source))
    annotate_plan(plan, result, tree, settings)
    _phase("analysis", units=len(plan.units))
    blocking = [u for u in plan.unsupported if getattr(u, "blocks_partial", False)]
    if blocking or (plan.unsupported and not settings.allow_partial):
        raise LintError(unsupported_message(result.target or "", blocking or plan.unsupported))
    from fsdp_lint.model.inputs import find_example_inputs

    example_fn = find_example_inputs(result.namespace, result.model)     # it loses to --input-shape, as in --run
    # activations enter the estimate when the input shape is known (or --simulate measures the same inputs)
    known = bool(settings.input_shape) or example_fn is not None or settings.activations_for_inferred_inputs
    trace = _trace(result, tree, plan, settings, example_fn, known)
    layout = compute_layout(plan, tree, trace=trace, activations=known)
    return tree, plan, layout


def _suggest(result, tree, plan, layout, settings: Settings, every: bool = False):
    """``--suggest``: the candidate plans (``fsdp_lint.suggest``), the forward traced again where one
    needs it (activation checkpointing); `every`: all that the search built, not only those listed."""
    from fsdp_lint.model.inputs import find_example_inputs
    from fsdp_lint.suggest.search import candidates, suggest

    example_fn = find_example_inputs(result.namespace, result.model)
    return (candidates if every else suggest)(result.model, tree, plan, layout, settings,
                                              lambda p: _trace(result, tree, p, settings, example_fn, True))


def _trace(result, tree, plan, settings: Settings, example_fn, activations: bool):
    """One forward of the replay's model with the training inputs (``fsdp_lint.plan.trace``)."""
    from fsdp_lint.config import input_shape_dims
    from fsdp_lint.plan.trace import trace_forward

    _phase("forward")             # the file's code again: the model's forward
    try:
        return trace_forward(result.model, tree, plan, input_shape=input_shape_dims(settings.input_shape),
                             input_dtype=settings.input_dtype, example_fn=example_fn,
                             timeout=settings.replay_timeout, activations=activations)
    finally:
        _phase("analysis")


def unsupported_message(path: str, unsupported) -> str:
    """One line: what fsdp-lint does not model in this plan (the first element, and how many more)."""
    first = unsupported[0]
    where = f"{os.path.basename(first.path)}:{first.line}: " if first.path and first.line else ""
    more = f" (and {len(unsupported) - 1} more)" if len(unsupported) > 1 else ""
    if getattr(first, "blocks_partial", False):     # the rest would be scaled wrongly: no partial plan
        return (f"{where}the plan uses what fsdp-lint does not model: {first.detail}{more}; every unit's numbers "
                f"depend on it, so no plan is reported (not even with --allow-partial)")
    return (f"{where}the plan uses what fsdp-lint does not model: {first.detail}{more}; its numbers would be "
            f"incomplete. Pass --allow-partial to report the rest, with these listed as unsupported")


def _api_override_note(result, settings: Settings) -> List[str]:
    """`--api fsdp1` on a file whose wrap calls are FSDP2 (or the other way round) is an override:
    the report says so."""
    file_apis = sorted({c.api for c in result.wrap_calls if getattr(c, "api", None)})
    if not settings.api or not file_apis or file_apis == [settings.api] or settings.wrap:
        return []
    theirs = " and ".join(a.upper() for a in file_apis)
    return [f"--api {settings.api} overrides the file's {theirs} wrap calls: the plan shows the same units with "
            f"{settings.api.upper()}'s layout and collectives, not what the file builds"]


def skip_reason(project, explicit: bool) -> Optional[str]:
    """Why a file is not linted (None: it is): decided from its syntax tree and the project-local
    modules it imports, never from text patterns."""
    facts = project.modules[project.entry.path]
    if project.reaches_fsdp or facts.defines_model:
        return None
    if project.reaches_model:
        if explicit:
            return None
        models = ", ".join(sorted(os.path.relpath(p) for p in project.model_paths)[:3])
        return f"imports a model ({models}) but neither wraps it nor uses FSDP; the model is linted where it is defined"
    return NOTHING_TO_LINT


NOTHING_TO_LINT = "no nn.Module and no FSDP use (in the file or the project modules it imports)"


def lint_file(path: str, settings: Settings, *, argv: Optional[List[str]] = None,
              explicit: bool = True, cwd: Optional[str] = None) -> FileResult:
    """The whole pipeline for `path` in this process (``fsdp_lint.isolation`` runs the part that
    runs the file's code in a child process)."""
    screened = screen(path, settings, explicit=explicit)
    if isinstance(screened, FileResult):
        screened.cwd = cwd
        return screened
    return lint_facts(screened, settings, argv=argv, explicit=explicit, cwd=cwd)


# how many launches started by launches are followed (a launcher that starts `torchrun train.py`: one)
FOLLOWED_LAUNCHES = 2


def lint_facts(screened: Screened, settings: Settings, *, argv: Optional[List[str]] = None,
               explicit: bool = True, cwd: Optional[str] = None, _followed: int = 0) -> FileResult:
    """Replay, tree, plan, layout and rules for a screened file. Raises LintError."""
    from fsdp_lint.entry.project import launched_as

    try:
        with launched_as(screened.facts.path, settings.launch_module):
            res = analyse_facts(screened, settings, argv=argv, explicit=explicit, cwd=cwd)
    except LintError as exc:
        launch = getattr(exc, "follow", None)
        if launch is None or _followed >= FOLLOWED_LAUNCHES:
            raise
        return _follow_launch(launch, exc, settings, _followed)
    res.cwd = cwd
    res.imported_files = _imported_project_files()
    if res.skipped:
        return res
    res.findings = check_rules(res, settings)
    return res


def _follow_launch(launch: dict, exc: LintError, settings: Settings, followed: int) -> FileResult:
    """The setup started a training launch in a subprocess (`swift sft`, a script that re-runs itself under
    torchrun, `forge run`): on a node the model is built in that launch's processes, so it is what is linted,
    with its arguments, world size, module and environment, as a launch script's line is."""
    overrides = {"launched": True,
                 "launch_env": tuple(sorted({**dict(settings.launch_env), **(launch.get("env") or {})}.items()))}
    world = launch.get("world_size") or (launch["every_gpu_of"] * settings.gpus_per_node
                                         if launch.get("every_gpu_of") else None)
    if world and settings.world_size_source != "--world-size":
        overrides.update(world_size=world, world_size_source="launch script")
    if launch.get("accelerate_config") and not settings.accelerate_config:
        overrides["accelerate_config"] = launch["accelerate_config"]
    if launch.get("accelerate_args"):
        overrides["accelerate_args"] = tuple(launch["accelerate_args"])
    followed_settings = replace(settings.with_overrides(**overrides), launch_module=launch.get("module"), launch_notes=(),
                                launch_plain=bool(launch.get("plain")))
    screened = screen(launch["path"], followed_settings)
    if isinstance(screened, FileResult):
        raise exc
    try:
        res = lint_facts(screened, followed_settings, argv=list(launch.get("args") or ()), explicit=True,
                         cwd=launch.get("cwd"), _followed=followed + 1)
    except LintError as failed:     # said as the launch's, which the user did not name
        err = LintError(f"{failed} (in the launch the setup starts: `{launch.get('shown')}`)")
        err.user_exception = getattr(failed, "user_exception", None)
        raise err from None
    res.notes.insert(0, f"the setup starts `{launch.get('shown')}`: linted that launch, whose processes build the "
                        f"model on a node (a lint never starts processes)")
    res.imported_files = sorted(set(res.imported_files) | {os.path.abspath(launch["path"])})
    return res


def _imported_project_files() -> List[str]:
    import sys

    from fsdp_lint.entry.project import is_local
    from fsdp_lint.replay.sandbox import REPLAY_IMPORTED

    files = set(REPLAY_IMPORTED)    # the replay's own modules, forgotten when it ended
    for name, module in list(sys.modules.items()):
        f = getattr(module, "__file__", None)
        # fsdp-lint's own modules (rules/ of a checkout looks local) are in the cache key already;
        # torch's pseudo-modules have relative names (``_ops.py``)
        if not name.startswith("fsdp_lint") and isinstance(f, str) and os.path.isabs(f) and is_local(f):
            files.add(f)
    return sorted(files)


def check_rules(res: FileResult, settings: Settings) -> List[Finding]:
    """The enabled rules' findings on an analysed file, unsuppressed, by line."""
    from fsdp_lint.check.rule import LintContext
    from fsdp_lint.check.selection import rule_enabled, suppressed

    from fsdp_lint.humanize import use_size_units

    use_size_units(settings)        # the messages speak the units of the user's size settings
    path = res.path
    ctx = LintContext(path=path, facts=res.facts, tree=res.tree, plan=res.plan, layout=res.layout, settings=settings)
    findings: List[Finding] = []
    from fsdp_lint.check.rule import all_rules

    from fsdp_lint.check.selection import suppressions

    late = []       # rules that judge the noqa comments (FSD001): after the others, knowing what they suppressed
    for rule in all_rules():
        if not rule_enabled(rule.code, settings, path):
            continue
        if res.plan.api is not None and res.plan.api not in rule.applies_to:
            continue
        if getattr(rule, "judges_noqa", False):
            late.append(rule)
            continue
        ctx.rules_run.add(rule.code)
        for f in rule.check(ctx):
            if f.call_site is None and os.path.abspath(f.path) != os.path.abspath(path):
                f.call_site = res.plan.call_sites.get((os.path.abspath(f.path), f.line))
            used = suppressions(f, res.facts)
            ctx.noqa_used.update(used)
            ctx.finding_paths.add(os.path.abspath(f.path))
            if not used:
                findings.append(f)
    for rule in late:
        findings.extend(f for f in rule.check(ctx) if not suppressed(f, res.facts))
    findings.sort(key=lambda f: (os.path.abspath(f.path) != os.path.abspath(path), f.line, f.col, f.code))
    return findings
