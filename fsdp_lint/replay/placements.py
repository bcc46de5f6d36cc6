"""Reading torch's meshes, process groups and DTensor placements into plain data, and asking torch's
own checks what it raises for a layout (`fsdp_lint.replay.parallel` records with these)."""
from __future__ import annotations

import contextlib
from typing import List, Optional

from fsdp_lint.model.mesh import MeshInfo, TPStyle

_KNOWN_STYLES = ("ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
                 "PrepareModuleOutput", "PrepareModuleInputOutput")
# --------------------------------------------------------------------------------------------
# torch's own checks and descriptions
# --------------------------------------------------------------------------------------------
def _root_mesh(mesh):
    getter = getattr(mesh, "_get_root_mesh", None)
    if getter is not None:
        with contextlib.suppress(Exception):
            return getter() or mesh
    with contextlib.suppress(Exception):
        from torch.distributed.device_mesh import _mesh_resources

        return _mesh_resources.get_root_mesh(mesh) or mesh
    return mesh


def _group_ranks(pg) -> Optional[List[int]]:
    try:
        from torch.distributed import distributed_c10d as c10d

        return [int(r) for r in c10d.get_process_group_ranks(pg)]
    except Exception:
        return None


def _is_dtensor(p) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # pragma: no cover
        return False
    return isinstance(p, DTensor)


def _placement(p) -> Optional[tuple]:
    name = type(p).__name__
    if name == "_StridedShard":
        return ("SS", int(p.dim), int(p.split_factor))
    if name == "Shard":
        return ("S", int(p.dim))
    if name == "Replicate":
        return ("R",)
    if name == "Partial":
        return ("P", getattr(p, "reduce_op", "sum"))
    return None


def _describe_style(module, style, mesh: MeshInfo, pos) -> TPStyle:
    names = [c.__name__ for c in type(style).__mro__]
    known = next((n for n in names if n in _KNOWN_STYLES), "")
    if known == "SequenceParallel":
        inputs = tuple(getattr(style, "sequence_sharding", ()) or ())
        outputs = inputs
        desired = inputs
    elif known == "PrepareModuleInputOutput":
        inner_in = getattr(style, "prepare_module_input", None)
        inner_out = getattr(style, "prepare_module_output", None)
        inputs = tuple(getattr(inner_in, "input_layouts", ()) or ())
        desired = tuple(getattr(inner_in, "desired_input_layouts", ()) or ())
        outputs = tuple(getattr(inner_out, "output_layouts", ()) or ())
        desired = desired + tuple(getattr(inner_out, "desired_output_layouts", ()) or ())
    else:
        inputs = tuple(getattr(style, "input_layouts", ()) or ())
        outputs = tuple(getattr(style, "output_layouts", ()) or ())
        desired = tuple(getattr(style, "desired_input_layouts", ()) or ())
        if known == "PrepareModuleOutput":
            desired = tuple(getattr(style, "desired_output_layouts", ()) or ())

    def conv(layouts):
        return tuple(None if x is None else (_placement(x) or ("?",)) for x in layouts)

    in_f = getattr(module, "in_features", None) or getattr(module, "num_embeddings", None)
    out_f = getattr(module, "out_features", None) or getattr(module, "embedding_dim", None)
    params = [(n, int(p.numel()), str(p.dtype).replace("torch.", "")) for n, p in module.named_parameters()]
    return TPStyle(module="", style=type(style).__name__, known=known, mesh=mesh, path=pos.path, line=pos.line,
                   input_layouts=conv(inputs), output_layouts=conv(outputs), desired_input_layouts=conv(desired),
                   use_local_output=bool(getattr(style, "use_local_output", True)),
                   module_cls=type(module).__name__, in_features=in_f, out_features=out_f, param_numels=params)


def _validate_fsdp2_mesh(mesh) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    validate = getattr(_fsdp_init, "_validate_mesh", None)
    if validate is None:
        raise ValueError(f"fully_shard expects a 1D or 2D DeviceMesh but got {mesh}")
    try:
        validate(mesh)
    except TypeError:
        validate(mesh, None)


def _torch_message(fn, fallback: str) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return fallback


def fsdp_param_source() -> str:
    """The installed torch's ``FSDPParam`` source: which checks it makes on TP parameters and the
    words of their messages differ between versions (read once, so the replay follows that torch)."""
    global _FSDP_PARAM_SOURCE
    if _FSDP_PARAM_SOURCE is None:
        try:
            import inspect

            from torch.distributed.fsdp._fully_shard import _fsdp_param

            _FSDP_PARAM_SOURCE = inspect.getsource(_fsdp_param)
        except Exception:   # noqa: BLE001 - no source: the newest torch's behaviour
            _FSDP_PARAM_SOURCE = ""
    return _FSDP_PARAM_SOURCE


_FSDP_PARAM_SOURCE: Optional[str] = None


def reshard_int_dtensor_error() -> str:
    """What ``reshard_after_forward=<int>`` on DTensor parameters raises (torch 2.13: "... for
    DTensor parameters yet"; 2.6-2.11: "... with TP is not supported yet")."""
    if "Resharding to smaller mesh with TP is not supported yet" in fsdp_param_source():
        return "NotImplementedError: Resharding to smaller mesh with TP is not supported yet"
    return "NotImplementedError: Resharding to smaller mesh is not supported for DTensor parameters yet"


def _uneven_fsdp_tp_error(dp_mesh, param) -> Optional[str]:
    """torch 2.6 (no ``DeviceMesh._concatenate``, its check in FSDPParam): FSDP's dim-0 shard on a TP ``Shard(0)``
    parameter must split dim 0 evenly over DP x TP shards, else ``NotImplementedError``."""
    if "does not support uneven sharding for now" not in fsdp_param_source():    # torch 2.6, not 2.9
        return None
    split = param._spec.num_shards_map[0]
    if split <= 1:
        return None
    num_shards = split * (dp_mesh.size(dp_mesh.ndim - 1) if dp_mesh.ndim else 1)
    if param.shape[0] % num_shards == 0:
        return None
    return (f"NotImplementedError: FSDP+TP sharding does not support uneven sharding for now: tensor dim 0 has size "
            f"{param.shape[0]} which cannot be evenly sharded into {num_shards} shards.")


def _concatenate_error(dp_mesh, tp_mesh, n_placements: int, param=None) -> Optional[str]:
    """The error FSDP2 raises when it combines its data-parallel mesh with a TP/EP parameter's mesh,
    or None. torch >= 2.9 concatenates the two meshes (``DeviceMesh._concatenate``); before, it
    compared their root meshes."""
    from fsdp_lint.replay.recorders import FakeMesh

    if isinstance(dp_mesh, FakeMesh) or isinstance(tp_mesh, FakeMesh):
        return None
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    with torch._C.DisableTorchFunction():
        concat = getattr(DeviceMesh, "_concatenate", None)
        if concat is not None:
            try:
                spmd = concat([dp_mesh, tp_mesh])
            except Exception as exc:
                return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
            if n_placements > 2:
                return f"NotImplementedError: FSDP only supports 1D TP/EP or 2D EP+TP, not {n_placements} placements"
            if not 2 <= spmd.ndim <= 4:
                return (f"AssertionError: _spmd_mesh.ndim can only be 2 (FSDP+TP/EP), 3 (FSDP+EP+TP, HSDP+TP/EP), "
                        f"or 4 (HSDP+EP+TP) but got {spmd.ndim}.")
            return None
        if _root_mesh(dp_mesh) is not _root_mesh(tp_mesh):
            meshes = "DP and TP mesh" if "DP and TP mesh" in fsdp_param_source() else "DP and model parallel TP/EP mesh"
            return (f"AssertionError: FSDP requires the {meshes} to have the same parent mesh but got: \n"
                    f"DP's global mesh: {_root_mesh(dp_mesh)}\nTP's global mesh: {_root_mesh(tp_mesh)}").splitlines()[0]
        names = (dp_mesh.mesh_dim_names or ()) + (tp_mesh.mesh_dim_names or ())
        if dp_mesh.mesh_dim_names and tp_mesh.mesh_dim_names:
            try:        # torch 2.6/2.9 slice the SPMD mesh out of the root by the two meshes' names
                _root_mesh(dp_mesh)[names]
            except Exception as exc:   # noqa: BLE001 - torch's own error is the finding
                return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        return _uneven_fsdp_tp_error(dp_mesh, param) if param is not None else None


# --------------------------------------------------------------------------------------------
# FSDP2's SPMD path: fully_shard(mesh=<the full mesh>, dp_mesh_dims=DataParallelMeshDims(...))
# --------------------------------------------------------------------------------------------
def spmd_managed_params(modules) -> list:
    """The parameters a ``fully_shard`` call manages: those of its modules, not of sub-modules an
    earlier call wrapped (torch's ``_get_managed_states``), each once, in registration order."""
    out, seen, stack = [], set(), list(reversed(list(modules)))
    roots = {id(m) for m in modules}
    while stack:
        m = stack.pop()
        if id(m) not in roots and "_fsdp_lint_call" in m.__dict__:
            continue
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        stack.extend(reversed([c for c in m._modules.values() if c is not None]))
    return out


def spmd_error(modules, kwargs) -> Optional[BaseException]:
    """What ``fully_shard(..., dp_mesh_dims=...)`` raises for this call, or None: torch's own mesh
    checks (``_validate_mesh``), an int ``reshard_after_forward``, and per parameter what
    ``FSDPParam._init_sharding_spec`` requires (a DTensor on the very mesh passed, ``Replicate()`` on
    every data-parallel dimension)."""
    from torch.distributed.device_mesh import DeviceMesh

    dims, mesh = kwargs.get("dp_mesh_dims"), kwargs.get("mesh")
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    shard = tuple(getattr(dims, "shard_names", ()) or ())
    replicate = tuple(getattr(dims, "replicate_names", ()) or ())
    if not shard and not replicate:
        return ValueError("At least one of shard or replicate must be set in dp_mesh_dims")
    if not names:
        return ValueError("mesh must have mesh_dim_names when dp_mesh_dims is provided")
    for name in shard + replicate:
        if name not in names:
            return ValueError(f"Mesh dim name '{name}' not found in mesh.mesh_dim_names {names}")
    raf = kwargs.get("reshard_after_forward")
    if shard and isinstance(raf, int) and not isinstance(raf, bool):
        return NotImplementedError("reshard_after_forward as int is not yet supported with SPMD mesh (dp_mesh_dims)")
    if not isinstance(mesh, DeviceMesh):     # fsdp-lint's stand-in for a helper's mesh: no parameters on it
        return None
    ignored = {id(p) for p in (kwargs.get("ignored_params") or ())}
    for p in spmd_managed_params(modules):
        if id(p) in ignored:
            continue
        if not _is_dtensor(p):
            return ValueError("When dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh "
                              "(e.g. via distribute_module). Got plain tensor for parameter "
                              f"'{_param_name(modules, p)}'.")
        if p.device_mesh is not mesh:
            return ValueError("Expected param's DTensor mesh to be the same mesh passed to fully_shard, but got "
                              "different mesh objects")
        for kind, group in (("shard", shard), ("replicate", replicate)):
            for name in group:
                idx = names.index(name)
                if type(p.placements[idx]).__name__ != "Replicate":
                    return ValueError(f"Expected Replicate() on DP {kind} dim '{name}' (index {idx}) but got "
                                      f"{p.placements[idx]}")
    return None


def _param_name(modules, param) -> str:
    for m in modules:
        for name, p in m.named_parameters():
            if p is param:
                return name.rsplit(".", 1)[-1]
    return "?"
