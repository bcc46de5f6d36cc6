"""How long fsdp-lint takes, as ratios against floors that no linter of this kind can beat.

    python benchmarks/bench_lint.py                 # 5 rounds, prints a Markdown table
    python benchmarks/bench_lint.py --repeat 9 --json bench.json
    python benchmarks/bench_lint.py --profile       # cProfile of one in-process 70B lint

Cases (each a fresh subprocess; rounds are interleaved so background load hits all cases alike;
the figure is the minimum over rounds, wall-clock and CPU (user+sys) time of the child):

* ``70b``: ``fsdp-lint benchmarks/llama_70b.py --world-size 64`` (80 layers, width 8192, ~69B
  parameters, one ``fully_shard`` per block) against the floor ``python -c "import torch; <build it on
  meta>"`` (the floor imports the model file and builds ``Transformer()`` under ``torch.device("meta")``).
  fsdp-lint's own work = lint - floor; budget: under half the floor.
* ``300 files``: ``fsdp-lint DIR`` on 300 generated non-model files (utilities, CLIs, data code; some
  import torch or torch.nn.functional, none defines an nn.Module or uses FSDP) against ``python -c pass``
  and ``python -c "import torch"``: these files must be skipped without importing torch.
* ``article``: ``fsdp-lint fixtures/article_fsdp2.py --world-size 4`` against the same two floors.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# every round lints afresh (bench_cache.py measures the result cache)
os.environ["FSDP_LINT_NO_CACHE"] = "1"
REPO = os.path.dirname(HERE)
MODEL_70B = os.path.join("benchmarks", "llama_70b.py")

FLOOR_70B = f"""
import runpy
import torch
ns = runpy.run_path({MODEL_70B!r})
with torch.device("meta"):
    model = ns["Transformer"]()
assert sum(p.numel() for p in model.parameters()) > 60e9
"""


# what linting the article's file cannot do without: import torch and FSDP (the file's own first
# lines) and build its model on the meta device
FLOOR_ARTICLE = """
import runpy
import torch
from torch.distributed.fsdp import fully_shard
ns = runpy.run_path("fixtures/article_model.py")
with torch.device("meta"):
    model = ns["Transformer"]()
assert sum(p.numel() for p in model.parameters()) > 37e6
"""


def _plain_file(i: int) -> str:
    """A non-model module of a training repository; three flavours, none defines an nn.Module."""
    kind = i % 10
    if kind < 7:  # plain utilities
        return f'''"""Utility module {i}: paths, logging and small helpers."""
import argparse
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

log = logging.getLogger(__name__)


@dataclass
class Options{i}:
    root: str = "/data"
    shards: int = {i + 1}
    tags: List[str] = field(default_factory=list)
    extra: Dict[str, str] = field(default_factory=dict)


def parse_args(argv: Optional[List[str]] = None) -> Options{i}:
    parser = argparse.ArgumentParser(description="tool {i}")
    parser.add_argument("--root", default="/data")
    parser.add_argument("--shards", type=int, default={i + 1})
    args = parser.parse_args(argv)
    return Options{i}(root=args.root, shards=args.shards)


def shard_paths(opts: Options{i}) -> List[str]:
    return [os.path.join(opts.root, f"shard-{{k:05d}}.jsonl") for k in range(opts.shards)]


def load_manifest(path: str) -> Dict[str, int]:
    with open(path) as fh:
        data = json.load(fh)
    counts = {{}}
    for entry in data.get("files", []):
        counts[entry["name"]] = int(entry.get("rows", 0))
    log.info("manifest %s: %d files", path, len(counts))
    return counts


def human(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if abs(n) < 1000:
            return f"{{n:.1f}}{{unit}}"
        n /= 1000
    return f"{{n:.1f}}T"


if __name__ == "__main__":
    print(shard_paths(parse_args()))
'''
    if kind < 9:  # data code that imports torch (tensors only)
        return f'''"""Data pipeline {i}: tokenised shards to batches."""
import math
import random

import torch
from torch.utils.data import DataLoader, Dataset


class TokenShard{i}(Dataset):
    def __init__(self, tokens: torch.Tensor, seq_len: int = 2048):
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self):
        return max(0, (self.tokens.numel() - 1) // self.seq_len)

    def __getitem__(self, idx):
        start = idx * self.seq_len
        chunk = self.tokens[start:start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def make_loader(tokens: torch.Tensor, batch_size: int = 8, seed: int = {i}) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TokenShard{i}(tokens), batch_size=batch_size, shuffle=True, generator=g)


def cosine_lr(step: int, warmup: int = 2000, total: int = 100000, peak: float = 3e-4) -> float:
    if step < warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * progress))


def jitter(seed: int = {i}) -> float:
    return random.Random(seed).random()
'''
    return f'''"""Losses {i}: functional only."""
import torch
import torch.nn.functional as F


def z_loss(logits: torch.Tensor, weight: float = 1e-4) -> torch.Tensor:
    return weight * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    flat = logits.flatten(0, 1).float()
    return F.cross_entropy(flat, targets.flatten(), ignore_index=ignore_index) + z_loss(logits)


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return (logits.argmax(-1) == targets).float().mean().item()
'''


N_PLAIN = 300     # a repository's worth of plain files: skipped without importing torch
PLAIN = f"fsdp-lint {N_PLAIN} non-model files"


def make_plain_tree(directory: str, n: int = N_PLAIN) -> None:
    for i in range(n):
        sub = os.path.join(directory, "pkg" if i % 2 else "scripts")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"module_{i:02d}.py"), "w") as fh:
            fh.write(_plain_file(i))


def compile_bytecode() -> None:
    """Write the bytecode of fsdp-lint's modules, as ``pip install`` does: with PYTHONDONTWRITEBYTECODE
    set (this project's shared machine sets it) a checkout would otherwise compile every module it
    imports from source on every run, a cost no installed fsdp-lint has."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "fsdp_lint", "rules"], cwd=REPO, check=True,
                   capture_output=True)


def run_once(argv, cwd=REPO, check=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr}")
    if check and check not in proc.stdout:
        raise SystemExit(f"benchmark command did not do what it should ({check!r} not in output): {' '.join(argv)}\n"
                         f"{proc.stdout[-2000:]}")
    return wall, cpu


def measure(cases, repeat):
    walls = {name: [] for name in cases}
    cpus = {name: [] for name in cases}
    for r in range(repeat):
        for name, (argv, check) in cases.items():
            wall, cpu = run_once(argv, check=check)
            walls[name].append(wall)
            cpus[name].append(cpu)
        print(f"  round {r + 1}/{repeat} done", file=sys.stderr)
    return {name: {"wall_min": min(walls[name]), "wall_median": statistics.median(walls[name]),
                   "cpu_min": min(cpus[name]), "cpu_median": statistics.median(cpus[name]),
                   "wall": walls[name], "cpu": cpus[name]} for name in cases}


def print_cases(res, width: int = 45, digits: int = 3) -> None:
    """Every case's minimum and median, wall and CPU (under the Markdown table)."""
    for name, r in res.items():
        print(f"  {name:{width}s} wall min {r['wall_min']:.{digits}f} s  median {r['wall_median']:.{digits}f} s   "
              f"CPU min {r['cpu_min']:.{digits}f} s  median {r['cpu_median']:.{digits}f} s")


def profile_70b(world_size: int, top: int = 25) -> None:
    """cProfile of one in-process lint of the 70B model file (torch imported beforehand, so the profile
    shows fsdp-lint's own work: parsing, replay, tree, plan, layout, rules, report)."""
    import cProfile
    import io
    import pstats

    import torch  # noqa: F401  (the floor: not fsdp-lint's work)

    sys.path.insert(0, REPO)
    from fsdp_lint.cli import main

    os.chdir(REPO)
    prof = cProfile.Profile()
    out = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = out
    t0 = time.perf_counter()
    prof.enable()
    try:
        main([MODEL_70B, "--world-size", str(world_size)])
    except SystemExit:
        pass
    prof.disable()
    sys.stdout = real_stdout
    print(f"in-process lint (torch already imported): {time.perf_counter() - t0:.2f} s")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (the minimum over rounds is reported)")
    ap.add_argument("--world-size", type=int, default=64, help="world size for the 70B lint")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("--profile", action="store_true", help="cProfile one in-process 70B lint and exit")
    args = ap.parse_args()
    if args.profile:
        profile_70b(args.world_size)
        return

    py = sys.executable
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        make_plain_tree(tmp, N_PLAIN)
        cases = {
            "python -c pass": ([py, "-c", "pass"], None),
            "python -c 'import torch'": ([py, "-c", "import torch"], None),
            "floor: import torch + build 70B on meta": ([py, "-c", FLOOR_70B], None),
            "fsdp-lint llama_70b.py": ([py, "-m", "fsdp_lint", MODEL_70B, "--world-size", str(args.world_size)],
                                       "81 units"),
            PLAIN: ([py, "-m", "fsdp_lint", tmp], f"{N_PLAIN} skipped"),
            "fsdp-lint article_fsdp2.py": ([py, "-m", "fsdp_lint", "fixtures/article_fsdp2.py", "--world-size", "4"],
                                           "13 units"),
            "floor: import torch + FSDP + build the article's model on meta": ([py, "-c", FLOOR_ARTICLE], None),
        }
        res = measure(cases, args.repeat)

    def fig(name, key):
        return res[name][key]

    rows = []
    for key, label in (("wall_min", "wall"), ("cpu_min", "CPU")):
        p, t = fig("python -c pass", key), fig("python -c 'import torch'", key)
        floor, lint = fig("floor: import torch + build 70B on meta", key), fig("fsdp-lint llama_70b.py", key)
        own = lint - floor
        plain, art = fig(PLAIN, key), fig("fsdp-lint article_fsdp2.py", key)
        art_floor = fig("floor: import torch + FSDP + build the article's model on meta", key)
        rows.append((label, p, t, floor, lint, own, own / floor, plain, plain / p, plain / t, art, art / p, art / t,
                     art_floor, art / art_floor))

    print(f"\n{args.repeat} rounds, minimum per case; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, world size {args.world_size} for the 70B model\n")
    print("| time | `python -c pass` | `python -c 'import torch'` | 70B floor (import torch + build on meta) "
          "| fsdp-lint 70B | fsdp-lint's own work (lint − floor) | own work / floor (budget < 0.5) "
          f"| fsdp-lint {N_PLAIN} non-model files | ÷ `pass` | ÷ `import torch` | fsdp-lint article_fsdp2.py | ÷ `pass` "
          "| ÷ `import torch` | article floor (import torch + FSDP + build on meta) | ÷ article floor |")
    print("|" + "---|" * 15)
    for (label, p, t, floor, lint, own, ratio, plain, pr, tr, art, ar, atr, af, afr) in rows:
        print(f"| {label} | {p:.3f} s | {t:.2f} s | {floor:.2f} s | {lint:.2f} s | {own:.2f} s | {ratio:.2f} "
              f"| {plain:.2f} s | {pr:.1f}× | {tr:.2f}× | {art:.2f} s | {ar:.1f}× | {atr:.2f}× | {af:.2f} s | {afr:.2f}× |")
    print()
    print_cases(res)
    over = [label for (label, *_rest) in rows if _rest[5] >= 0.5]
    print("\nbudget (fsdp-lint's own work < half the floor):", "MET" if not over else f"OVER ({', '.join(over)})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"repeat": args.repeat, "world_size": args.world_size, "cases": res}, fh, indent=2)


if __name__ == "__main__":
    main()
