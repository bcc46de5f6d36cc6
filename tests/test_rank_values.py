"""Values each rank derives from its own place in the job -- its rank, local rank, node index, host name --
are each rank's own in what a collective gathers on the simulated node (`fsdp_lint.replay.rank_values`;
issue 15: before, every slot held rank 0's value, and groups built from them put every rank on one node).

Oracles: two real gloo processes (tests/gloo.py) on one host (``LOCAL_WORLD_SIZE=2``: one node of two
GPUs) for the values; real FSDP1 under the fake process group for the plan of a hybrid-sharded trainer
whose groups come from all-gathered host names and local ranks (fixtures/repos/host_groups)."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from gloo import run_ranks  # noqa: E402
from oracle import fake_pg  # noqa: E402

HOSTS = os.path.join(REPO, "fixtures", "repos", "host_groups")
TRAIN = os.path.join(HOSTS, "train.py")


def _exchange(dist) -> dict:
    """Setup-code collectives over values each rank derives from its rank, as every rank runs them."""
    import socket

    from nodetrain.topology import build_hybrid_groups, discover

    out = {}
    out["hosts"], out["local_ranks"] = discover()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    places = [None] * world
    dist.all_gather_object(places, {"host": socket.gethostname().lower(), "rank": rank, "node": rank // local_world})
    out["places"] = places
    both = torch.empty(2 * world, dtype=torch.long)
    dist.all_gather_into_tensor(both, torch.tensor([rank, 10 * rank + 1]))
    out["ranks"] = both.tolist()
    slots = [torch.zeros(2, dtype=torch.long) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank, 7 * rank + 2]), gather_list=slots, dst=0)     # data statistics, to rank 0
    out["gathered"] = [s.tolist() for s in slots] if slots is not None else None
    top = torch.tensor([rank % local_world])
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    out["max_local_rank"], out["sum"] = top.tolist(), total.tolist()
    src = torch.tensor([100 + rank])
    dist.broadcast(src, src=1)
    out["from_rank_1"] = src.tolist()
    shard, replicate, nodes = build_hybrid_groups()
    out["groups"] = (dist.get_world_size(shard), dist.get_world_size(replicate), nodes, dist.get_rank(shard))
    return out


def _rank(rank, world_size):
    import torch.distributed as dist

    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    return _exchange(dist)


def test_rank_dependent_values_gather_as_two_real_ranks_gather_them(monkeypatch):
    monkeypatch.syspath_prepend(HOSTS)
    try:
        real_rank0 = run_ranks(_rank, world_size=2, timeout=120)[0]
        assert real_rank0["local_ranks"] == [0, 1] and real_rank0["sum"] == [3]   # the oracle is not vacuous

        import torch.distributed as dist

        from fsdp_lint.api import record

        with record(world_size=2):
            simulated = _exchange(dist)
    finally:
        for name in [n for n in sys.modules if n == "nodetrain" or n.startswith("nodetrain.")]:
            sys.modules.pop(name, None)
    assert simulated == real_rank0


def test_hybrid_groups_from_gathered_host_names_plan_as_torch_builds_them():
    """2 nodes of 8 GPUs: the intra-node group (8 ranks) shards, the same local rank's group replicates.
    Before, every gathered host name and local rank was rank 0's: one "node" of 16 ranks."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fsdp_lint.config import Settings
    from fsdp_lint.engine import analyse

    res = analyse(TRAIN, Settings(world_size=16, gpus_per_node=8), cwd=HOSTS)
    assert not res.skipped_statements, [str(s) for s in res.skipped_statements]
    sys.path.insert(0, HOSTS)
    try:
        import torch.distributed as dist

        from nodetrain.model import Block, Net

        with fake_pg(16):
            groups = (dist.new_group(list(range(8))), dist.new_group([0, 8]))
            dist.new_group(list(range(8, 16)))
            root = FSDP(Net(), process_group=groups, sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                        auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"),
                        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
            real = [(m.world_size, m._inter_node_pg.size()) for m in FSDP.fsdp_modules(root)]
    finally:
        sys.path.remove(HOSTS)
        for name in [n for n in sys.modules if n == "nodetrain" or n.startswith("nodetrain.")]:
            sys.modules.pop(name, None)
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], [""]]
    assert sorted(u.shard_size for u in res.plan.units) == sorted(w for w, _ in real) == [8] * 4
    assert res.plan.sharding_strategy == "HYBRID_SHARD"
    assert {r for _, r in real} == {2}


def _config():
    import socket

    import torch.distributed as dist
    from omegaconf import OmegaConf

    return OmegaConf.create({"rank": dist.get_rank(), "host": socket.gethostname()})


def test_a_rank_stored_in_a_config_is_the_plain_int():
    """Code that exchanges nothing gets the plain rank and host name (OmegaConf and PyYAML take exact
    types only), as on the node: a config built from them works."""
    import pytest

    pytest.importorskip("omegaconf")
    import socket

    import yaml

    from fsdp_lint.api import record

    with record(world_size=2):
        cfg = _config()
    assert type(cfg.rank) is int and cfg.rank == 0 and cfg.host == socket.gethostname()
    assert yaml.safe_load(yaml.safe_dump({"rank": cfg.rank})) == {"rank": 0}
