"""How long fsdp-lint takes on real entry points, against what running the program's set-up costs.

    python benchmarks/bench_entry.py                 # 5 rounds, prints a Markdown table
    python benchmarks/bench_entry.py --repeat 9 --modules 120

Cases (each a fresh subprocess, rounds interleaved, the minimum over rounds reported):

* ``titan_like``: ``fsdp-lint titan_like/train.py -- --config configs/debug.yaml`` on the
  torchtitan-shaped package of ``fixtures/repos/`` against its floor: ``python`` importing the
  entry module as ``python -m titan_like.train`` would (torch, PyYAML, tokenizers, the package's
  modules) and building its model on the meta device.
* ``titan_like + N modules``: the same package with N more project modules (utilities, data code,
  ~120 lines each) that the entry imports, as a grown repository has them: following imports must
  cost about what importing costs. The floor imports them too.

fsdp-lint's own work = lint − floor; the budget is under half the floor.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# every round lints afresh (bench_cache.py measures the result cache)
os.environ["FSDP_LINT_NO_CACHE"] = "1"
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_lint import _plain_file, measure  # noqa: E402

TITAN = os.path.join(REPO, "fixtures", "repos", "titan_like")

FLOOR = """
import sys
sys.path.insert(0, {root!r})
import titan_like.train
import torch
from titan_like.models import get_train_spec
spec = get_train_spec("llama")
with torch.device("meta"):
    model = spec.model_cls(spec.flavors["debug"])
assert sum(p.numel() for p in model.parameters()) > 1e6
"""


def grown_copy(directory: str, n: int) -> str:
    """titan_like with `n` more project modules the entry imports (through one `extras` package)."""
    root = os.path.join(directory, "titan_like_grown")
    shutil.copytree(TITAN, root, ignore=shutil.ignore_patterns("__pycache__"))
    extras = os.path.join(root, "titan_like", "extras")
    os.makedirs(extras)
    names = []
    for i in range(n):
        name = f"module_{i:03d}"
        names.append(name)
        with open(os.path.join(extras, name + ".py"), "w") as fh:
            fh.write(_plain_file(i).replace('if __name__ == "__main__":', "if False:"))
    with open(os.path.join(extras, "__init__.py"), "w") as fh:
        fh.write("".join(f"from . import {name}  # noqa: F401\n" for name in names))
    train = os.path.join(root, "titan_like", "train.py")
    with open(train) as fh:
        text = fh.read()
    with open(train, "w") as fh:
        fh.write(text.replace("from .config import JobConfig", "from . import extras  # noqa: F401\n"
                                                                 "from .config import JobConfig"))
    return root


def lines_of(root: str) -> int:
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f)) as fh:
                    total += sum(1 for _ in fh)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (the minimum over rounds is reported)")
    ap.add_argument("--modules", type=int, default=60, help="extra project modules of the grown repository")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        grown = grown_copy(tmp, args.modules)
        projects = {"titan_like": TITAN, f"titan_like + {args.modules} modules": grown}
        cases = {}
        for label, root in projects.items():
            cases[f"floor: {label}"] = ([py, "-c", FLOOR.format(root=root)], None)
            cases[f"fsdp-lint {label}"] = ([py, "-m", "fsdp_lint", os.path.join(root, "titan_like", "train.py"),
                                            "--world-size", "8", "--exit-zero", "--", "--config",
                                            os.path.join(root, "configs", "debug.yaml")], "5 units")
        res = measure(cases, args.repeat)
        sizes = {label: lines_of(os.path.join(root, "titan_like")) for label, root in projects.items()}

    print(f"\n{args.repeat} rounds, minimum per case; python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| project | project lines | time | floor (import + build on meta) | fsdp-lint | own work (lint − floor) "
          "| own work / floor (budget < 0.5) |")
    print("|---|---|---|---|---|---|---|")
    over = []
    for label in projects:
        for key, what in (("wall_min", "wall"), ("cpu_min", "CPU")):
            floor, lint = res[f"floor: {label}"][key], res[f"fsdp-lint {label}"][key]
            own = lint - floor
            if own / floor >= 0.5:
                over.append(f"{label} ({what})")
            print(f"| {label} | {sizes[label]:,} | {what} | {floor:.2f} s | {lint:.2f} s | {own:.2f} s "
                  f"| {own / floor:.2f} |")
    print("\nbudget (fsdp-lint's own work < half the floor):", "MET" if not over else f"OVER ({', '.join(over)})")


if __name__ == "__main__":
    main()
