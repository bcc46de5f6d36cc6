"""The result cache: a re-run with nothing changed prints the same report without importing torch,
and a change to any part of the key -- the entry file, a project module it reaches, its argv, a
setting, a config file it reads, an installed package's version, an environment variable it reads --
lints afresh. Errors are not cached."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

LAYERS = '''\
"""Blocks, found through the registry below (imported by name, as plugin registries do)."""
from __future__ import annotations

import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.ff(self.norm(x))
'''

MODEL = '''\
"""The model of a small training repository."""
from __future__ import annotations

import importlib

import torch.nn as nn

BLOCKS = {"pre_norm": "mypkg.layers"}
Block = importlib.import_module(BLOCKS["pre_norm"]).Block


class Net(nn.Module):
    def __init__(self, depth: int = 3, dim: int = 32):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x
'''

TRAIN = '''\
"""Train Net with FSDP2 (one fully_shard per block, then the root)."""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from mypkg.model import Net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/small.json")
    args = parser.parse_args()
    with open(args.config) as fh:
        cfg = json.load(fh)
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    depth = int(os.environ.get("NET_DEPTH", cfg["depth"]))
    model = Net(depth=depth)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(10):
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
'''


def _project(root, version="1.0"):
    files = {
        "pyproject.toml": '[project]\nname = "myproj"\n\n[tool.fsdp-lint]\nworld-size = 4\n',
        "mypkg/__init__.py": "",
        "mypkg/model.py": MODEL,
        "mypkg/layers.py": LAYERS,
        "train.py": TRAIN,
        "configs/small.json": json.dumps({"depth": 3}),
        "configs/big.json": json.dumps({"depth": 5}),
    }
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    site = os.path.join(root, "_site")          # an installed distribution the key must see
    os.makedirs(os.path.join(site, f"somefw-{version}.dist-info"), exist_ok=True)
    return site


def _key(root, argv=(), **overrides):
    from fsdp_lint import engine
    from fsdp_lint.cache import run_key
    from fsdp_lint.config import load_settings

    path = os.path.join(root, "train.py")
    settings = load_settings(path).with_overrides(**overrides)
    screened = engine.screen(path, settings)
    assert isinstance(screened, engine.Screened)
    return run_key(screened, settings, list(argv), True, None)


def _edit(path, old, new):
    with open(path) as fh:
        text = fh.read()
    assert old in text
    with open(path, "w") as fh:
        fh.write(text.replace(old, new))


def test_every_part_of_the_key_invalidates_it(tmp_path, monkeypatch):
    root = str(tmp_path)
    site = _project(root)
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(site)
    monkeypatch.delenv("NET_DEPTH", raising=False)
    base = _key(root)
    assert _key(root) == base, "the same run has the same key"

    seen = {base}

    def changed(what, key):
        assert key not in seen, f"{what} did not change the key"
        seen.add(key)

    changed("the script's argv", _key(root, ["--config", "configs/big.json"]))
    changed("a setting (--world-size)", _key(root, world_size=8))
    changed("a setting (--gpu)", _key(root, gpu="a100-80gb"))

    _edit(os.path.join(root, "train.py"), "lr=1e-4", "lr=3e-4")
    changed("the entry file's content", _key(root))
    _edit(os.path.join(root, "mypkg", "model.py"), "depth: int = 3", "depth: int = 4")
    changed("a project module the entry reaches", _key(root))
    _edit(os.path.join(root, "configs", "small.json"), "3", "4")
    changed("a config file named in the code (configs/small.json)", _key(root))
    before = _key(root, ["--config", "configs/big.json"])
    _edit(os.path.join(root, "configs", "big.json"), "5", "6")
    assert _key(root, ["--config", "configs/big.json"]) != before, "a config file named in argv"
    _edit(os.path.join(root, "pyproject.toml"), "world-size = 4", "world-size = 4\ngpus-per-node = 4")
    changed("pyproject.toml's [tool.fsdp-lint]", _key(root))
    os.rename(os.path.join(site, "somefw-1.0.dist-info"), os.path.join(site, "somefw-1.1.dist-info"))
    changed("an installed distribution's version", _key(root))
    monkeypatch.setenv("NET_DEPTH", "2")
    changed("an environment variable the code reads", _key(root))
    monkeypatch.setenv("SOMETHING_UNRELATED_TO_THE_CODE", "1")
    assert _key(root) in seen, "an environment variable nothing reads does not change the key"

    from fsdp_lint.cache import key as key_module

    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    changed("the Python version", _key(root))
    monkeypatch.setattr(key_module, "__version__", "99.0")
    changed("fsdp-lint's version", _key(root))
    monkeypatch.setattr(key_module, "_OWN", "an edited rule")
    changed("fsdp-lint's own source files", _key(root))

    # --model path.py:Class: that file (and what it reaches) is code that runs too
    before = _key(root, model="mypkg/layers.py:Block")
    _edit(os.path.join(root, "mypkg", "layers.py"), "dim: int = 32", "dim: int = 16")
    assert _key(root, model="mypkg/layers.py:Block") != before, "the --model file's content"
    from fsdp_lint.cache.key import Uncacheable

    with pytest.raises(Uncacheable):     # a module name: its file is known only by importing it
        _key(root, model="mypkg.layers:Block")


def test_cache_files_are_tagged_and_unreadable_entries_are_misses(tmp_path):
    from fsdp_lint.cache import Cache

    cache = Cache(str(tmp_path / "c"))
    assert cache.get("ab" * 32) is None
    assert cache.put("ab" * 32, {"x": 1})
    assert cache.get("ab" * 32) == {"x": 1}
    assert open(tmp_path / "c" / ".gitignore").read().strip().endswith("*")
    assert open(tmp_path / "c" / "CACHEDIR.TAG").read().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    for i in range(5):                   # the least recently used beyond the limits go
        cache.put(f"{i:02d}" * 32, list(range(1000)))
        os.utime(cache._path(f"{i:02d}" * 32), (1000 + i, 1000 + i))
    os.utime(cache._path("ab" * 32), (2000, 2000))        # used last
    cache.prune(keep=3)
    left = sorted(f[:2] for _, _, files in os.walk(cache.folder) for f in files)
    assert left == ["03", "04", "ab"]
    entry = cache._path("ab" * 32)
    cache.put("ab" * 32, {"x": 1})
    with open(entry, "wb") as fh:
        fh.write(b"not a pickle")
    assert cache.get("ab" * 32) is None and not os.path.exists(entry)


_WRAPPER = textwrap.dedent('''
    import json, sys
    from fsdp_lint.cli import main
    try:
        main(sys.argv[1:])
        code = 0
    except SystemExit as exc:
        code = exc.code
    from fsdp_lint import isolation
    print(json.dumps({"code": code, "torch": "torch" in sys.modules, "server": isolation._SERVER is not None}),
          file=sys.stderr)
''')


def _lint(root, *argv):
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *argv], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**{k: v for k, v in os.environ.items() if k != "FSDP_LINT_NO_CACHE"},
                                                                 "PYTHONPATH": REPO})
    status = json.loads(proc.stderr.strip().splitlines()[-1])
    return proc.stdout, proc.stderr, status


def _entries(cache_dir):
    return sorted(f for _, _, files in os.walk(cache_dir) for f in files if len(f) == 64)


def test_a_rerun_prints_the_same_report_without_torch_and_a_change_lints_afresh(tmp_path):
    root = str(tmp_path / "repo")
    _project(root)
    cache_dir = str(tmp_path / "cache")
    args = ("train.py", "--cache-dir", cache_dir)

    first, _, status = _lint(root, *args)
    assert status["code"] == 0 and status["server"], first
    assert "4 units" in first, first
    assert len(_entries(cache_dir)) == 1

    again, _, status = _lint(root, *args)
    assert again == first
    assert status == {"code": 0, "torch": False, "server": False}

    # another output format renders the cached result
    as_json, _, status = _lint(root, *args[:1], "--format", "json", "--cache-dir", cache_dir)
    assert not status["server"] and json.loads(as_json)["files"][0]["plan"]["world_size"] == 4

    # a module the code imports by name (no import statement: only the lint's process saw it)
    # changed: linted afresh; a file whose setup fails is not cached
    _edit(os.path.join(root, "mypkg", "layers.py"), "nn.Linear(dim, dim)", "nn.Linear(dim, 2 * dim)")
    _edit(os.path.join(root, "mypkg", "layers.py"), "return x + self.ff(self.norm(x))",
          "return x + self.ff(self.norm(x))[..., :x.shape[-1]]")
    with open(os.path.join(root, "broken.py"), "w") as fh:
        fh.write(TRAIN.replace("model = Net(depth=depth)", "model = Net(depth=depth, width=1)"))
    out, err, status = _lint(root, "train.py", "broken.py", "--cache-dir", cache_dir)
    assert status["code"] == 2 and status["server"]
    assert "4 units" in out and out != first and "broken.py" in err
    assert out.splitlines()[0] != first.splitlines()[0], "train.py's plan is the one of the edited blocks"
    assert len(_entries(cache_dir)) == 1, "the entry of train.py was replaced; broken.py is not cached"


@pytest.mark.parametrize("flag", ["--no-cache", "--run", "--simulate"])
def test_no_cache_run_and_simulate_lint_afresh(tmp_path, monkeypatch, cli, flag):
    """--no-cache, and --run/--simulate (whose point is to run), neither read nor write the cache."""
    from fsdp_lint import isolation

    root = str(tmp_path)
    _project(root)
    monkeypatch.delenv("FSDP_LINT_NO_CACHE", raising=False)
    seen = []

    def lint_runs(runs, cache=None, record=None):
        seen.append(cache)
        return iter(())

    monkeypatch.setattr(isolation, "lint_runs", lint_runs)
    cli("train.py", "--cache-dir", str(tmp_path / "c"), cwd=root)
    cli("train.py", "--cache-dir", str(tmp_path / "c"), flag, cwd=root)
    assert len(seen) == 2 and seen[0] is not None and seen[1] is None


def test_a_fifo_in_the_key_never_blocks(tmp_path):
    """A config path in argv that is a FIFO (or a device) is digested by its type: open() on it would
    wait for a writer for ever (issue 18: nothing hangs)."""
    import threading

    from fsdp_lint.cache.key import file_digest

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    out = []
    worker = threading.Thread(target=lambda: out.append(file_digest(str(fifo))), daemon=True)
    worker.start()
    worker.join(30)
    assert out and out[0].startswith("not-a-file")


_CONSOLE = textwrap.dedent('''
    import json, sys
    from fsdp_lint.console import main
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"code": code, "click": "click" in sys.modules, "torch": "torch" in sys.modules,
                      "pipeline": sorted(m for m in sys.modules if m.startswith(
                          ("fsdp_lint.plan", "fsdp_lint.model", "fsdp_lint.report", "fsdp_lint.isolation")))}),
          file=sys.stderr)
''')

_STORED = textwrap.dedent('''
    import sys
    from fsdp_lint.fastpath import stored_output
    print(stored_output(sys.argv[1:]) is not None)
''')


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("FSDP_LINT_NO_CACHE", "NO_COLOR", "FORCE_COLOR")}
    return {**env, "PYTHONPATH": REPO, **extra}


def _console(root, *argv):
    """`fsdp-lint ARGV` through the console script's entry point."""
    proc = subprocess.run([sys.executable, "-c", _CONSOLE, *argv], cwd=root, capture_output=True, text=True,
                          timeout=600, env=_env())
    lines = proc.stderr.splitlines(keepends=True)
    return proc.stdout, "".join(lines[:-1]), json.loads(lines[-1])


def _stored(root, *argv, **env):
    proc = subprocess.run([sys.executable, "-c", _STORED, *argv], cwd=root, capture_output=True, text=True,
                          timeout=120, env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "True"


def test_a_rerun_of_the_command_prints_its_output_without_click_and_any_change_falls_through(tmp_path):
    """pre-commit's common case: the same command, nothing changed, prints the same stdout, stderr and
    exit code from the stored output, without importing click, torch or the pipeline's modules; a
    change to any input the command computed (a module the lint imported by name, the entry file,
    the pyproject.toml the settings came from, a new file in a walked folder, the output's colour)
    makes the full command line decide again."""
    root = str(tmp_path / "repo")
    _project(root)
    os.makedirs(os.path.join(root, "tools"))
    with open(os.path.join(root, "tools", "paths.py"), "w") as fh:
        fh.write('"""Path helpers."""\nimport os\n\n\ndef data_dir():\n    return os.path.join("/data", "x")\n')
    with open(os.path.join(root, "notes.py"), "w") as fh:     # named on the command line: a note on stderr
        fh.write('"""Release notes helper."""\nVERSION = "1.0"\n')
    argv = ("train.py", "notes.py", "tools", "--cache-dir", str(tmp_path / "cache"))

    first, first_err, status = _console(root, *argv)
    assert status["code"] == 0 and status["click"] and "4 units" in first, first + first_err
    assert "notes.py: not linted" in first_err and "2 skipped" in first
    again, again_err, status = _console(root, *argv)
    assert (again, again_err) == (first, first_err)
    assert status == {"code": 0, "click": False, "torch": False, "pipeline": []}

    assert _stored(root, *argv)
    for rel, old, new in (("mypkg/layers.py", "nn.LayerNorm(dim)", "nn.LayerNorm(dim, eps=1e-6)"),  # imported by name
                          ("train.py", "lr=1e-4", "lr=3e-4"),
                          ("pyproject.toml", "world-size = 4", "world-size = 4\n# a comment")):
        _edit(os.path.join(root, rel), old, new)
        assert not _stored(root, *argv), f"{rel} changed: the stored output must not be printed"
        _edit(os.path.join(root, rel), new, old)
        assert _stored(root, *argv), f"{rel} as it was: the stored output holds again"
    extra = os.path.join(root, "tools", "more.py")
    with open(extra, "w") as fh:
        fh.write("X = 1\n")
    assert not _stored(root, *argv), "a new file in a walked folder"
    os.unlink(extra)
    assert _stored(root, *argv)
    assert not _stored(root, *argv, NO_COLOR="1"), "the output's form is part of the key"
    assert not _stored(root, *argv, FSDP_LINT_NO_CACHE="1")
    assert not _stored(root, *argv[:2], *argv[3:]), "another command line"

    # another format: the full command line (the file's result from the cache), then its stored output
    as_json, _, status = _console(root, *argv, "--format", "json")
    assert status["click"] and not status["torch"] and json.loads(as_json)["files"][0]["plan"]["world_size"] == 4
    again, _, status = _console(root, *argv, "--format", "json")
    assert again == as_json and not status["click"]
