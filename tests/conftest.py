"""Shared test helpers: run the CLI in-process, the repository root, and ``--update-goldens``."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# every test lints afresh (tests/test_cache.py turns the result cache on where it tests it); set here
# so that the fsdp-lint processes tests start inherit it
os.environ["FSDP_LINT_NO_CACHE"] = "1"


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens", action="store_true", default=False,
        help="rewrite tests/golden/* from the current output instead of comparing against them",
    )


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch):
    """Tests name fixtures relative to the repository root (as the README's command runs them); the
    same holds when pytest is started from elsewhere (`pytest /path/to/fsdp-lint/tests`)."""
    monkeypatch.chdir(REPO)


@pytest.fixture
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """``cli("path.py", "--world-size", "4", cwd=...)`` runs ``fsdp_lint.cli.main`` in this process
    (torch is imported once for the whole session) and returns exit code, stdout and stderr."""
    from fsdp_lint.cli import main

    def run(*argv: str, cwd: str = REPO) -> CliResult:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def write_tree(root, files) -> None:
    """A small repository under `root`: {relative path: text (dedented)}."""
    import textwrap

    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def run_subprocess(args, cwd=REPO, timeout=120, env=None):
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


# --------------------------------------------------------------------------------------------
# `-m "not slow"`: the quick subset (README "Development"). The slow tests are named here, by module
# (real --run sessions, --simulate, frameworks, whole-repository walks, processes) so that no test file
# has to carry a marker; the full suite (`python -m pytest`, .ci/run) runs them all.
# --------------------------------------------------------------------------------------------
SLOW_MODULES = {
    "test_run",             # real FSDP sessions in several processes (--run)
    "test_simulate",        # FSDPMemTracker sessions (--simulate)
    "test_frameworks",      # Lightning, accelerate, the HF Trainer, PEFT, TRL through their own code
    "test_reach",           # entry points through CLI frameworks and whole repositories
    "test_reach_namespace",
    "test_isolation",       # hostile files, signals, fork servers, process trees
    "test_scale",           # 1,000s of units and deep nestings
    "test_entry_points",    # every way a training repository is launched
    "test_idioms",
    "test_suggest_applied",  # --suggest candidates applied under FSDPMemTracker / MemTracker, one --simulate
    "test_suggest",          # the --suggest search on real plans, one --simulate of candidates
    "test_suggest_tied",     # tied embedding/head candidates applied under FSDPMemTracker / MemTracker
    "test_suggest_grouped_experts",  # grouped experts: a candidate applied under FSDPMemTracker, collectives
    "test_suggest_frontends_ac",  # --suggest checkpointing texts taken by Lightning, accelerate, the HF Trainer
    "test_frontend_texts",   # fix texts launched through the real HF Trainer, accelerate and Fabric
    "test_shell_launch",     # launch scripts linted through the real HF Trainer
    "test_memory_ac_frameworks",  # Lightning / accelerate checkpointing against the memory trackers
    "test_deadlines",        # fork servers held past their deadlines
    "test_host_values",      # collective values against two real gloo processes
    "test_rank_values",      # per-rank values against two real gloo processes
    "test_asked_keys",       # a replay in rounds, against real FSDP1
    "test_memory_ac",        # checkpointed models against FSDPMemTracker, two steps each
    "test_cache",            # whole fsdp-lint commands run twice, in processes
    "test_plain_fastpath",   # the command line in processes, against the full one
}


SLOW_TESTS = {
    "test_every_module_of_torch_and_transformers_transforms_and_compiles",   # all of torch and transformers
    # each about 5 s or more on an idle 2-core machine: fsdp-lint or a framework in processes of its own
    "test_readme_examples_are_what_fsdp_lint_prints",                        # every README example block
    "test_fsd103_fix_in_the_accelerate_yaml_keeps_its_layout_and_accelerate_then_wraps",
    "test_fsd201_under_accelerate_edits_the_yaml_not_the_script",
    "test_debug_shows_the_traceback_of_an_internal_error",
    "test_plain_files_are_skipped_without_importing_torch",
    "test_console_entry_points",
    "test_stderr_stays_clean_without_numpy",
    "test_a_skipped_validator_is_named_before_its_consequence",
    "test_the_hf_trainer_on_the_node_builds_what_the_fsdp_lint_plan_says",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if name in SLOW_MODULES or getattr(item, "originalname", item.name) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
