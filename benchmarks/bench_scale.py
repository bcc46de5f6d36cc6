"""How fsdp-lint scales (issue 10 §5): many units, a unit with many parameters, deep nesting.

    python benchmarks/bench_scale.py                 # 3 rounds, prints a Markdown table
    python benchmarks/bench_scale.py --repeat 5 --json scale.json

Three models, each at its full size and at a quarter of it (every case a fresh process; rounds
interleaved; the minimum over rounds; wall-clock and CPU of the whole process tree):

* ``experts``: a mixture-of-experts layer stack with one ``fully_shard`` per expert (per-expert
  wrapping of a large MoE): 8 layers x 1,250 experts = 10,000 expert units, 8 layer units and the root,
  then an AdamW over all its parameters (rules look each of them up);
* ``wide``: 100,000 parameters in one FSDP1 unit (``use_orig_params=True``: 100,000 aligned slots in one
  FlatParameter), a per-feature embedding table;
* ``deep``: 1,000 levels of nesting, one ``fully_shard`` per level (the script raises Python's recursion
  limit, as such a model needs to build at all).

For each: ``fsdp-lint FILE --format concise``, and the floor -- ``import torch`` and building the
same model on the meta device in plain Python, which no linter that builds the model can beat. The
figure of interest is fsdp-lint's own work (lint - floor) and how it grows from the quarter to the
full size: 4x is linear, 16x quadratic.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# every round lints afresh (bench_cache.py measures the result cache)
os.environ["FSDP_LINT_NO_CACHE"] = "1"
sys.path.insert(0, HERE)

from bench_lint import measure, print_cases  # noqa: E402

EXPERTS = '''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Expert(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(self.w1(x).relu())


class MoELayer(nn.Module):
    def __init__(self, experts={experts}, dim=16):
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim) for _ in range(experts))

    def forward(self, x):
        return x


class MoE(nn.Module):
    def __init__(self, layers=8, dim=16):
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        self.layers = nn.ModuleList(MoELayer(dim=dim) for _ in range(layers))

    def forward(self, x):
        return self.embed(x)


def build():
    return MoE()


if __name__ == "__main__":
    model = build()
    for layer in model.layers:
        for expert in layer.experts:
            fully_shard(expert)
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)   # as every training script builds one
'''

WIDE = '''
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


class FeatureTable(nn.Module):
    """One small embedding vector per feature: {params:,} parameters in one module."""

    def __init__(self, features={params}, dim=4):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(dim)) for _ in range(features))

    def forward(self, x):
        return x


def build():
    return FeatureTable()


if __name__ == "__main__":
    model = FSDP(build(), use_orig_params=True)
'''

DEEP = '''
import sys

import torch.nn as nn
from torch.distributed.fsdp import fully_shard

sys.setrecursionlimit(10_000)   # named_modules() recurses once per level


class Level(nn.Module):
    def __init__(self, inner=None, dim=8):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.inner = inner

    def forward(self, x):
        x = self.proj(x)
        return self.inner(x) if self.inner is not None else x


def build(depth={depth}):
    model = None
    for _ in range(depth):
        model = Level(model)
    return model


if __name__ == "__main__":
    model = build()
    for level in reversed([m for m in model.modules() if isinstance(m, Level)]):
        fully_shard(level)
'''

FLOOR = """
import runpy, sys
import torch
sys.setrecursionlimit(10_000)
ns = runpy.run_path({path!r})
with torch.device("meta"):
    ns["build"]()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (the minimum over rounds is reported)")
    ap.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args()

    py = sys.executable
    models = {
        "experts": ("10,000 expert units (8 x 1,250) + 9", EXPERTS, {"experts": 1250}, {"experts": 312}, "10009 units"),
        "wide": ("100,000 parameters in one FSDP1 unit", WIDE, {"params": 100_000}, {"params": 25_000}, "1 unit"),
        "deep": ("1,000-deep nesting, a unit per level", DEEP, {"depth": 1000}, {"depth": 250}, "1000 units"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cases = {}
        for key, (_, src, full, quarter, check) in models.items():
            for size, params in (("full", full), ("quarter", quarter)):
                path = os.path.join(tmp, f"{key}_{size}.py")
                with open(path, "w") as fh:
                    fh.write(src.format(**params))
                cases[f"{key} {size}: fsdp-lint"] = ([py, "-m", "fsdp_lint", path, "--format", "concise", "--exit-zero",
                                                     "--world-size", "8"], None)
                cases[f"{key} {size}: floor"] = ([py, "-c", FLOOR.format(path=path)], None)
        res = measure(cases, args.repeat)

    print(f"\n{args.repeat} rounds, minimum per case; python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| model | floor: import torch + build on meta | `fsdp-lint FILE` | fsdp-lint's own work "
          "(lint - floor) | own work at a quarter of the size | growth (4x = linear) |")
    print("|---|---|---|---|---|---|")
    for key, (label, *_rest) in models.items():
        for metric, unit in (("wall_min", "wall"), ("cpu_min", "CPU")):
            floor = res[f"{key} full: floor"][metric]
            lint = res[f"{key} full: fsdp-lint"][metric]
            qfloor = res[f"{key} quarter: floor"][metric]
            qlint = res[f"{key} quarter: fsdp-lint"][metric]
            own, qown = lint - floor, qlint - qfloor
            print(f"| {label}, {unit} | {floor:.2f} s | {lint:.2f} s | {own:.2f} s | {qown:.2f} s "
                  f"| {own / qown if qown > 0 else float('nan'):.1f}x |")
    print()
    print_cases(res, width=28, digits=2)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"repeat": args.repeat, "cases": res}, fh, indent=2)


if __name__ == "__main__":
    main()
