"""The memory budget: the peak per rank against the device (``--gpu-memory``, ``--gpu``), FSD801, and
the rules whose cost is memory judged by their share of it (FSD104, FSD202)."""
from __future__ import annotations

import json
import os

from conftest import REPO

HEAVY_ROOT = os.path.join(REPO, "fixtures", "bad", "fsdp2_heavy_root.py")


def _file(cli, *args):
    res = cli(*args, "--format", "json")
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    return res, f


def test_budget_is_the_gpu_profiles_memory_less_what_a_process_loses(cli):
    from fsdp_lint import gpus

    _, f = _file(cli, HEAVY_ROOT, "--world-size", "4", "--gpu", "a100-40gb")
    b = f["memory"]["budget"]
    assert b["device_bytes"] == gpus.profile("a100-40gb").memory_bytes
    reserved = b["reserved"]
    assert b["usable_bytes"] == int((b["device_bytes"] - reserved["cuda_context_bytes"] - reserved["nccl_bytes"])
                                    * (1 - reserved["fragmentation"]))
    assert b["peak_bytes"] == f["memory"]["per_rank_bytes"] and b["headroom_bytes"] == b["usable_bytes"] - b["peak_bytes"]
    # no input shape: a lower bound below the budget proves nothing
    assert b["source"] == "lower bound without inputs" and b["fits"] is None


def test_lower_bound_above_the_budget_is_fsd801_and_says_so(cli):
    res, f = _file(cli, HEAVY_ROOT, "--world-size", "4", "--gpu-memory", "2.01GiB")
    b = f["memory"]["budget"]
    assert b["device_bytes"] == int(2.01 * (1 << 30)) and b["fits"] is False
    (hit,) = [x for x in f["findings"] if x["code"] == "FSD801"]
    assert hit["severity"] == "error" and "lower bound" in (hit["message"] + " " + str(hit.get("detail"))) and "largest:" in (hit["message"] + " " + str(hit.get("detail")))
    assert res.code == 1


def test_a_cost_below_the_share_of_the_device_is_info_above_it_a_warning(cli):
    _, on_h100 = _file(cli, HEAVY_ROOT, "--world-size", "4")
    (info,) = [x for x in on_h100["findings"] if x["code"] == "FSD104"]
    assert info["severity"] == "info" and "of the usable memory of the device" in (info["message"] + " " + str(info.get("detail")))
    _, small = _file(cli, HEAVY_ROOT, "--world-size", "4", "--gpu-memory", "2.05GiB")
    (warn,) = [x for x in small["findings"] if x["code"] == "FSD104"]
    assert warn["severity"] == "warning"


def test_bad_sizes_are_one_line_and_exit_2(cli):
    res = cli(HEAVY_ROOT, "--gpu-memory", "lots")
    assert res.code == 2 and "--gpu-memory must be a size" in res.err and "Traceback" not in res.err


MLP = os.path.join(REPO, "fixtures", "memory", "mlp_stack_fsdp2.py")


def test_suggest_lists_the_plans_that_fit_and_each_matches_torch_applied_for_real(cli):
    """--suggest on a plan whose activations do not fit: activation checkpointing fits, with the same
    collectives; applied for real (checkpoint_wrapper, then the file's wrap) under FSDPMemTracker, the
    candidate's peak is within a quarter of torch's."""
    import sys

    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing, checkpoint_wrapper)

    from test_simulate import _per_block, fsdp2_oracle

    res, f = _file(cli, MLP, "--world-size", "4", "--gpu-memory", "2.6GiB", "--suggest")
    assert [x["code"] for x in f["findings"] if x["code"] == "FSD801"] == ["FSD801"]
    cands = f["suggestions"]
    plan = next(c for c in cands if c["kinds"] == [])
    assert plan["fits"] is False and plan["peak_bytes"] == f["memory"]["per_rank_bytes"]
    first = cands[0]
    assert first["fits"] is True and first["kinds"] == ["ac"] and "apply_activation_checkpointing" in first["change"]
    assert first["all_gather_bytes_per_step"] == plan["all_gather_bytes_per_step"]
    for c in cands:   # sorted: those that fit first, then by communication per step
        assert set(c) >= {"change", "fits", "peak_bytes", "simulated_peak_bytes", "all_gather_bytes_per_step",
                          "reduce_scatter_bytes_per_step"}
    sys.path.insert(0, os.path.dirname(MLP))
    try:
        from mlp_stack_fsdp2 import Block, MLPStack
    finally:
        sys.path.remove(os.path.dirname(MLP))

    def build():
        model = MLPStack()
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, Block))
        return model

    snap = fsdp2_oracle(build, _per_block(lambda m: m.layers, False), 4, lambda: (torch.randn(8, 512, 1024),),
                        lambda out: out.float().mean())
    assert abs(first["peak_bytes"] - snap["Total"]) <= 0.25 * snap["Total"], (first["peak_bytes"], snap["Total"])
