"""What running each file's lint in a child process costs (issue 10), as ratios in one run.

    python benchmarks/bench_isolation.py                 # 3 rounds, prints a Markdown table
    python benchmarks/bench_isolation.py --repeat 5 --json iso.json

Two directories of 300 files, each linted two ways (every case a fresh process; rounds interleaved;
the minimum over rounds; wall-clock and CPU = user + sys of the whole process tree):

* ``fsdp-lint DIR``: the command as users run it -- every file that needs a replay is linted in a
  child forked from the fork server (``fsdp_lint.isolation``), one per CPU at a time;
* ``FSDP_LINT_JOBS=1 fsdp-lint DIR``: the same, one child at a time;
* the floor, "in one process": the same pipeline (``engine.lint_file`` for every file, then the
  report) in a single process with no isolation -- how fsdp-lint linted before issue 10, and what
  a linted file could then break for all the others.

Directories:

* ``repo``: a training repository's shape -- 240 non-model modules (utilities, data code, losses,
  from ``bench_lint.py``) and 60 model/training files (FSDP2 per block, FSDP1 with an auto-wrap
  policy, models of different widths and depths);
* ``models``: 300 model/training files, the worst case (every file is replayed);
* ``article``: one file (``fixtures/article_fsdp2.py``), as a pre-commit hook on one changed file runs it.
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

from bench_lint import _plain_file, measure, print_cases  # noqa: E402

IN_ONE_PROCESS = """
import sys
from fsdp_lint import engine
from fsdp_lint.report import text as report
from fsdp_lint.cli import collect_files
from fsdp_lint.config import load_settings

files = collect_files([sys.argv[1]])
settings = load_settings(files[0][0]).with_overrides(world_size=int(sys.argv[2]) if len(sys.argv) > 2 else None)
results = [engine.lint_file(path, settings, explicit=explicit) for path, explicit in files]
text = report.render_text(results, full=True)
sys.stdout.write(text)
"""


def model_file(i: int) -> str:
    """A small training file: a transformer-ish model of its own size, wrapped one of three ways."""
    dim, layers = 32 + (i % 7) * 16, 2 + i % 5
    wrap = [
        "model = Net()\nfor block in model.blocks:\n    fully_shard(block)\nfully_shard(model)\n",
        "model = FSDP(Net(), auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
        "transformer_layer_cls={Block}), use_orig_params=True)\n",
        "model = Net()\nmodel.embed.requires_grad_(False)\nfor block in model.blocks:\n    fully_shard(block)\n"
        "fully_shard(model)\noptimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n",
    ][i % 3]
    return f'''"""Training file {i}."""
import functools

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, dim={dim}):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h)[0]
        return x + self.fc2(self.fc1(self.norm(x)).relu())


class Net(nn.Module):
    def __init__(self, vocab=1000, dim={dim}, layers={layers}):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


{wrap}'''


def make_tree(directory: str, models: int, plain: int) -> None:
    for i in range(plain):
        sub = os.path.join(directory, "pkg" if i % 2 else "scripts")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"module_{i:03d}.py"), "w") as fh:
            fh.write(_plain_file(i))
    os.makedirs(os.path.join(directory, "train"), exist_ok=True)
    for i in range(models):
        with open(os.path.join(directory, "train", f"train_{i:03d}.py"), "w") as fh:
            fh.write(model_file(i))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (the minimum over rounds is reported)")
    ap.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args()

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        repo, models = os.path.join(tmp, "repo"), os.path.join(tmp, "models")
        make_tree(repo, models=60, plain=240)
        make_tree(models, models=300, plain=0)
        cases = {}
        for label, directory, linted in (("repo", repo, "60 files"), ("models", models, "300 files")):
            cases[f"{label}: fsdp-lint"] = ([py, "-m", "fsdp_lint", directory, "--exit-zero"], linted)
            cases[f"{label}: FSDP_LINT_JOBS=1"] = (["env", "FSDP_LINT_JOBS=1", py, "-m", "fsdp_lint", directory,
                                                    "--exit-zero"], linted)
            cases[f"{label}: in one process"] = ([py, "-c", IN_ONE_PROCESS, directory], linted)
        article = os.path.join("fixtures", "article_fsdp2.py")   # one file, as pre-commit runs it
        cases["article: fsdp-lint"] = ([py, "-m", "fsdp_lint", article, "--world-size", "4"], "13 units")
        cases["article: FSDP_LINT_JOBS=1"] = (["env", "FSDP_LINT_JOBS=1", py, "-m", "fsdp_lint", article,
                                                "--world-size", "4"], "13 units")
        cases["article: in one process"] = ([py, "-c", IN_ONE_PROCESS, article, "4"], "13 units")
        res = measure(cases, args.repeat)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"repeat": args.repeat, "cases": res}, fh, indent=2)

    print(f"\n{args.repeat} rounds, minimum per case; python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| linted | in one process (before issue 10) | `fsdp-lint PATH` | ratio | `FSDP_LINT_JOBS=1` | ratio |")
    print("|---|---|---|---|---|---|")
    for label, what in (("article", "fixtures/article_fsdp2.py (one file)"), ("repo", "240 plain + 60 model files"),
                        ("models", "300 model files")):
        for key, unit in (("wall_min", "wall"), ("cpu_min", "CPU")):
            base = res[f"{label}: in one process"][key]
            iso = res[f"{label}: fsdp-lint"][key]
            one = res[f"{label}: FSDP_LINT_JOBS=1"][key]
            print(f"| {what}, {unit} | {base:.2f} s | {iso:.2f} s | {iso / base:.2f}× | {one:.2f} s "
                  f"| {one / base:.2f}× |")
    print()
    print_cases(res, width=32, digits=2)


if __name__ == "__main__":
    main()
