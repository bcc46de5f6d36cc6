"""`--simulate`: how long it takes, and how close the static estimate is to what it measures.

    python benchmarks/bench_simulate.py              # timings, 3 rounds, a Markdown table
    python benchmarks/bench_simulate.py --accuracy   # also the static/simulated matrix (24 runs)

Timings (each case a fresh subprocess, rounds interleaved, the minimum over rounds, wall and CPU):

* ``8b``: ``fsdp-lint benchmarks/llama_8b.py --world-size 64 --input-shape 1,2048`` (32 layers, width
  4096, vocabulary 128K, ~8.0B parameters, FSDP2 per block, bf16) without and with ``--simulate``,
  against the floor ``import torch`` + building the model on meta;
* ``article``: ``fsdp-lint fixtures/article_fsdp2.py --world-size 4 --input-shape 8,128,512`` without
  and with ``--simulate``.

Accuracy: the article's model, a Hugging Face Llama, a tied GPT-2 and the half-frozen article, FSDP2
per block, world sizes 2/4/8, bf16 and fp32 mixed precision: the static estimate (activations from
the traced forward, same inputs) divided by the peak ``--simulate`` measures with ``FSDPMemTracker``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# every round lints afresh (bench_cache.py measures the result cache)
os.environ["FSDP_LINT_NO_CACHE"] = "1"
REPO = os.path.dirname(HERE)
MODEL_8B = os.path.join("benchmarks", "llama_8b.py")
FLOOR_8B = f"""
import runpy, sys
import torch
sys.path.insert(0, "benchmarks")
ns = runpy.run_path({MODEL_8B!r})
with torch.device("meta"):
    model = ns["Transformer"](ns["LLAMA_8B"])
assert sum(p.numel() for p in model.parameters()) > 7.5e9
"""
LINT = [sys.executable, "-m", "fsdp_lint"]


def run_once(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def timings(repeat: int) -> dict:
    cases = {
        "floor 8b": [sys.executable, "-c", FLOOR_8B],
        "lint 8b": LINT + [MODEL_8B, "--world-size", "64", "--input-shape", "1,2048"],
        "simulate 8b": LINT + [MODEL_8B, "--world-size", "64", "--input-shape", "1,2048", "--simulate",
                               "--run-timeout", "1800"],
        "lint article": LINT + ["fixtures/article_fsdp2.py", "--world-size", "4", "--input-shape", "8,128,512"],
        "simulate article": LINT + ["fixtures/article_fsdp2.py", "--world-size", "4", "--input-shape", "8,128,512",
                                    "--simulate"],
    }
    best = {k: (float("inf"), float("inf")) for k in cases}
    for _ in range(repeat):
        for name, argv in cases.items():
            wall, cpu, _ = run_once(argv)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


# --------------------------------------------------------------------------------------------
# accuracy: static estimate / simulated peak
# --------------------------------------------------------------------------------------------
_BF16 = "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"


def _variants(tmp: str):
    """(name, path, extra args) of the four models, bf16 and fp32."""
    article = open(os.path.join(REPO, "fixtures", "article_fsdp2.py")).read()
    article = article.replace("mp_policy = MixedPrecisionPolicy(\n    param_dtype=torch.bfloat16,   # forward/backward in bf16\n"
                              "    reduce_dtype=torch.float32,   # gradient reduction in fp32\n)", f"mp_policy = {_BF16}")
    llama = open(os.path.join(REPO, "fixtures", "idioms", "hf_llama_fsdp2.py")).read()
    gpt2 = open(os.path.join(REPO, "fixtures", "memory", "gpt2_tied_fsdp2.py")).read()
    frozen = open(os.path.join(REPO, "fixtures", "memory", "half_frozen_fsdp2.py")).read()
    frozen = frozen.replace("sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), \"..\"))",
                            f"sys.path.insert(0, {os.path.join(REPO, 'fixtures')!r})")
    frozen = frozen.replace("        fully_shard(block)\n    fully_shard(model)",
                            f"        fully_shard(block, mp_policy={_BF16})\n    fully_shard(model, mp_policy={_BF16})")
    frozen = frozen.replace("from torch.distributed.fsdp import fully_shard",
                            "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard")
    models = [("article (12 x 512)", "article.py", article, ["--input-shape", "8,128,512"]),
              ("HF Llama (tiny)", "llama.py", llama, ["--input-shape", "4,128"]),
              ("HF GPT-2, tied head", "gpt2.py", gpt2, ["--input-shape", "8,256"]),
              ("article, first half frozen", "frozen.py", frozen, [])]
    for name, fname, text, extra in models:
        assert _BF16 in text, name
        for dtype in ("bf16", "fp32"):
            body = text if dtype == "bf16" else text.replace(_BF16, "MixedPrecisionPolicy()")
            path = os.path.join(tmp, f"{dtype}_{fname}")
            with open(path, "w") as fh:
                fh.write(body)
            yield name, dtype, path, extra


def accuracy() -> list:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, path, extra in _variants(tmp):
            for ws in (2, 4, 8):
                t0 = time.perf_counter()
                _, _, out = run_once(LINT + [path, "--world-size", str(ws), "--simulate", "--format", "json", *extra])
                seconds = time.perf_counter() - t0
                try:
                    f = json.loads(out)["files"][0]
                except ValueError:
                    with open(os.path.join(REPO, "bench_simulate_bad_output.json"), "w") as fh:
                        fh.write(out)
                    raise SystemExit(f"{path} ws {ws}: the JSON did not parse (kept in bench_simulate_bad_output.json)")
                sim, mem = f["memory"]["simulated"], f["memory"]
                rows.append({"model": name, "dtype": dtype, "ws": ws, "static": mem["per_rank_bytes"],
                             "simulated": sim["peak_bytes"], "ratio": mem["per_rank_bytes"] / sim["peak_bytes"],
                             "activations": sim["breakdown"]["activations"] / sim["peak_bytes"],
                             "seconds": seconds})
                print(f"  {name:28s} {dtype} ws {ws}: static/simulated {rows[-1]['ratio']:.3f}", file=sys.stderr)
    return rows


def _print_timings(best: dict) -> dict:
    floor = best["floor 8b"][0]
    print("| case | wall | CPU | ratio |\n|---|---|---|---|")
    for name, (wall, cpu) in best.items():
        ratio = ""
        if name == "lint 8b":
            ratio = f"{wall / floor:.2f}x the floor"
        elif name.startswith("simulate"):
            base = best["lint " + name.split()[1]][0]
            ratio = f"{wall / base:.2f}x the static lint"
            if name == "simulate 8b":
                ratio += f", {wall / floor:.2f}x the floor"
        print(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {ratio} |")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--accuracy", action="store_true", help="also the static/simulated matrix")
    ap.add_argument("--no-timings", action="store_true", help="only the accuracy matrix")
    ap.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args()
    out = {}
    if not args.no_timings:
        out["timings"] = _print_timings(timings(args.repeat))
    if args.accuracy:
        rows = accuracy()
        out["accuracy"] = rows
        print("\n| model | static / simulated peak (min-max over ws 2/4/8, bf16 and fp32) | activations in the peak |")
        print("|---|---|---|")
        for name in dict.fromkeys(r["model"] for r in rows):
            rs = [r for r in rows if r["model"] == name]
            print(f"| {name} | {min(r['ratio'] for r in rs):.3f} - {max(r['ratio'] for r in rs):.3f} | "
                  f"{min(r['activations'] for r in rs):.0%} - {max(r['activations'] for r in rs):.0%} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
