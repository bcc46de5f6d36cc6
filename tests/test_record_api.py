"""``fsdp_lint.record()`` around code that bound torch's wrap functions before the block (issue 18): the
names a module imported at its top (``from torch.distributed.fsdp import fully_shard``, ``... as``,
``functools.partial``, ``FullyShardedDataParallel as FSDP``) record inside the block, as the module
attributes do; torch's own rendezvous fails at once instead of waiting for ranks; nested blocks keep
their own calls; afterwards torch is as before (real FSDP1/FSDP2 run under the fake process group).
The oracle: the units real torch builds for the same calls (tests/oracle.py)."""
from __future__ import annotations

import functools
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
# bound at import, before any block: what a training module does at its top
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp import fully_shard as shard_it
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed import init_process_group

import fsdp_lint
from oracle import fake_pg, fsdp1_units, fsdp2_groups

reshard_later = functools.partial(fully_shard, reshard_after_forward=False)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return self.down(self.up(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(32, 100)


def _wrap_fsdp2(model, mesh=None):
    extra = {"mesh": mesh} if mesh is not None else {}
    shard_it(model.blocks[0], **extra)          # `import ... as`
    reshard_later(model.blocks[1], **extra)     # functools.partial bound at import
    fully_shard(model.blocks[2], **extra)
    fully_shard(model, **extra)
    return model


def test_names_bound_before_the_block_record_fsdp2():
    with fsdp_lint.record(world_size=4) as rec:
        _wrap_fsdp2(Net())
    report = rec.report()
    real = fsdp2_groups(Net, world_size=4, apply=_wrap_fsdp2)
    assert [u.modules for u in report.plan.units] == [g["modules"] for g in real]
    assert [u.params for u in report.plan.units] == [[p["fqn"] for p in g["params"]] for g in real]
    assert [c.kwargs.get("reshard_after_forward") for c in rec.rec.wrap_calls] == [None, False, None, None]


def test_names_bound_before_the_block_record_fsdp1():
    with fsdp_lint.record(world_size=4) as rec:
        model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
    assert isinstance(model, Net)                       # the recorder returns the module, as in a replay
    report = rec.report()
    real = fsdp1_units(Net, world_size=4, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
    assert [u.module for u in report.plan.units] == [r["module"] for r in real]
    assert [u.shard_numel for u in report.plan.units] == [r["shard_numel"] for r in real]


def test_a_real_rendezvous_in_the_block_fails_at_once():
    """`init_process_group` bound before the block is torch's own: the env:// rendezvous would wait for
    3 more ranks; it raises one line instead."""
    from fsdp_lint.replay.recorders import RealRendezvousError

    with pytest.raises(RealRendezvousError) as info:
        with fsdp_lint.record(world_size=4):
            init_process_group("nccl")
    assert "would wait for 4 real ranks" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(RealRendezvousError):
        with fsdp_lint.record(world_size=4):
            dist.TCPStore("127.0.0.1", 0, 4, True)


def test_nested_blocks_keep_their_calls_and_torch_is_as_before():
    code = fully_shard.__code__
    with fsdp_lint.record(world_size=4) as outer:
        net = Net()
        fully_shard(net.blocks[0])
        with fsdp_lint.record(world_size=2) as inner:
            other = Net()
            shard_it(other.blocks[1])
            FSDP(other.blocks[2])
        fully_shard(net)
    assert [c.api for c in inner.rec.wrap_calls] == ["fsdp2", "fsdp1"]
    assert [u.module for u in inner.report(other).plan.units] == ["blocks.1", "blocks.2"]
    assert [u.module for u in outer.report(net).plan.units] == ["blocks.0", ""]
    # torch as before: the same function code, no process group, the CPU default device ...
    assert fully_shard.__code__ is code and not dist.is_initialized()
    assert torch.get_default_device() == torch.device("cpu") and torch.ones(1).device.type == "cpu"
    assert "fsdp_lint" not in type(torch.distributed.fsdp.fully_shard).__module__
    # ... and real FSDP1 and FSDP2 build their units again
    with fake_pg(2):
        wrapped = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
        assert type(wrapped) is FSDP and len(list(FSDP.fsdp_modules(wrapped))) == 4
    assert len(fsdp2_groups(Net, world_size=2, apply=_wrap_fsdp2)) == 4
    assert sys.modules["torch.distributed.fsdp"].FullyShardedDataParallel is FSDP
