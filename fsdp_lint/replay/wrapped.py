"""A model wrapped for real (FSDP1 units, FSDP2 groups), read back as the records of a replay.

`lint_module` lints what torch built: the units are the ``FullyShardedDataParallel`` instances / FSDP2
states found in the model, in application order (post-order: children before their parents), with the
options each one was built with. FSDP2 keeps the user's modules and parameters (DTensors with their
global shapes), so the model is read as it is. FSDP1 replaces modules by wrappers and parameters by
FlatParameters: the unwrapped model is rebuilt on the meta device from the FlatParameters' metadata
(each original parameter's FQN, shape, dtype, ``requires_grad``, and which parameters are shared).
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List

from fsdp_lint.replay.records import Position, ReplayResult, WrapCall


def read_wrapped(model, world_size: int, path: str) -> ReplayResult:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if any(isinstance(m, FSDP) for m in model.modules()):
        return _read_fsdp1(model, world_size, path)
    return _read_fsdp2(model, world_size, path)


def _post_order(module, visit) -> None:
    for child in module.children():
        _post_order(child, visit)
    visit(module)


def _result(model, calls, world_size, path) -> ReplayResult:
    return ReplayResult(model=model, target=f"lint_module({type(model).__name__})", wrap_calls=calls, optimizers=[],
                        param_events=[], skipped=[], world_size=world_size, mesh_sizes=[])


def _read_fsdp2(model, world_size: int, path: str) -> ReplayResult:
    from torch.distributed._composable_state import _get_module_state
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    calls: List[WrapCall] = []
    seq = itertools.count()
    seen = set()

    def visit(module):
        state = _get_module_state(module)
        if not isinstance(state, FSDPState) or id(state) in seen or state._modules[0] is not module:
            return
        seen.add(id(state))
        kwargs: Dict[str, Any] = {}
        group = state._fsdp_param_group
        if group is not None:
            kwargs = {"mesh": group.mesh_info.mesh, "mp_policy": group.mp_policy,
                      "reshard_after_forward": group.post_forward_mesh_info is not None}
        calls.append(WrapCall("fsdp2", next(seq), list(state._modules), kwargs, Position(path, 0)))

    _post_order(model, visit)
    if not calls:
        raise ValueError(f"{type(model).__name__} is not wrapped with FSDP (no FullyShardedDataParallel unit, "
                         f"no fully_shard group)")
    return _result(model, calls, world_size, path)


def _read_fsdp1(model, world_size: int, path: str) -> ReplayResult:
    """The unwrapped model rebuilt on meta (each module an instance of its own class), one call per unit."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    shells: Dict[int, nn.Module] = {}
    flattened: Dict[int, set] = {}          # id(original module) -> names of its flattened params
    originals: Dict[int, Any] = {}          # id(FlatParameter source) -> meta Parameter (shared identity)

    def inner(m):
        while isinstance(m, FSDP):
            m = m._fsdp_wrapped_module
        return m

    for inst in FSDP.fsdp_modules(model):
        handle = inst._handle
        if handle is None:
            continue
        fp = handle.flat_param
        for info in fp._param_infos:
            flattened.setdefault(id(info.module), set()).add(info.param_name)
        for info in fp._shared_param_infos:
            flattened.setdefault(id(info.module), set()).add(info.param_name)

    def shell(m):
        m = inner(m)
        if id(m) in shells:
            return shells[id(m)]
        new = type(m).__new__(type(m))
        nn.Module.__init__(new)
        shells[id(m)] = new
        for name, child in m._modules.items():
            if child is not None:
                new._modules[name] = shell(child)
        for name, p in m._parameters.items():
            if p is None or name in flattened.get(id(m), ()) or name == "_flat_param":
                continue
            if id(p) not in originals:
                originals[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                                requires_grad=p.requires_grad)
            new._parameters[name] = originals[id(p)]
        return new

    root = shell(model)
    for inst in FSDP.fsdp_modules(model):
        handle = inst._handle
        if handle is None:
            continue
        fp = handle.flat_param
        params = []
        for i, (info, shape) in enumerate(zip(fp._param_infos, fp._shapes)):
            rg = fp._params[i].requires_grad if getattr(fp, "_params", None) is not None else fp.requires_grad
            p = nn.Parameter(torch.empty(shape, dtype=fp.dtype, device="meta"), requires_grad=bool(rg))
            shells[id(info.module)]._parameters[info.param_name] = p
            params.append(p)
        for info in fp._shared_param_infos:
            prim = shells[id(info.prim_module)]._parameters[info.prim_param_name]
            shells[id(info.module)]._parameters[info.param_name] = prim
    # parameter registration order: as in the original modules
    for m in [model] + [x for x in model.modules()]:
        m = inner(m)
        s = shells.get(id(m))
        if s is None:
            continue
        order = [n for n in m._parameters if n != "_flat_param"]
        names = list(dict.fromkeys(order + [n for n in s._parameters if n not in order]))
        s._parameters = {n: s._parameters[n] for n in names if n in s._parameters}

    calls: List[WrapCall] = []
    seq = itertools.count()

    def visit(m):
        if isinstance(m, FSDP):
            kwargs = {"use_orig_params": m._use_orig_params, "sharding_strategy": m.sharding_strategy,
                      "mixed_precision": m.mixed_precision,
                      "ignored_modules": [shells[id(x)] for x in getattr(m, "_ignored_modules", ()) if id(x) in shells]}
            calls.append(WrapCall("fsdp1", next(seq), [shells[id(inner(m))]], kwargs, Position(path, 0)))

    _post_order(model, visit)
    return _result(root, calls, world_size, path)
