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
