"""What a recorded ``FullyShardedDataParallel(model, ...)`` exposes to the statements after it: the
wrapped module (``model.module.unfreeze_all()``), ``no_sync()``, ``clip_grad_norm_``, the options.

Oracle: real FSDP1 under the fake process group on the same file (`assert_plan_matches_torch`), and
torch's own wrapper's attributes."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

MM = os.path.join(REPO, "fixtures", "repos", "mm_fsdp1")


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(MM)
    yield
    for name in [n for n in sys.modules if n == "mmtrain" or n.startswith("mmtrain.")]:
        sys.modules.pop(name, None)


def test_statements_after_the_wrap_reach_the_wrapped_module_and_the_plan_equals_torch(in_repo):
    # train_one_epoch calls `model.module.unfreeze_all()` and `model.no_sync()` before the first forward:
    # the replay reaches the forward as a real node does, and the plan is real FSDP1's
    res, real = assert_plan_matches_torch(os.path.join(MM, "run_training.py"), 8)
    assert [u.modules for u in res.plan.units] == [["encoder.0"], ["encoder.1"], ["encoder.2"], [""]]
    assert res.plan.sharding_strategy == real[0]["sharding_strategy"] == "SHARD_GRAD_OP"


def test_the_recorded_wrap_answers_what_torchs_wrapper_has():
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    from fsdp_lint.replay import fsdp1_wrapper

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

    net = Net()
    fsdp1_wrapper.expose(net, {"sharding_strategy": ShardingStrategy.HYBRID_SHARD, "use_orig_params": True}, 16)
    wrapper_names = {"module", "_fsdp_wrapped_module", "no_sync", "clip_grad_norm_", "check_is_root",
                     "summon_full_params", "state_dict_type", "sharding_strategy", "mixed_precision",
                     "backward_prefetch", "forward_prefetch", "limit_all_gathers", "rank", "world_size",
                     "compute_device", "_use_orig_params", "cpu_offload"}
    # each is an attribute of torch's own wrapper, built on CPU under the fake process group
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        real = FSDP(Net(), device_id=torch.device("cpu"))
        assert all(hasattr(real, name) for name in wrapper_names), [n for n in wrapper_names if not hasattr(real, n)]
        assert real.mixed_precision == net.mixed_precision and real.backward_prefetch == net.backward_prefetch
        assert (real.forward_prefetch, real.limit_all_gathers) == (net.forward_prefetch, net.limit_all_gathers)
    finally:
        dist.destroy_process_group()
    assert net.module is net and net._fsdp_wrapped_module is net
    assert net.sharding_strategy is ShardingStrategy.HYBRID_SHARD and net._use_orig_params is True
    assert net.world_size == 16 and net.mixed_precision.param_dtype is None
    with net.no_sync():
        pass
    assert list(net.modules()) == [net, net.proj]            # no submodule registered
    net.proj.weight.grad = torch.ones_like(net.proj.weight)
    assert float(net.clip_grad_norm_(1e9)) == pytest.approx(4.0)   # torch's norm over the parameters' grads
