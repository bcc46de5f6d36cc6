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

from fsdp_lint.config import Settings  # noqa: E402
from fsdp_lint.engine import analyse  # noqa: E402

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
        assert not isinstance(real.module, FSDP) and real.module is not real     # what the recorded wrap mirrors
    finally:
        dist.destroy_process_group()
    assert net._fsdp_wrapped_module is net
    # torch's `.module` is the wrapped module, not an FSDP instance: unwrap loops end on it, and it is
    # not the wrapper (`unwrap_model(model) is not model`); here it holds the module's own state
    assert fsdp1_wrapper.is_recorded(net) and not fsdp1_wrapper.is_recorded(net.module)
    assert net.module is not net and type(net.module) is Net and net.module.proj is net.proj
    net.module.tag = "set through .module"
    assert net.tag == "set through .module" and list(net.module.parameters()) == list(net.parameters())
    assert net.sharding_strategy is ShardingStrategy.HYBRID_SHARD and net._use_orig_params is True
    assert net.world_size == 16 and net.mixed_precision.param_dtype is None
    with net.no_sync():
        pass
    assert list(net.modules()) == [net, net.proj]            # no submodule registered
    net.proj.weight.grad = torch.ones_like(net.proj.weight)
    assert float(net.clip_grad_norm_(1e9)) == pytest.approx(4.0)   # torch's norm over the parameters' grads


# --------------------------------------------------------------------------------------------
# the units an auto-wrap policy makes are FSDP instances too
# --------------------------------------------------------------------------------------------
UNITS = os.path.join(REPO, "fixtures", "repos", "unit_ckpt")


@pytest.fixture
def in_units_repo(monkeypatch):
    monkeypatch.chdir(UNITS)
    yield
    for name in [n for n in sys.modules if n == "blocktrain" or n.startswith("blocktrain.")]:
        sys.modules.pop(name, None)


def test_a_script_acting_on_its_fsdp_units_finds_as_many_as_torch_builds(in_units_repo):
    # blocktrain.distributed counts `isinstance(m, FSDP)` over model.modules() (raising when it is not the
    # block count + 1) and checkpoints every nested unit with `check_fn=isinstance(m, FSDP)`. Before, only
    # the root answered: the count raised (skipped) and no unit was checkpointed.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_lint.replay.model_root import CHECKPOINTED_AFTER_WRAP

    from test_idioms import strip_wrapper_prefixes, torch_units

    train = os.path.join(UNITS, "train.py")
    # the count runs without checkpointing too: the plan is torch's
    res, _ = assert_plan_matches_torch(train, 8)
    assert not res.skipped_statements, [str(s) for s in res.skipped_statements]
    res = analyse(train, Settings(world_size=8), argv=["--act_ckpt"], keep_model=True)
    _, torch_res = torch_units(train, 8, ["--act_ckpt"])
    torch_count = len(FSDP.fsdp_modules(torch_res.model))
    torch_ckpt = sorted(strip_wrapper_prefixes(n) for n, m in torch_res.model.named_modules()
                        if isinstance(m, CheckpointWrapper))
    assert torch_count == 5 and torch_ckpt == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]   # the oracle
    assert len(res.plan.units) == torch_count
    assert not res.skipped_statements, [str(s) for s in res.skipped_statements]
    marked = sorted(n for n, m in res.replay.model.named_modules() if CHECKPOINTED_AFTER_WRAP in m.__dict__)
    assert marked == torch_ckpt


def test_the_checkpointed_units_enter_the_memory_estimate(in_units_repo, cli):
    import json

    res = cli("train.py", "--world-size", "8", "--format", "json", "--", "--act_ckpt", cwd=UNITS)
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    assert f["memory"]["checkpointed_regions"] == 4      # the 4 CheckpointWrappers torch's model holds (above)
    assert not any("skipped" in n for n in f["notes"]), f["notes"]


def test_fsdp_modules_and_isinstance_answer_for_the_units_of_a_recorded_wrap():
    """``FSDP.fsdp_modules(model)`` (and ``root_only``), ``isinstance`` and ``check_is_root`` of each unit,
    compared with real FSDP1 on the same model under the fake process group."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fsdp_lint.api import record

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

    def build():
        return nn.Sequential(nn.Linear(8, 8), Layer(), nn.Sequential(Layer(), Layer()), nn.Linear(8, 2))

    from oracle import fake_pg

    with fake_pg(4):
        real = FSDP(build(), auto_wrap_policy=ModuleWrapPolicy({Layer}), device_id=torch.device("cpu"))
        real_units = FSDP.fsdp_modules(real)
        real_roots = FSDP.fsdp_modules(real, root_only=True)
        real_is = [isinstance(m, FSDP) for m in real.modules()].count(True)

    def inner(m):
        return m._fsdp_wrapped_module if isinstance(m, FSDP) else m

    with record(world_size=4):
        from torch.distributed.fsdp import FullyShardedDataParallel as RecFSDP

        model = RecFSDP(build(), auto_wrap_policy=ModuleWrapPolicy({Layer}))
        units = RecFSDP.fsdp_modules(model)
        roots = RecFSDP.fsdp_modules(model, root_only=True)
        count = [isinstance(m, RecFSDP) for m in model.modules()].count(True)
        root_flags = [u.check_is_root() for u in units]
    assert count == real_is == len(real_units) == 4
    assert [type(u).__name__ for u in units] == [type(inner(u)).__name__ for u in real_units]
    assert len(roots) == len(real_roots) == 1 and roots[0] is model
    assert root_flags == [True, False, False, False]


SHARDED_CHECKPOINTS = '''
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, ShardedStateDictConfig
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def setup_checkpointing(model) -> None:
    """Sharded checkpoints for the run; a full, rank-0 copy of the weights at start, for the evaluator."""
    previous = FSDP.set_state_dict_type(model, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True))
    if previous.state_dict_type != StateDictType.FULL_STATE_DICT:
        raise RuntimeError(f"unexpected state dict type {previous.state_dict_type}")
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        if FSDP.get_state_dict_type(model).state_dict_type != StateDictType.FULL_STATE_DICT:
            raise RuntimeError("the full state dict is not active")
    current = model.get_state_dict_type(model)
    if current.state_dict_type != StateDictType.SHARDED_STATE_DICT or not current.state_dict_config.offload_to_cpu:
        raise RuntimeError(f"the sharded state dict did not come back: {current}")


def main():
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    model = FSDP(Net(), auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
                 device_id=torch.cuda.current_device() if torch.cuda.is_available() else torch.device("cpu"))
    setup_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        model(torch.randn(4, 32)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_state_dict_settings_are_torchs_own_and_read_back(tmp_path):
    """``FSDP.set_state_dict_type`` / ``state_dict_type`` / ``get_state_dict_type`` at setup (sharded
    checkpoints chosen before the first step): the recorded instances answer with torch's own functions
    (previous settings returned, the context restores them), where they raised ``KeyError`` and the
    statement was skipped; real FSDP1 runs the same file to the same plan."""
    path = tmp_path / "train.py"
    path.write_text(SHARDED_CHECKPOINTS)
    res, _ = assert_plan_matches_torch(str(path), 4)
    assert res.skipped_statements == [], res.skipped_statements
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], [""]]
