"""``--suggest``'s reported peaks against each suggested plan applied for real.

    python benchmarks/bench_suggest.py [--simulate]

For each case the device is sized so that the usable memory is 1.25x the file's own static peak (as
tests/test_suggest_applied.py does; the README's example on its own 2.6 GiB); every listed candidate (CPU offload aside: on the simulated CPU
node offloaded and device memory are one) is applied with torch's own API (``fsdp_lint.run.candidate``)
on the fixture's model and run for two AdamW steps under the fake process group and ``FakeTensorMode``
with torch's tracker (``FSDPMemTracker`` for FSDP2, ``MemTracker`` for FSDP1): rank 0's peak is the
measured figure. Prints reported (static) / measured per candidate and, with ``--simulate``, the
``simulated_peak_bytes`` of the top candidate that ``--suggest --simulate`` fills, / measured.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests")]
MEM = os.path.join(ROOT, "fixtures", "memory")


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.dirname(path))
        for n in ("model", "train"):
            sys.modules.pop(n, None)
    return mod


def _fsdp1_measured(cand, build, ws, inputs):
    import torch
    import torch.distributed.device_mesh as dm
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    import oracle
    from fsdp_lint.run.candidate import apply_candidate
    from test_simulate import _tracked_steps

    with oracle.fake_pg(ws):
        # an HSDP mesh is made outside FakeTensorMode (a mesh holds real ranks) and handed to apply_candidate
        mesh = dm.init_device_mesh("cpu", tuple(cand["plan"]["mesh"])) if cand["plan"].get("mesh") else None
        real, dm.init_device_mesh = dm.init_device_mesh, (lambda *a, **k: mesh)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                model = apply_candidate(cand["plan"], build(), ws, torch.device("cpu"))
                optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
                tracker = MemTracker()
                tracker.track_external(model, optimizer)
                dev = _tracked_steps(model, optimizer, inputs, lambda out: out.float().mean(), tracker)
        finally:
            dm.init_device_mesh = real
    return int(next(v for k, v in dev.items() if str(getattr(k, "value", k)) == "Total"))


def _cases():
    import torch

    moe = _module(os.path.join(MEM, "moe", "model.py"), "bench_moe_model")
    grouped = _module(os.path.join(MEM, "moe_grouped", "model.py"), "bench_grouped_model")
    tied = _module(os.path.join(MEM, "tied_head_fsdp2.py"), "bench_tied_head")
    mlp = _module(os.path.join(MEM, "mlp_stack_fsdp2.py"), "bench_mlp")
    moe_argv = ["--n-layers", "3", "--n-experts", "2"]
    tokens = lambda vocab, b, t: (lambda: (torch.randint(0, vocab, (b, t)),))  # noqa: E731
    return [
        ("MLP stack (FSDP2), 4 ranks", os.path.join(MEM, "mlp_stack_fsdp2.py"), [], dict(world_size=4),
         mlp.MLPStack, lambda: (torch.randn(8, 512, 1024),), "fsdp2"),
        ("MoE decoder, ModuleList experts (FSDP2), 8 ranks, 4 per node", os.path.join(MEM, "moe", "train.py"), moe_argv,
         dict(world_size=8, gpus_per_node=4, input_shape="4,256"),
         lambda: moe.MoETransformer(n_layers=3, n_experts=2), tokens(4096, 4, 256), "fsdp2"),
        ("MoE decoder (FSDP1 policy), 8 ranks, 4 per node", os.path.join(MEM, "moe", "train_fsdp1.py"), moe_argv,
         dict(world_size=8, gpus_per_node=4, input_shape="4,256"),
         lambda: moe.MoETransformer(n_layers=3, n_experts=2), tokens(4096, 4, 256), "fsdp1"),
        ("MoE decoder, grouped experts (FSDP2), 4 ranks", os.path.join(MEM, "moe_grouped", "train.py"),
         ["--n-layers", "3", "--num-experts", "8"], dict(world_size=4, input_shape="4,256"),
         lambda: grouped.Transformer(grouped.ModelArgs(n_layers=3, num_experts=8)), tokens(4096, 4, 256), "fsdp2"),
        ("decoder with a tied head (FSDP2), 4 ranks", os.path.join(MEM, "tied_head_fsdp2.py"), [],
         dict(world_size=4, input_shape="4,128"), tied.TiedLM, tokens(8192, 4, 128), "fsdp2"),
        # the README's example: 2.6 GiB, where only checkpointing, bf16 and ZeRO-2 together fit best
        ("MLP stack (FSDP2), 4 ranks, --gpu-memory 2.6GiB", os.path.join(MEM, "mlp_stack_fsdp2.py"), [],
         dict(world_size=4, gpu_memory="2.6GiB"), mlp.MLPStack, lambda: (torch.randn(8, 512, 1024),), "fsdp2"),
    ]


def _candidates(name, path, argv, options):
    """(result, settings, every candidate): sized as tests/test_suggest_applied.py does, or on the
    case's own ``gpu_memory``."""
    from test_suggest_applied import _analyse, _every_candidate

    if "gpu_memory" not in options:
        return _every_candidate(name, path, argv, **options)
    from fsdp_lint.config import Settings
    from fsdp_lint.engine import _suggest

    settings = Settings(activations_for_inferred_inputs=True, **options)
    res = _analyse(path, settings, argv)
    return res, settings, _suggest(res.replay, res.tree, res.plan, res.layout, settings, every=True)


def main() -> None:
    import torch

    from fsdp_lint.suggest.search import _listed
    from test_suggest_tied import _fsdp2_steps

    parser = argparse.ArgumentParser()
    parser.add_argument("--simulate", action="store_true", help="also --simulate the top candidate of each case")
    parser.add_argument("--from-case", type=int, default=0, help="start at this case (0-based)")
    parser.add_argument("--to-case", type=int, default=None, help="stop before this case")
    args = parser.parse_args()
    rows = []
    for name, path, argv, options, build, inputs, api in _cases()[args.from_case:args.to_case]:
        res, settings, cands = _candidates(name, path, argv, options)
        listed = [c for c in _listed(cands) if c["kinds"] and c["fits"] and not c["plan"]["offload"]]
        ws = options["world_size"]
        for c in listed:
            t = time.monotonic()
            if api == "fsdp2":
                measured = _fsdp2_steps(c, build, ws, inputs, lambda out: out.float().mean(), None)
            else:
                measured = _fsdp1_measured(c, build, ws, inputs)
            rows.append([name, ", ".join(c["kinds"]), c["peak_bytes"], measured, None])
            print(f"{name} | {rows[-1][1]} | {c['peak_bytes']} / {measured} = {c['peak_bytes'] / measured:.3f} "
                  f"({time.monotonic() - t:.0f} s)", flush=True)
        if args.simulate and listed:
            from fsdp_lint.run import simulate
            from fsdp_lint.run.spec import RunOptions

            top = listed[0]
            own = next(c for c in cands if not c["kinds"])
            res.suggestions, res.simulated = [own, top], {"peak_bytes": own["peak_bytes"]}
            saved, simulate.SIMULATED_CANDIDATES = simulate.SIMULATED_CANDIDATES, 1
            cwd = os.getcwd()
            try:
                os.chdir(os.path.dirname(path))
                simulate.simulate_candidates(res, settings, RunOptions(input_shape=options.get("input_shape"),
                                                                       timeout=900), time.monotonic() + 900)
            finally:
                os.chdir(cwd)
                simulate.SIMULATED_CANDIDATES = saved
            row = next(r for r in rows if r[0] == name and r[1] == ", ".join(top["kinds"]))
            row[4] = top.get("simulated_peak_bytes") or top.get("simulated_error")
            print(f"{name} | {row[1]} | simulated {row[4]}", flush=True)
    del torch
    print("\n| case | change | reported / measured | simulated / measured |\n|---|---|---|---|")
    for name, kinds, peak, measured, sim in rows:
        s = f"{sim / measured:.3f}" if isinstance(sim, int) else (sim or "")
        print(f"| {name} | {kinds} | {peak / measured:.3f} | {s} |")


if __name__ == "__main__":
    main()
