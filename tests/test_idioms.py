"""The static wrap plan of real-world wrap code equals what real torch builds from the same code.

For every fixture under ``fixtures/idioms/`` (and the article's two files) and for small inline
variations of the idioms of issue 2 §4, the plan that ``fsdp_lint.engine.analyse`` derives on the
meta device with recorders is compared with the units torch builds when the *same file* is replayed
with the real ``FullyShardedDataParallel`` / ``fully_shard`` under the fake process group
(``replay(..., real=True)``: FSDP1 on CPU, FSDP2 on meta with a CPU mesh).

The torch side is read from what torch built, never from fsdp-lint's records:

* FSDP1: every ``FullyShardedDataParallel`` instance in the wrapped model (in the order their
  construction finished: children of an auto-wrap first, the root last), its module's FQN in the
  unwrapped model, and its ``FlatParameter``'s original parameters (``_fqns``), dtype and
  ``requires_grad``; ``use_orig_params``, ``sharding_strategy`` and ``mixed_precision`` of the instance;
* FSDP2: every ``FSDPState`` (in ``init`` order), its modules, and its ``FSDPParamGroup``'s
  parameters (the ``DTensor`` sharded parameters, their dtype and ``requires_grad``), the group's
  ``reshard_after_forward`` (a post-forward mesh or not) and mixed-precision ``param_dtype``.
"""
from __future__ import annotations

import glob
import os
import sys

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

from fsdp_lint.config import Settings
from fsdp_lint.engine import analyse
from fsdp_lint.replay import replay
from fsdp_lint.entry.source import read_source

sys.path.insert(0, os.path.dirname(__file__))
from oracle import _record_calls, dtype_name, param_groups  # noqa: E402


def strip_wrapper_prefixes(fqn: str) -> str:
    """FQN in the model as the file built it: FSDP1's wrappers removed, other wrappers (activation
    checkpointing applied before the wrap) kept, as ``named_parameters()`` names them."""
    return ".".join(p for p in fqn.split(".") if p and p not in ("_fsdp_wrapped_module", "_fpw_module"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDIOMS = sorted(glob.glob(os.path.join(ROOT, "fixtures", "idioms", "*.py"))) + [
    os.path.join(ROOT, "fixtures", "article_fsdp1.py"),
    os.path.join(ROOT, "fixtures", "article_fsdp2.py"),
]
BAD = sorted(glob.glob(os.path.join(ROOT, "fixtures", "bad", "*.py")))
HF = {"hf_llama_fsdp2.py", "peft_lora_fsdp1.py"}


def _needs_hf(path):
    """The HF/PEFT idioms need transformers and peft, which the `test` extra installs; a missing
    package fails the test rather than skipping a feature."""
    if os.path.basename(path) in HF:
        import peft  # noqa: F401
        import transformers  # noqa: F401


# --------------------------------------------------------------------------------------------
# what torch built
# --------------------------------------------------------------------------------------------
def torch_units(path: str, world_size: int, argv=None) -> tuple[list[dict], object]:
    """Replay `path` (with the script's arguments `argv`) with the real FSDP APIs; describe every
    unit torch built, in application order."""
    inits: list = []
    states: list = []
    facts = read_source(path)
    with _record_calls(FSDP, "__init__", inits), _record_calls(FSDPState, "init", states):
        res = replay(facts, world_size, real=True, argv=argv)
    assert not dist.is_initialized(), "the replay must not leave a process group behind"
    root = res.model
    mod_name = {}
    for name, m in root.named_modules(remove_duplicate=False):
        mod_name.setdefault(id(m), strip_wrapper_prefixes(name))
    param_name = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        param_name.setdefault(id(p), strip_wrapper_prefixes(name))
    units = []
    if inits:
        assert not states, "a file uses one API"
        in_tree = {id(m) for m in FSDP.fsdp_modules(root)}
        for inst in inits:
            if id(inst) not in in_tree:     # built, then replaced (not part of the final model)
                continue
            fqn = mod_name[id(inst)]
            unit = {"modules": [fqn], "params": [], "dtypes": set(), "requires_grad": {},
                    "use_orig_params": inst._use_orig_params,
                    "sharding_strategy": inst.sharding_strategy.name,
                    "param_dtype": dtype_name(inst.mixed_precision.param_dtype)
                    if inst.mixed_precision.param_dtype is not None else None}
            handle = inst._handle
            if handle is not None:
                fp = handle.flat_param
                prefix = fqn + "." if fqn else ""
                unit["params"] = [prefix + strip_wrapper_prefixes(f) for f in fp._fqns]
                unit["dtypes"] = {dtype_name(fp.dtype)}
                if fp._params is not None:      # use_orig_params=True keeps the original params
                    unit["requires_grad"] = {n: bool(p.requires_grad) for n, p in zip(unit["params"], fp._params)}
                else:
                    unit["requires_grad"] = {n: bool(fp.requires_grad) for n in unit["params"]}
            units.append(unit)
        assert len(units) == len(in_tree)
    else:
        # groups of a model built, then replaced: an earlier round of the replay (fsdp_lint.replay.asked_keys
        # runs the script again once it has learnt the keys the script reads from stand-in rows)
        states = [st for st in states if any(id(m) in mod_name for m in st._modules)]
        for st in states:
            unit = {"modules": [mod_name[id(m)] for m in st._modules], "params": [], "dtypes": set(),
                    "requires_grad": {}, "reshard_after_forward": None, "param_dtype": None,
                    "shard_size": None}
            for pg in param_groups(st):
                for fp in pg.fsdp_params:
                    sp = fp.sharded_param
                    name = param_name[id(sp)]
                    unit["params"].append(name)
                    unit["dtypes"].add(dtype_name(sp.dtype))
                    unit["requires_grad"][name] = bool(sp.requires_grad)
                unit["reshard_after_forward"] = pg.post_forward_mesh_info is not None
                unit["shard_size"] = pg.mesh_info.shard_mesh_size
                mp = pg.mp_policy.param_dtype
                unit["param_dtype"] = dtype_name(mp) if mp is not None else None
            units.append(unit)
        # every module torch gave an FSDP state belongs to one of the recorded states
        from torch.distributed._composable_state import _get_module_state

        stated = {mod_name[id(m)] for m in root.modules() if isinstance(_get_module_state(m), FSDPState)}
        assert stated == {f for u in units for f in u["modules"]}
    return units, res


def assert_plan_matches_torch(path: str, world_size: int, argv=None):
    res = analyse(path, Settings(world_size=world_size), argv=argv)
    real, _ = torch_units(path, world_size, argv)
    plan, tree = res.plan, res.tree
    assert [u.modules for u in plan.units] == [r["modules"] for r in real]
    for unit, ref in zip(plan.units, real):
        where = f"unit {unit.modules} (line {unit.line})"
        assert unit.params == [tree.canonical(p) for p in ref["params"]], where
        if ref["params"]:
            # the tree holds the parameters as they were when the unit was wrapped
            assert {tree.params[p].dtype for p in unit.params} == ref["dtypes"], where
            for name, rg in ref["requires_grad"].items():
                assert tree.params[tree.canonical(name)].requires_grad == rg, f"{where}: {name}"
            assert unit.param_dtype == ref["param_dtype"], where
        if plan.api == "fsdp1":
            assert plan.use_orig_params == ref["use_orig_params"], where
            assert (plan.sharding_strategy or "FULL_SHARD") == ref["sharding_strategy"], where
        elif ref["params"]:
            assert unit.reshard_after_forward == ref["reshard_after_forward"], where
            assert unit.shard_size == ref["shard_size"], where
    return res, real


# --------------------------------------------------------------------------------------------
# the fixtures
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("path", IDIOMS, ids=lambda p: os.path.relpath(p, ROOT))
def test_idiom_plan_equals_real_torch(path, world_size):
    _needs_hf(path)
    res, real = assert_plan_matches_torch(path, world_size)
    assert res.plan.units, "every fixture wraps something"
    assert res.plan.origin == "file"


@pytest.mark.parametrize("path", BAD, ids=lambda p: os.path.relpath(p, ROOT))
def test_bad_fixture_plan_equals_real_torch_or_torch_rejects_a_planned_wrap_call(path):
    """Mistakes torch accepts (no root wrap, too fine units, ...) still plan exactly as torch builds;
    where torch rejects the wrap (mixed dtypes/requires_grad in one FlatParameter, a container
    unit, ...) it fails in one of the wrap calls of the static plan."""
    from fsdp_lint.replay import ReplayError

    try:
        torch_units(path, 4)
    except ReplayError as exc:
        res = analyse(path, Settings(world_size=4))
        line = int(str(exc).split(":", 2)[1])
        assert line in [ln for _, ln in res.plan.wrap_call_lines], str(exc)
        return
    assert_plan_matches_torch(path, 4)


# --------------------------------------------------------------------------------------------
# variations of the idioms (issue 2 §4), each compared with what torch builds from the same file
# --------------------------------------------------------------------------------------------
MODEL = '''
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d=8, idx=0):
        super().__init__()
        self.idx = idx
        self.attn = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.attn(x))


class Model(nn.Module):
    def __init__(self, n_layers=4, d=8, vocab=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleDict({str(i): Block(d, i) for i in range(n_layers)})
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.layers.values():
            x = block(x)
        return self.out(self.norm(x))
'''

VARIATIONS = {
    # ModuleDict .values(), **config dict, a kwarg computed from the loop variable, a helper called
    # from the __main__ guard with a constructor that returns the model
    "fsdp2_values_config_expr": '''
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(model, world_size):
    mesh = init_device_mesh("cuda", (world_size,))
    fsdp_config = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}
    n = len(model.layers)
    for i, block in enumerate(model.layers.values()):
        fully_shard(block, **fsdp_config, reshard_after_forward=i < n - 1)
    fully_shard(model, **fsdp_config)
    return model


if __name__ == "__main__":
    import os
    model = apply_fsdp(Model(n_layers=3), int(os.environ["WORLD_SIZE"]))
    model.to_empty(device="cuda")
''',
    # model built under torch.device("meta"), a 2-D (HSDP) mesh, a list group, .items()
    "fsdp2_meta_hsdp_list": '''
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
with torch.device("meta"):
    model = Model()
mesh = init_device_mesh("cuda", (2, dist.get_world_size() // 2), mesh_dim_names=("replicate", "shard"))
for name, layer in model.layers.items():
    fully_shard(layer, mesh=mesh)
fully_shard([model.norm, model.out], mesh=mesh, reshard_after_forward=False)
fully_shard(model, mesh=mesh)
model.to_empty(device="cuda")
''',
    # model.modules() + isinstance with an extra condition; no mesh
    "fsdp2_modules_filter": '''
from torch.distributed.fsdp import fully_shard

model = Model(n_layers=5).cuda()
for m in model.modules():
    if isinstance(m, Block) and m.idx % 2 == 0:
        fully_shard(m)
fully_shard(model)
''',
    # FSDP1: ModuleWrapPolicy through a kwargs dict, SHARD_GRAD_OP, fp16 mixed precision,
    # ignored_modules, use_orig_params=False, device_id=torch.cuda.current_device()
    "fsdp1_kwargs_dict": '''
import os
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    model = Model()
    model.embed.requires_grad_(False)
    fsdp_kwargs = dict(
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
        mixed_precision=MixedPrecision(param_dtype=torch.float16),
        use_orig_params=False,
        device_id=torch.cuda.current_device(),
    )
    model = FSDP(model, ignored_modules=[model.embed], **fsdp_kwargs)


if __name__ == "__main__":
    main()
''',
    # FSDP1: manual child wraps in a loop (index assignment), then the root
    "fsdp1_manual_loop": '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = Model(n_layers=3)
for key in list(model.layers.keys()):
    model.layers[key] = FSDP(model.layers[key], device_id=torch.cuda.current_device())
model.out = FSDP(model.out, device_id=torch.cuda.current_device())
model = FSDP(model, device_id=torch.cuda.current_device())
''',
    # FSDP1: lambda policy with a lambda passed inline
    "fsdp1_lambda_inline": '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

model = FSDP(Model(), use_orig_params=True,
             auto_wrap_policy=functools.partial(lambda_auto_wrap_policy,
                                                lambda_fn=lambda m: isinstance(m, Block) and m.idx != 1))
''',
    # FSDP1: size policy whose threshold comes from argparse (defaults apply), bare
    # size_based_auto_wrap_policy for a second model is not what is linted
    "fsdp1_size_argparse": '''
import argparse
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--min-params", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    return parser.parse_args()


def main():
    args = get_args()
    model = Model(n_layers=args.layers)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=args.min_params)
    model = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cuda", 0))


main()
''',
    # functools.partial(fully_shard, ...) called like the API, named_children(), int(layer_id)
    "fsdp2_partial": '''
import functools
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

mesh = init_device_mesh("cuda", (dist.get_world_size(),))
shard = functools.partial(fully_shard, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
model = Model()
for layer_id, block in model.layers.named_children():
    shard(block, reshard_after_forward=int(layer_id) < len(model.layers) - 1)
shard(model)
''',
    # FSDP1: wrap = partial(FSDP, ...) for manual wraps of every layer and the root
    "fsdp1_partial_wrapper": '''
from functools import partial
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

wrap = partial(FSDP, device_id=torch.cuda.current_device(), use_orig_params=True)
model = Model()
for k in model.layers:
    model.layers[k] = wrap(model.layers[k])
model = wrap(model)
''',
    # a method of the model shards it (reversed order), called from main()
    "fsdp2_method": '''
from torch.distributed.fsdp import fully_shard


class Sharded(Model):
    def shard(self, mesh=None):
        for block in reversed(list(self.layers.values())):
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)


def main():
    model = Sharded(n_layers=3)
    model.shard()
    opt = torch.optim.Adam(model.parameters())


main()
''',
    # torchtitan order: activation checkpointing wraps the blocks, then fully_shard
    "fsdp2_ac_before": '''
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing, checkpoint_wrapper)
from torch.distributed.fsdp import fully_shard

model = Model()
apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                               check_fn=lambda m: isinstance(m, Block))
for block in model.layers.values():
    fully_shard(block)
fully_shard(model)
''',
    # HF/accelerate order: FSDP1 first, activation checkpointing of the blocks afterwards
    "fsdp1_ac_after": '''
import functools
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

model = FSDP(Model(), device_id=torch.cuda.current_device(),
             auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}))
apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
optimizer = torch.optim.AdamW(model.parameters())
''',
    # the FSDP module itself imported, a model factory with a config dict, a class-name filter
    "fsdp2_module_attr": '''
import torch.distributed as dist
import torch.distributed.fsdp as fsdp


def build(cfg):
    return Model(**cfg)


if __name__ == "__main__":
    dist.init_process_group(backend="nccl")
    cfg = {"n_layers": 2, "d": 16}
    model = build(cfg)
    for m in list(model.modules()):
        if type(m).__name__ == "Block":
            fsdp.fully_shard(m)
    fsdp.fully_shard(model)
''',
    # FSDP1: bare size_based_auto_wrap_policy (default 1e8 threshold) on a model with a large table
    "fsdp1_size_bare": '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

model = FSDP(Model(n_layers=2), auto_wrap_policy=size_based_auto_wrap_policy)
''',
}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", sorted(VARIATIONS))
def test_variation_plan_equals_real_torch(tmp_path, name, world_size):
    path = tmp_path / f"{name}.py"
    path.write_text(MODEL + VARIATIONS[name])
    res, real = assert_plan_matches_torch(str(path), world_size)
    assert len(res.plan.units) >= 2 or name == "fsdp1_size_bare"


def test_kwargs_from_loop_variable_and_config_dicts_reach_the_plan(tmp_path):
    path = tmp_path / "v.py"
    path.write_text(MODEL + VARIATIONS["fsdp2_values_config_expr"])
    res = analyse(str(path), Settings(world_size=4))
    units = res.plan.units
    assert [u.reshard_after_forward for u in units[:3]] == [True, True, False]
    assert all(u.param_dtype == "bfloat16" for u in units)
    assert all(u.reshard_after_forward_explicit for u in units[:3]) and not units[3].reshard_after_forward_explicit


def test_hsdp_mesh_shards_over_the_last_mesh_dim(tmp_path):
    path = tmp_path / "v.py"
    path.write_text(MODEL + VARIATIONS["fsdp2_meta_hsdp_list"])
    res = analyse(str(path), Settings(world_size=4))
    # torch: FSDPParamGroup.mesh_info.shard_mesh_size is 2 on a (2, 2) mesh
    real, _ = torch_units(str(path), 4)
    assert [u.shard_size for u in res.plan.units if u.params] == [r["shard_size"] for r in real if r["params"]] == [2] * 6


def _line_of(text: str, marker: str) -> int:
    (line,) = [i for i, ln in enumerate(text.splitlines(), start=1) if ln.rstrip().endswith("# " + marker)]
    return line


def test_freezing_and_casts_before_the_wrap_are_in_the_tree_and_the_plan_events(tmp_path):
    text = MODEL + '''
from torch.distributed.fsdp import fully_shard


def build():
    model = Model(n_layers=2)
    model.embed.requires_grad_(False)  # FREEZE-MODULE
    for n, p in model.named_parameters():
        if "mlp" in n:
            p.requires_grad = False  # FREEZE-PARAM
    return model


model = build()
model.out.to(torch.bfloat16)  # CAST-TO
model.layers["0"].half()  # CAST-HALF
model.layers["0"].attn.float()  # CAST-FLOAT
for block in model.layers.values():
    fully_shard(block)
fully_shard(model)
optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
'''
    path = tmp_path / "frozen_cast.py"
    path.write_text(text)
    # the tree at wrap time (requires_grad and dtype of every parameter) equals torch's DTensors
    res, _ = assert_plan_matches_torch(str(path), 2)
    tree, events = res.tree, res.plan.param_events

    def ev(fqn):
        return [(e.kind, e.line, e.value) for e in events.get(fqn, [])]

    freeze_m, freeze_p = _line_of(text, "FREEZE-MODULE"), _line_of(text, "FREEZE-PARAM")
    cast_to, cast_half, cast_float = (_line_of(text, m) for m in ("CAST-TO", "CAST-HALF", "CAST-FLOAT"))
    assert ev("embed.weight") == [("freeze", freeze_m, False)]
    assert ev("layers.0.mlp.0.weight") == [("freeze", freeze_p, False), ("dtype", cast_half, "float16")]
    assert ev("layers.1.mlp.2.bias") == [("freeze", freeze_p, False)]
    assert ev("layers.0.attn.weight") == [("dtype", cast_half, "float16"), ("dtype", cast_float, "float32")]
    assert ev("out.weight") == [("dtype", cast_to, "bfloat16")]
    assert ev("norm.weight") == []
    assert (tree.params["layers.0.mlp.0.weight"].dtype, tree.params["layers.0.mlp.0.weight"].requires_grad) == (
        "float16", False)
    assert tree.params["layers.0.attn.weight"].dtype == "float32"
    # the optimizer holds the trainable parameters only, and is built after the last wrap call
    (opt,) = res.plan.optimizers
    assert opt.line == len(text.splitlines()) and opt.seq > max(u.seq for u in res.plan.units)
    assert set(opt.params) == {p for p, info in tree.params.items() if info.requires_grad}


OPTIMIZER_CASES = {
    "fsdp2": ("from torch.distributed.fsdp import fully_shard",
              "for b in model.layers.values():\n    fully_shard(b)\nfully_shard(model)"),
    "fsdp1-flat": ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
                   "model = FSDP(model, use_orig_params=False)"),
    "fsdp1-orig": ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
                   "model = FSDP(model, use_orig_params=True)"),
}


@pytest.mark.parametrize("before", [True, False], ids=["optimizer-before-wrap", "optimizer-after-wrap"])
@pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
def test_optimizer_order_relative_to_the_wrap(tmp_path, case, before):
    """plan.optimizers says where the optimizer was built relative to the wrap calls; torch says
    what that means: built before FSDP2 / FSDP1 with flat parameters, it holds tensors that are no
    longer the model's parameters (FSD501's premise); FSDP1 with use_orig_params=True keeps them."""
    imports, wrap = OPTIMIZER_CASES[case]
    opt = "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # OPTIMIZER"
    text = MODEL + f"\n{imports}\n\nmodel = Model(n_layers=2)\n" + (
        f"{opt}\n{wrap}\n" if before else f"{wrap}\n{opt}\n")
    path = tmp_path / "opt.py"
    path.write_text(text)
    res, _ = assert_plan_matches_torch(str(path), 2)
    (info,) = res.plan.optimizers
    assert info.line == _line_of(text, "OPTIMIZER")
    assert (info.seq < min(u.seq for u in res.plan.units)) == before
    assert (info.seq > max(u.seq for u in res.plan.units)) == (not before)
    assert len(info.params) == len(res.tree.params) and info.foreign == 0

    real = replay(read_source(str(path)), 2, real=True)
    held = {id(p) for g in real.optimizers[0].obj.param_groups for p in g["params"]}
    models = {id(p) for p in real.model.parameters()}
    stale = not held <= models
    assert stale == (before and case != "fsdp1-orig")
