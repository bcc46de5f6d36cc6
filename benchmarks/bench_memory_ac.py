"""The static memory estimate against torch's FSDPMemTracker (FSDP2, fake process group, FakeTensorMode,
two steps): model x world size x precision x activation checkpointing.

    python benchmarks/bench_memory_ac.py [--ws 2,4,8,16]

Models: ``fixtures/memory/ac`` (a torchtitan-shaped LM; none / full / every other block / op-level
selective checkpointing) and the article's transformer under ``checkpoint_wrapper``
(``fixtures/memory/article_ac_fsdp2.py``). Prints static / measured per case.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "fixtures", "memory", "ac"), os.path.join(ROOT, "fixtures")]


def static(path, ws, *script):
    out = subprocess.run([sys.executable, "-m", "fsdp_lint", path, "--world-size", str(ws), "--format", "json",
                          *(["--input-shape", "4,256"] if "ac" in path.split(os.sep) else []), "--", *script],
                         capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)["files"][0]["memory"]["per_rank_bytes"]


def main() -> None:
    import torch

    from test_simulate import _per_block, fsdp2_oracle

    import train as ac_train
    from model import ModelArgs, Transformer

    parser = argparse.ArgumentParser()
    parser.add_argument("--ws", default="2,4,8,16")
    args = parser.parse_args()
    rows = []
    for ws in [int(w) for w in args.ws.split(",")]:
        for bf16 in (False, True):
            for mode, every in (("none", 1), ("full", 1), ("selective", 2), ("op", 1)):
                def build():
                    m = Transformer(ModelArgs(n_layers=4))
                    ac_train.apply_ac(m, mode, every)
                    return m
                snap = fsdp2_oracle(build, _per_block(lambda m: m.layers, bf16), ws,
                                    lambda: (torch.randint(0, 8192, (4, 256)),), lambda o: o.float().mean())
                est = static(os.path.join(ROOT, "fixtures", "memory", "ac", "train.py"), ws, "--ac", mode,
                             "--ac-every", str(every), *(["--bf16"] if bf16 else []))
                rows.append(("torchtitan-shaped LM", ws, "bf16" if bf16 else "fp32", mode, est / snap["Total"]))
                print(*rows[-1][:4], f"{rows[-1][4]:.3f}", flush=True)
    print("\n| model | ranks | precision | checkpointing | static / FSDPMemTracker |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.3f} |")


if __name__ == "__main__":
    main()
