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
from fsdp_lint.source import read_source

sys.path.insert(0, os.path.dirname(__file__))
from oracle import _record_calls, dtype_name, strip_wrapper_prefixes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDIOMS = sorted(glob.glob(os.path.join(ROOT, "fixtures", "idioms", "*.py"))) + [
    os.path.join(ROOT, "fixtures", "article_fsdp1.py"),
    os.path.join(ROOT, "fixtures", "article_fsdp2.py"),
]
BAD = sorted(glob.glob(os.path.join(ROOT, "fixtures", "bad", "*.py")))
HF = {"hf_llama_fsdp2.py", "peft_lora_fsdp1.py"}


def _needs_hf(path):
    if os.path.basename(path) in HF:
        pytest.importorskip("transformers")
        pytest.importorskip("peft")


# --------------------------------------------------------------------------------------------
# what torch built
# --------------------------------------------------------------------------------------------
def torch_units(path: str, world_size: int) -> tuple[list[dict], object]:
    """Replay `path` with the real FSDP APIs; describe every unit torch built, in application order."""
    inits: list = []
    states: list = []
    facts = read_source(path)
    with _record_calls(FSDP, "__init__", inits), _record_calls(FSDPState, "init", states):
        res = replay(facts, world_size, real=True)
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
        for st in states:
            unit = {"modules": [mod_name[id(m)] for m in st._modules], "params": [], "dtypes": set(),
                    "requires_grad": {}, "reshard_after_forward": None, "param_dtype": None}
            for pg in st._fsdp_param_groups:
                for fp in pg.fsdp_params:
                    sp = fp.sharded_param
                    name = param_name[id(sp)]
                    unit["params"].append(name)
                    unit["dtypes"].add(dtype_name(sp.dtype))
                    unit["requires_grad"][name] = bool(sp.requires_grad)
                unit["reshard_after_forward"] = pg.post_forward_mesh_info is not None
                mp = pg.mp_policy.param_dtype
                unit["param_dtype"] = dtype_name(mp) if mp is not None else None
            units.append(unit)
        # every module torch gave an FSDP state belongs to one of the recorded states
        from torch.distributed._composable_state import _get_module_state

        stated = {mod_name[id(m)] for m in root.modules() if isinstance(_get_module_state(m), FSDPState)}
        assert stated == {f for u in units for f in u["modules"]}
    return units, res


def assert_plan_matches_torch(path: str, world_size: int):
    res = analyse(path, Settings(world_size=world_size))
    real, _ = torch_units(path, world_size)
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
