"""The package's structure: the stages of the pipeline are packages, imports run only from a stage to
the stages below it, no two modules import each other (directly or round a longer cycle), and every
module can be read in one sitting. Read from the syntax trees, so lazy imports inside functions count
as much as those at the top of a module."""
from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the pipeline, lowest stage first (README "How it works"); a module may import its own stage and
# the stages before it, never one after it
STAGES: List[List[str]] = [
    ["fsdp_lint.version", "fsdp_lint.config", "fsdp_lint.humanize", "fsdp_lint.gpus", "fsdp_lint.smi", "fsdp_lint.process"],  # base
    ["fsdp_lint.entry"],      # what to lint: the entry point and its project, read from syntax
    ["fsdp_lint.cache"],      # the result cache: keys from the screened sources and settings (no torch)
    ["fsdp_lint.model"],      # the module tree, its blocks, policies resolved, meshes as data
    ["fsdp_lint.replay"],     # the setup code run on the simulated node; framework drivers
    ["fsdp_lint.plan"],       # units, FlatParameter/DTensor layout, collectives, memory, forward trace
    ["fsdp_lint.fix", "fsdp_lint.check", "fsdp_lint.rules", "fsdp_lint.suggest"],   # the rules, which of them run, their fixes as edits; --suggest
    ["fsdp_lint.report"],     # rendering only
    ["fsdp_lint.run"],        # --run and --simulate: real FSDP sessions
    ["fsdp_lint.engine"],     # one file through the stages
    ["fsdp_lint.isolation"],  # each file's lint in a child process
    ["fsdp_lint.api", "fsdp_lint.config_only", "fsdp_lint.cli_paths", "fsdp_lint.fastpath", "fsdp_lint.cli", "fsdp_lint.__main__",
     "fsdp_lint.console", "fsdp_lint"],   # the command line; a re-run printing its stored output,
]
MAX_LINES = 600


def _modules() -> Dict[str, str]:
    """Every module of the installed package: dotted name -> file (``rules/`` is ``fsdp_lint.rules``)."""
    out = {}
    for folder, package in (("fsdp_lint", "fsdp_lint"), ("rules", "fsdp_lint.rules")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(ROOT, folder))[:-3]
                    parts = [p for p in rel.split(os.sep) if p != "__init__"]
                    out[".".join([package] + parts)] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _imports(name: str, path: str) -> Set[str]:
    """The package's modules that `name` imports, anywhere in its code. ``from pkg import sub`` is an
    import of the module ``pkg.sub`` (and of ``pkg`` only when it imports a name defined there)."""
    is_package = path.endswith("__init__.py")
    out: Set[str] = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    out.add(f"{base}.{a.name}")
                elif base in MODULES:
                    out.add(base)
    out.discard(name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _stage(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(STAGES):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank is not None, f"{module} is in no stage of STAGES: give it one (and a place in the README)"
    return rank


def test_every_module_belongs_to_a_stage():
    for name in MODULES:
        _stage(name)


def test_imports_run_only_down_the_pipeline():
    upward = sorted(f"{a} imports {b}" for a, deps in GRAPH.items() for b in deps if _stage(b) > _stage(a))
    assert not upward, "imports from a stage to a later one:\n" + "\n".join(upward)


def test_no_import_cycles():
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str) -> None:      # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_every_module_reads_in_one_sitting():
    long = sorted(f"{name}: {n} lines" for name, path in MODULES.items()
                  if (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines (split them into a package of steps):\n" + "\n".join(long)


def test_pyproject_installs_every_package():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.endswith("__init__.py")}
    assert listed == packages, f"missing from pyproject: {sorted(packages - listed)}; " \
                               f"listed but absent: {sorted(listed - packages)}"
