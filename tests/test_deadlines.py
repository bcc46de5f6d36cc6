"""Deadlines that blame the right thing (issue 18, item 6).

The file's own code -- its setup, replayed up to the training boundary, and its model's forward --
runs within ``replay-timeout``; fsdp-lint's analysis of what it built (tree, plan, layout, rules) has
its own limit (``fsdp_lint.isolation.ANALYSIS_TIMEOUT_S``), and a timeout says which one ran out. The
deadlines are kept by this process (the fork server's parent), so the tests change them here.
"""
from __future__ import annotations

import os
import time

import pytest

from conftest import REPO  # noqa: F401  (the repository root on sys.path for the fixtures' helpers)

BLOCKS = '''\
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(x)


class Stack(nn.Module):
    def __init__(self, n_blocks, dim=8):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
'''

TRAIN = '''\
import torch
from torch.distributed.fsdp import fully_shard

from model import Stack


def main():
    model = Stack({n_blocks})
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


if __name__ == "__main__":
    main()
'''


def _repo(tmp_path, n_blocks=4, toml=""):
    (tmp_path / "model.py").write_text(BLOCKS)
    (tmp_path / "train.py").write_text(TRAIN.format(n_blocks=n_blocks))
    if toml:
        (tmp_path / "pyproject.toml").write_text("[tool.fsdp-lint]\n" + toml)
    return tmp_path


def _one_error(res) -> str:
    lines = [line for line in res.err.splitlines() if line.startswith("fsdp-lint: error:")]
    assert res.code == 2 and len(lines) == 1, (res.code, res.err)
    assert "Traceback" not in res.err
    return lines[0]


def test_analysis_past_its_limit_is_fsdp_lints_and_names_the_model_size(cli, tmp_path, monkeypatch):
    """The file's code finished; fsdp-lint's analysis did not within its limit (0 s here): the
    message says so, with the model's size, and does not blame the file's code."""
    import fsdp_lint.isolation as isolation

    monkeypatch.setattr(isolation, "ANALYSIS_TIMEOUT_S", 0.0)
    _repo(tmp_path, n_blocks=300)
    namespace: dict = {}
    exec(compile(BLOCKS, "model.py", "exec"), namespace)
    modules = len(list(namespace["Stack"](300).modules()))       # torch's count: Stack, ModuleList, 300 x 2
    line = _one_error(cli("train.py", "--world-size", "8", cwd=str(tmp_path)))
    assert f"fsdp-lint's analysis of the model ({modules:,} modules" in line, line
    assert "nested 4 deep" in line and "internal limit of 0 s" in line     # Stack > blocks > Block > proj
    assert "not a fault of the file" in line
    assert "replay-timeout" not in line and "a data set" not in line


def test_without_fork_the_analysis_keeps_its_limit_and_message(cli, tmp_path, monkeypatch):
    """Where os.fork does not exist (Windows) the lint runs in this process: its analysis has the same
    limit (0 s here) and ends with the same one line; with the limit not reached it reports the plan,
    and nothing of the watchdog is left to interrupt what this process does next."""
    import fsdp_lint.isolation as isolation

    monkeypatch.setattr(isolation, "available", lambda: False)
    _repo(tmp_path, n_blocks=300)
    namespace: dict = {}
    exec(compile(BLOCKS, "model.py", "exec"), namespace)
    modules = len(list(namespace["Stack"](300).modules()))
    monkeypatch.setattr(isolation, "ANALYSIS_TIMEOUT_S", 0.0)
    line = _one_error(cli("train.py", "--world-size", "8", cwd=str(tmp_path)))
    assert f"fsdp-lint's analysis of the model ({modules:,} modules" in line, line
    assert "nested 4 deep" in line and "internal limit of 0 s" in line and "not a fault of the file" in line
    assert "replay-timeout" not in line and "a data set" not in line
    monkeypatch.setattr(isolation, "ANALYSIS_TIMEOUT_S", 900.0)
    res = cli("train.py", "--world-size", "8", "--format", "json", "--no-cache", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert '"units"' in res.out
    time.sleep(1.5)          # past the watchdog's re-raise period: no exception arrives in this thread


def test_replay_timeout_does_not_count_the_analysis(cli, tmp_path, monkeypatch):
    """replay-timeout = 4 s; the file's code takes well under it, and the analysis is held here for
    longer than it (this process answers no message for 5 s once the analysis starts): the lint
    finishes with a plan."""
    import fsdp_lint.isolation as isolation

    enter = isolation._Job.enter

    def slow_analysis(job, phase, now):
        if phase == "analysis" and job.phase == "setup":
            time.sleep(5.0)
            now = time.monotonic()
        enter(job, phase, now)

    monkeypatch.setattr(isolation._Job, "enter", slow_analysis)
    _repo(tmp_path, toml="replay-timeout = 4\n")
    res = cli("train.py", "--world-size", "8", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert '"units"' in res.out


def test_setup_code_past_replay_timeout_is_blamed_on_it(cli, tmp_path):
    _repo(tmp_path, toml="replay-timeout = 2\n")
    # the model's size comes from a service that never answers (the plan depends on it: it runs)
    train = (tmp_path / "train.py").read_text().replace("Stack(4)", "Stack(blocks_from_registry())")
    (tmp_path / "train.py").write_text(train.replace("def main():", "def blocks_from_registry():\n"
                                                     "    import time\n    time.sleep(600)\n    return 4\n\n\n"
                                                     "def main():"))
    start = time.monotonic()
    line = _one_error(cli("train.py", "--world-size", "8", cwd=str(tmp_path)))
    assert "train.py: the setup code did not finish within replay-timeout = 2 s" in line, line
    assert "fsdp-lint's analysis" not in line
    # where it was when the deadline ran out: the innermost line of the project's own code
    assert ": it was at train.py:" in line and "(blocks_from_registry)" in line, line
    assert time.monotonic() - start < 300          # the sleep was cut short


def test_a_wait_inside_a_library_names_the_projects_line_and_the_call(cli, tmp_path):
    """A helper module of the project waits on a reply that never comes (a ``threading.Event`` that is
    never set): the timeout names the helper's line and the library call it is blocked in."""
    _repo(tmp_path, toml="replay-timeout = 2\n")
    (tmp_path / "registry.py").write_text("import threading\n\n\ndef blocks_from_registry():\n"
                                          "    reply = threading.Event()\n    reply.wait()\n    return 4\n")
    train = (tmp_path / "train.py").read_text().replace("Stack(4)", "Stack(blocks_from_registry())")
    (tmp_path / "train.py").write_text("from registry import blocks_from_registry\n" + train)
    line = _one_error(cli("train.py", "--world-size", "8", cwd=str(tmp_path)))
    assert ": it was at registry.py:6 (blocks_from_registry), inside threading.py:" in line, line
    assert "(wait)" in line


def test_a_framework_driving_a_stand_in_in_a_loop_names_the_failed_import(tmp_path):
    """The project installed (``pip install .``, not editable) and launched through ``fire.Fire(main)``;
    its ``main`` cannot be imported (a name the installed torch lacks), so fsdp-lint stands in for it, and
    fire walks the stand-in for ever. The replay ends at once naming the import and its failure, not at
    the deadline."""
    import shutil

    (tmp_path / "src" / "trainkit").mkdir(parents=True)
    (tmp_path / "src" / "trainkit" / "__init__.py").write_text("")
    (tmp_path / "src" / "trainkit" / "entry.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard, ShardingPlanner\n\n\n"
        "def main(steps: int = 10, lr: float = 1e-4):\n"
        "    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])\n"
        "    for layer in model:\n        fully_shard(layer)\n    fully_shard(model)\n")
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "trainkit"\nversion = "0.1"\n\n[tool.setuptools]\npackage-dir = {"" = "src"}\n'
        'packages = ["trainkit"]\n\n[tool.fsdp-lint]\nreplay-timeout = 300\n')
    (tmp_path / "train.py").write_text("import fire\nimport torch\n\nfrom trainkit.entry import main\n\n"
                                       "if __name__ == \"__main__\":\n    fire.Fire(main)\n")
    # what `pip install --no-deps --target site .` leaves there: the package and its *.dist-info (written
    # here, so the test needs no build backend in the environment)
    site = tmp_path / "site"
    shutil.copytree(tmp_path / "src" / "trainkit", site / "trainkit")
    (site / "trainkit-0.1.dist-info").mkdir()
    (site / "trainkit-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: trainkit\nVersion: 0.1\n")
    (site / "trainkit-0.1.dist-info" / "top_level.txt").write_text("trainkit\n")
    from conftest import run_subprocess

    start = time.monotonic()      # a fresh fsdp-lint, as `PYTHONPATH=site fsdp-lint train.py -- --steps 5` runs
    res = run_subprocess(["-m", "fsdp_lint", "train.py", "--", "--steps", "5"], cwd=str(tmp_path), timeout=280,
                         env={"PYTHONPATH": str(site)})
    lines = [x for x in res.stderr.splitlines() if x.startswith("fsdp-lint: error:")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, (res.returncode, res.stderr)
    line = lines[0]
    assert line.startswith("fsdp-lint: error: train.py:4: the setup code keeps using `main`"), line
    assert "cannot import name 'ShardingPlanner' from 'torch.distributed.fsdp'" in line
    assert "replay-timeout" not in line and time.monotonic() - start < 240


def test_a_forward_past_replay_timeout_is_blamed_on_the_forward(cli, tmp_path):
    _repo(tmp_path, toml="replay-timeout = 3\n")
    model = (tmp_path / "model.py").read_text()
    (tmp_path / "model.py").write_text(model.replace("        for block in self.blocks:",
                                                     "        import time\n        time.sleep(600)\n"
                                                     "        for block in self.blocks:"))
    line = _one_error(cli("train.py", "--world-size", "8", "--input-shape", "2,8", cwd=str(tmp_path)))
    assert "the model's forward (run once on the meta device" in line, line
    assert "within replay-timeout = 3 s" in line and "fsdp-lint's analysis" not in line


DEEP = '''\
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Wrapper(nn.Module):
    """A residual wrapper around the rest of the network (each level holds its own projection)."""

    def __init__(self, inner):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.inner = inner


model = nn.Linear(4, 4)
for _ in range({depth}):
    model = Wrapper(model)
fully_shard(model)
'''


def test_a_3000_deep_nesting_is_refused_at_once_with_its_depth(cli, tmp_path):
    """No analysis starts: the depth is measured when the replay ends (without recursion)."""
    from fsdp_lint.engine import MAX_MODEL_DEPTH

    (tmp_path / "deep.py").write_text(DEEP.format(depth=3000))
    line = _one_error(cli("deep.py", "--world-size", "8", cwd=str(tmp_path)))
    assert "deep.py: the model nests modules 3,001 deep (6,001 modules)" in line, line
    assert f"at most {MAX_MODEL_DEPTH:,} deep" in line
    assert "RecursionError" not in line and "replay-timeout" not in line


@pytest.mark.parametrize("where", ["pyproject", "command line"])
def test_a_200000_character_model_target_is_refused_naming_the_key(cli, tmp_path, where):
    _repo(tmp_path)
    target = "Stack(" + "1 + " * 50_000 + "1)"
    assert len(target) > 200_000
    if where == "pyproject":
        (tmp_path / "pyproject.toml").write_text(f'[tool.fsdp-lint]\nmodel = "model.py:{target}"\n')
        args = ["train.py"]
    else:
        args = ["train.py", "--model", f"model.py:{target}"]
    start = time.monotonic()
    line = _one_error(cli(*args, cwd=str(tmp_path)))
    assert "model must be at most" in line and "200,0" in line, line[:300]
    assert len(line) < 400                           # the target is not echoed whole
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "0"])
def test_replay_timeout_out_of_range_in_an_entry_table_is_a_config_error(cli, tmp_path, value):
    _repo(tmp_path, toml=f'\n[[tool.fsdp-lint.entry]]\npath = "train.py"\nreplay-timeout = {value}\n')
    line = _one_error(cli(cwd=str(tmp_path)))
    assert "pyproject.toml" in line and "replay-timeout must be" in line, line

