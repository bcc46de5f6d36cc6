"""Ground truth for multi-dimensional plans: what torch builds with a device mesh of several dims.

Runs real torch under the fake process group as any rank of any world size: ``init_device_mesh``
on CPU, then the wrap code under test (tensor parallelism with ``parallelize_module`` before
``fully_shard``, HSDP meshes, FSDP1 ``HYBRID_SHARD`` with a device mesh or process groups), and reads
back what torch built:

``fsdp2_nd(model_fn, wrap, *, world_size, rank, mesh_shape, mesh_dim_names)``
    one dict per ``fully_shard`` call (``FSDPState``, init order): ``modules`` and ``params``, each
    param with ``fqn``, global ``shape``, this rank's ``local_shape``, ``padded_local_shape`` (what
    the all-gather moves), ``placements`` (``repr`` of the sharded DTensor's placements, as torch
    prints them) and ``mesh_dims`` (the sharded DTensor's mesh dim names).
``step_collectives(model_fn, wrap, input_fn, *, world_size, rank, mesh_shape, mesh_dim_names)``
    one real forward + backward on CPU; every collective torch issued, in order, as
    ``(kind, group_size, tensor_bytes, source, full_numel)``: ``kind`` all_gather / reduce_scatter /
    all_reduce / all_to_all, ``tensor_bytes`` the bytes of the *sharded* side (all-gather input,
    reduce-scatter output, all-reduce tensor), ``source`` ``"c10d"`` (FSDP's process-group calls) or
    ``"functional"`` (DTensor's collectives: tensor parallelism), ``full_numel`` (functional only) the
    elements of the unsharded tensor.

``wrap(model, world_mesh)`` runs the wrap code (the same statements the linted file runs).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, List, Tuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from oracle import _record_calls, cpu_stream_events, fake_pg, param_groups


def _clear_dtensor_caches() -> None:
    """DTensor caches sharding decisions keyed by meshes that compare by value: a run under a new fake
    process group must not reuse the groups of a destroyed one."""
    from torch.distributed.tensor import DTensor, _redistribute

    if hasattr(torch._C, "_clear_DTensor_sharding_propagator_cache"):
        torch._C._clear_DTensor_sharding_propagator_cache()
    prop = DTensor._op_dispatcher.sharding_propagator
    # torch 2.6/2.9: a LocalLRUCache without cache_clear (its lru_cache is .cache) and the meta cache
    # named _propagate_tensor_meta; no redistribute planner cache
    op_cache = prop.propagate_op_sharding
    (op_cache.cache_clear if hasattr(op_cache, "cache_clear") else op_cache.cache.cache_clear)()
    (getattr(prop, "_propagate_tensor_meta_cached", None) or prop._propagate_tensor_meta).cache_clear()
    if hasattr(_redistribute, "clear_redistribute_planner_cache"):
        _redistribute.clear_redistribute_planner_cache()
    _redistribute._gen_transform_infos.cache_clear()


def _mesh(mesh_shape, mesh_dim_names):
    _clear_dtensor_caches()
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=tuple(mesh_dim_names) if mesh_dim_names else None)


def fsdp2_nd(model_fn: Callable[[], Any], wrap: Callable[[Any, Any], Any], *, world_size: int, rank: int,
             mesh_shape, mesh_dim_names) -> List[dict]:
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    states: list = []
    with fake_pg(world_size, rank), _record_calls(FSDPState, "init", states), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = _mesh(mesh_shape, mesh_dim_names)
        with torch.device("meta"):
            model = model_fn()
        wrap(model, mesh)
        mod_name = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        param_name: dict = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            param_name.setdefault(id(p), n)
        groups = []
        for st in states:
            params = []
            for pg in param_groups(st):
                for fp in pg.fsdp_params:
                    sp = fp.sharded_param
                    params.append({
                        "fqn": param_name.get(id(sp), "?"),
                        "shape": list(sp.shape),
                        "local_shape": list(sp.to_local().shape),
                        "padded_local_shape": list(fp.padded_sharded_param_size),
                        "placements": [repr(p) for p in sp.placements],
                        "mesh_dims": list(sp.device_mesh.mesh_dim_names or ()),
                    })
            groups.append({"modules": [mod_name.get(id(m), "?") for m in st._modules], "params": params})
    return groups


def _group_size(obj) -> int:
    if isinstance(obj, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(obj).size()
    return dist.ProcessGroup.unbox(obj).size()


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


class _Collectives(TorchDispatchMode):
    """Every c10d / functional collective issued while active: (kind, group size, bytes, source, numel)."""

    def __init__(self):
        super().__init__()
        self.log: List[Tuple[str, int, int, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = getattr(func, "namespace", "")
        if ns in ("c10d", "_c10d_functional"):
            name = func._schema.name.split("::")[1]
            entry = self._entry(name, ns, args)
            if entry is not None:
                self.log.append(entry)
        return func(*args, **kwargs)

    @staticmethod
    def _entry(name: str, ns: str, args):
        if name.startswith(("wait", "_wrap", "barrier", "monitored")):
            return None
        size = 1
        for a in reversed(args):            # the group: a ScriptObject (c10d) or its name (functional)
            if isinstance(a, str) or type(a).__name__ == "ScriptObject":
                try:
                    size = _group_size(a)
                    break
                except Exception:           # a reduce op ("sum"), not a group name
                    continue
        if "all_to_all" in name or "alltoall" in name:
            kind = "all_to_all"
        elif "gather" in name:
            kind = "all_gather"
        elif "reduce_scatter" in name:
            kind = "reduce_scatter"
        elif "allreduce" in name or "all_reduce" in name:
            kind = "all_reduce"
        else:
            kind = name
        if ns == "_c10d_functional":
            tensor = _nbytes(args[0])              # the local input (gather) / full input (scatter, reduce)
            if kind == "reduce_scatter":
                tensor //= size
            # elements of the unsharded tensor (gathered output, scattered input, reduced tensor)
            full = args[0].numel() * (size if kind == "all_gather" else 1)
            return kind, size, tensor, "functional", full
        if kind == "all_gather":
            tensor = _nbytes(args[1])              # (output, input, ...) or (outputs, inputs, ...)
        elif kind == "reduce_scatter":
            tensor = _nbytes(args[0])
        else:
            tensor = _nbytes(args[0])
        return kind, size, tensor, "c10d", 0


def step_collectives(model_fn, wrap, input_fn, *, world_size: int, rank: int, mesh_shape, mesh_dim_names,
                     fsdp1: bool = False) -> List[Tuple[str, int, int, str, int]]:
    """One forward + backward of a CPU model (seeded) after `wrap`; the collectives, in order."""
    with fake_pg(world_size, rank), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = _mesh(mesh_shape, mesh_dim_names) if mesh_shape else None
        torch.manual_seed(0)
        model = model_fn()
        model = wrap(model, mesh) or model
        inputs = input_fn()
        counter = _Collectives()
        with counter, cpu_stream_events():
            out = model(inputs)
            out.float().sum().backward()
    return counter.log


@contextlib.contextmanager
def device_count(n: int):
    """FSDP1 HYBRID_SHARD without process groups takes the node size from the device handle's
    ``device_count()``; on CPU that is ``torch.cpu.device_count()``: set it for a test."""
    import torch.cpu

    real = torch.cpu.device_count
    torch.cpu.device_count = lambda: n
    try:
        yield
    finally:
        torch.cpu.device_count = real
