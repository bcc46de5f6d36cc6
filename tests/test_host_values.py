"""Small tensors made outside the model hold values on the simulated node, and the collectives leave in
them what a real world gives rank 0 (`fsdp_lint.replay.host_values`; issue 15, host reads of tensor data).

Oracles: real collectives of two gloo processes (tests/gloo.py) for the values; real torch FSDP1 under
the fake process group for the plans of a trainer whose groups come from a rank grid
(fixtures/repos/grid_groups, in the idiom of fairscale's ``initialize_model_parallel``: the rank grid is
``torch.arange(world).reshape(dp, mp)``, the groups its columns' ``.tolist()``)."""
from __future__ import annotations

import functools
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from gloo import run_ranks  # noqa: E402
from oracle import _record_calls, fake_pg  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

GRID = os.path.join(REPO, "fixtures", "repos", "grid_groups")
TRAIN = os.path.join(GRID, "gridtrain", "train.py")


def _exchange(dist, rank: int, local_world_size: int) -> dict:
    """Setup-code collectives on host-readable tensors, as every rank runs them."""
    out = {}
    buf = torch.zeros(16, dtype=torch.uint8)
    if rank == 0:
        raw = torch.tensor(list(b"run-42"), dtype=torch.uint8)
        buf[: raw.numel()] = raw
    dist.broadcast(buf, src=0)
    out["run_id"] = bytes(buf.numpy()).rstrip(b"\0").decode()
    world = dist.get_world_size()
    sizes = torch.empty([world], dtype=torch.long)
    dist.all_gather_into_tensor(sizes, torch.tensor([local_world_size]))
    out["local_world_sizes"] = sizes.tolist()
    slots = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(slots, torch.tensor([float(local_world_size), 3.0]))
    out["gathered"] = [s.tolist() for s in slots]
    for op in ("SUM", "MAX", "MIN", "PRODUCT"):
        flag = torch.tensor([1, 3])
        dist.all_reduce(flag, op=getattr(dist.ReduceOp, op))
        out[op] = flag.tolist()
    return out


def _rank(rank, world_size):
    import torch.distributed as dist

    return _exchange(dist, rank, local_world_size=2)


def test_collectives_leave_what_two_real_ranks_leave_rank_0():
    real_rank0 = run_ranks(_rank, world_size=2, timeout=120)[0]

    from fsdp_lint.replay import host_values

    class Rec:
        world_size = 2

        def position(self):
            return types.SimpleNamespace(path="train.py", line=1)

    import torch.distributed as real_dist

    sim = types.SimpleNamespace(ReduceOp=real_dist.ReduceOp, get_world_size=lambda group=None: 2,
                                **{n: None for n in ("broadcast", "all_reduce", "reduce", "all_gather",
                                                     "all_gather_into_tensor", "all_gather_object",
                                                     "reduce_scatter_tensor")})
    host_values.install(Rec(), lambda obj, name, value: setattr(obj, name, value), sim)
    assert _exchange(sim, 0, local_world_size=2) == real_rank0
    assert real_rank0["run_id"] == "run-42" and real_rank0["SUM"] == [2, 6]   # the oracle is not vacuous


@pytest.fixture
def in_grid(monkeypatch):
    monkeypatch.chdir(GRID)
    yield
    for name in [n for n in sys.modules if n == "gridtrain" or n.startswith("gridtrain.")]:
        sys.modules.pop(name, None)


def _torch_shard_sizes(argv, world_size):
    """Ranks each FSDP1 unit is sharded over when real torch wraps the fixture (fake process group)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_lint.entry.source import read_source
    from fsdp_lint.replay import replay

    inits: list = []
    with _record_calls(FSDP, "__init__", inits):
        replay(read_source(TRAIN), world_size, real=True, argv=argv)
    return sorted(inst.world_size for inst in inits)


def test_groups_built_from_a_rank_grid_plan_as_torch_builds_them(in_grid):
    # before: torch.where(grid == rank) on meta tensors never matched, and no data-parallel group was set
    argv = ["--config", "configs/dit.yaml"]
    res, _ = assert_plan_matches_torch(TRAIN, 8, argv=argv)
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], [""]]
    # model parallel 2 of 8 ranks: FSDP shards over the 4-rank data-parallel group, as torch does
    assert sorted(u.shard_size for u in res.plan.units) == _torch_shard_sizes(argv, 8) == [4] * 5
    # the column-split layer has the shape of a 2-way split, as the model-parallel group's size says
    assert res.tree.params["blocks.0.qkv.weight"].shape == (96, 64)


def test_node_groups_from_all_gathered_local_world_sizes(in_grid):
    """``all_gather_into_tensor`` of LOCAL_WORLD_SIZE, then ``.tolist()``: the node groups of 2 nodes of 8
    GPUs; FSDP shards within the node as real FSDP1 does over an 8-rank group of a 16-rank world."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    from fsdp_lint.config import Settings
    from fsdp_lint.engine import analyse

    res = analyse(TRAIN, Settings(world_size=16, gpus_per_node=8), argv=["--config", "configs/dit_node.yaml"])
    assert any("all_gather filled every rank's slot with rank 0's value" in n for n in res.notes)

    sys.path.insert(0, GRID)
    try:
        import torch.distributed as dist

        from gridtrain import groups
        from gridtrain.model import Block, DiT

        with fake_pg(16):
            groups.init_parallel(1)
            node = dist.new_group(list(range(8)))
            root = FSDP(DiT(dim=64, depth=4), process_group=node, device_id=torch.device("cpu"),
                        auto_wrap_policy=functools.partial(lambda_auto_wrap_policy,
                                                           lambda_fn=lambda m: isinstance(m, Block)),
                        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
            real = sorted(m.world_size for m in FSDP.fsdp_modules(root))
            groups._DP_GROUP = groups._MP_GROUP = None
    finally:
        sys.path.remove(GRID)
    assert sorted(u.shard_size for u in res.plan.units) == real == [8] * 5


def test_a_run_id_broadcast_as_bytes_is_read_back(tmp_path, cli):
    """``bytes(buf.cpu().numpy()).decode()`` of a broadcast CUDA tensor: rank 0's own string, so a folder
    named by it is a real name (before: "Cannot copy out of meta tensor; no data!")."""
    (tmp_path / "train.py").write_text('''
import os
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
buf = torch.tensor(list(b"exp-7".ljust(16, b"\\0")), dtype=torch.uint8).cuda()
dist.broadcast(buf, src=0)
run_id = bytes(buf.cpu().numpy()).rstrip(b"\\0").decode()
assert run_id == "exp-7", run_id
width = int(torch.tensor([32]).cuda().item())
model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))
for layer in model:
    fully_shard(layer)
fully_shard(model)
''')
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    import json

    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == 2 * (32 * 32 + 32)
    assert not any("no data here" in n for n in f["notes"]), f["notes"]


def test_a_host_tensor_made_a_parameter_is_model_data_on_meta(tmp_path, cli):
    """A parameter or buffer given a small host tensor after the model is built stays model data: on
    meta like the rest (the plan sees its shape), and an op mixing it with meta tensors runs on meta."""
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
model.pos = nn.Parameter(torch.zeros(4, 16))
model.register_buffer("mask", torch.ones(4, 4).tril())
# on the node they are GPU tensors, and so the replay answers (fsdp_lint/replay/device_mode.py)
assert not model.pos.is_meta and not model.mask.is_meta and model.pos.is_cuda
scaled = model[0].weight * torch.arange(16.0)
assert not scaled.is_meta and scaled.shape == (16, 16)
fully_shard(model[0])
fully_shard(model)
''')
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    import json

    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == 2 * (16 * 16 + 16) + 4 * 16


def test_a_bare_call_that_sets_a_librarys_groups_runs(tmp_path, cli):
    """``mpu.initialize_model_parallel(2)`` binds nothing, but the library keeps the groups it builds and
    later code reads them (``mpu.data_parallel_group()``): the slice of the setup keeps the call. A bare
    standard-library call nothing reads (``os.makedirs``) is still left out."""
    (tmp_path / "mpu").mkdir()
    (tmp_path / "mpu" / "__init__.py").write_text('''
import torch
import torch.distributed as dist

_DP = None


def initialize_model_parallel(mp):
    global _DP
    world, rank = dist.get_world_size(), dist.get_rank()
    grid = torch.arange(world).reshape(-1, mp)
    row, col = (int(i[0]) for i in torch.where(grid == rank))
    for k in range(mp):
        group = dist.new_group(grid[:, k].tolist())
        if k == col:
            _DP = group


def data_parallel_group():
    assert _DP is not None, "data parallel group is not initialized"
    return _DP
''')
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text('''
import os

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

import mpu

mpu.initialize_model_parallel(2)
os.makedirs("never-made", exist_ok=True)
model = FSDP(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), process_group=mpu.data_parallel_group())
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
''')
    res = cli("train.py", "--world-size", "8", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    import json

    [unit] = json.loads(res.out)["files"][0]["plan"]["units"]
    assert unit["shard_numel"] * 4 == unit["padded_numel"]     # the 4-rank data-parallel group of 8 ranks
    assert not (tmp_path / "never-made").exists()
