"""Ground truth for fsdp-lint's layout arithmetic: what torch *really* builds.

Builds a model with the real PyTorch FSDP1 (``FullyShardedDataParallel``) or FSDP2
(``fully_shard``) under the *fake* process group (one process, no communication,
any rank / world size) and returns what torch built as plain dicts, so tests can
compare fsdp-lint's static arithmetic against torch itself (DESIGN.md §5).

API
---
``fake_pg(world_size, rank=0)``
    context manager: a fake default process group for this process; destroyed on
    exit, so calls can be repeated in one process with other ranks/world sizes.
``fsdp1_units(model_fn, *, world_size, rank=0, apply=None, **fsdp_kwargs)``
    one dict per FSDP1 unit that owns a FlatParameter, in application order.
``fsdp2_groups(model_fn, *, world_size, rank=0, apply)``
    one dict per ``fully_shard`` call, in call order.
``raises(fn)``
    run ``fn()``; return the exception it raised, or ``None``.
``cpu_stream_events()``
    context manager: on a torch whose CPU stream lacks ``record_event``/``wait_event`` (2.6),
    those two as the no-ops later torch has, so that a real FSDP2 step runs on CPU.

Everything torch-internal that is read here (``FlatParameter`` metadata, FSDP2
``FSDPState``/``FSDPParamGroup``) is private API; it is pinned to torch 2.13 and
only read, never changed (the only patches are order recorders, undone on exit).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

# Importing this module registers the "fake" backend with torch.distributed.
from torch.testing._internal.distributed.fake_pg import FakeStore

__all__ = [
    "fake_pg",
    "fsdp1_units",
    "fsdp2_groups",
    "raises",
    "cpu_stream_events",
    "strip_wrapper_prefixes",
    "dtype_name",
]

# Pieces that wrappers insert into module/parameter FQNs.
_WRAPPER_PIECES = (
    "_fsdp_wrapped_module",
    "_checkpoint_wrapped_module",
    "_fpw_module",
)


def strip_wrapper_prefixes(fqn: str) -> str:
    """``_fsdp_wrapped_module.layers.0._fsdp_wrapped_module`` -> ``layers.0``."""
    return ".".join(p for p in fqn.split(".") if p and p not in _WRAPPER_PIECES)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def raises(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn()``; return the exception it raised (any ``Exception``), else ``None``."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - that is the point
        return e
    return None


@contextlib.contextmanager
def cpu_stream_events() -> Iterator[None]:
    """FSDP2 records an event on its all-gather stream after each collective. On a GPU node that is a
    CUDA stream event; on CPU, torch 2.9 and later make ``torch.cpu.Stream.record_event``/``wait_event``
    no-ops (one stream, nothing to wait for), torch 2.6 has neither and its first forward raises
    ``'Stream' object has no attribute 'record_event'``, and torch 2.7's HSDP backward asserts the event
    its no-op returns is not None. Set here as fsdp-lint's ``--simulate`` and ``--run`` set them
    (``fsdp_lint.run.compat``; nothing else of torch changes), restored on exit; on a torch that needs
    nothing, nothing is done. Yields whether it added methods this torch lacks."""
    import torch.cpu

    from fsdp_lint.run.compat import cpu_stream_patches

    patches = cpu_stream_patches()
    saved = {name: torch.cpu.Stream.__dict__[name] for name in patches if name in torch.cpu.Stream.__dict__}
    added = [name for name in patches if not hasattr(torch.cpu.Stream, name)]
    for name, fn in patches.items():
        setattr(torch.cpu.Stream, name, fn)
    try:
        yield bool(added)
    finally:
        for name in patches:
            if name in saved:
                setattr(torch.cpu.Stream, name, saved[name])
            else:
                delattr(torch.cpu.Stream, name)


@contextlib.contextmanager
def fake_pg(world_size: int, rank: int = 0) -> Iterator[dist.ProcessGroup]:
    """A fake default process group of ``world_size`` ranks, as ``rank``.

    Collectives are no-ops (data is wrong, shapes are right). The group is
    destroyed on exit, also when the body raises.
    """
    if dist.is_initialized():
        raise RuntimeError("a default process group is already initialized")
    _forget_meshes()          # also those of an fsdp-lint replay in this process
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """torch 2.6-2.9 keep each root mesh's sub-meshes and flattened meshes in a global
    (``device_mesh._mesh_resources``), keyed by meshes that compare by value: a mesh of the next fake
    process group equal to one of this group found this group's sub-meshes, whose process groups are
    gone (``Invariant encountered``, ``Could not resolve the process group``). Emptied with the group;
    later torch keeps them on the mesh itself."""
    from torch.distributed import device_mesh

    env = getattr(device_mesh, "_mesh_resources", None)
    for name in ("child_to_root_mapping", "root_to_flatten_mapping", "flatten_name_to_root_dims"):
        mapping = getattr(env, name, None)
        if isinstance(mapping, dict):
            mapping.clear()


@contextlib.contextmanager
def _record_calls(cls: type, method: str, sink: list) -> Iterator[None]:
    """Append ``self`` to ``sink`` each time ``cls.method`` returns normally."""
    orig = cls.__dict__[method]

    def wrapper(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        sink.append(self)
        return out

    setattr(cls, method, wrapper)
    try:
        yield
    finally:
        setattr(cls, method, orig)


# --------------------------------------------------------------------- FSDP1


def fsdp1_units(
    model_fn: Callable[[], nn.Module],
    *,
    world_size: int,
    rank: int = 0,
    apply: Callable[[nn.Module, type], nn.Module] | None = None,
    **fsdp_kwargs: Any,
) -> list[dict]:
    """Wrap ``model_fn()`` (built on CPU) with FSDP1 and describe every FlatParameter.

    ``apply(model, FSDP)`` returns the wrapped root (manual nested wraps); without it
    the root is ``FSDP(model, device_id=cpu, **fsdp_kwargs)``.

    Returns one dict per FSDP unit *that owns a FlatParameter*, in application order
    (the order the units' FlatParameters were built: children before parents, root
    last for auto-wrap; the real call order for manual wraps). Units whose module has
    no parameter of its own left (no FlatParameter, ``_handle is None``) are omitted.
    Each dict::

        module        FQN of the unit's module in the unwrapped model ("" = root)
        params        FQNs (unwrapped naming) of the params, FlatParameter order
                      (= the unit module's named_parameters() order, minus params
                      of nested units); a tied parameter once, under its first name
        numel         sum of the params' numels (no padding)
        padded_numel  numel of the unsharded flat param incl. alignment padding,
                      world-size padding and shard padding (= shard_numel *
                      world_size for sharded strategies, = flat numel for NO_SHARD)
        shard_numel   numel of this rank's (padded) shard = local flat param numel
        spans         [[fqn, start, end), ...] intra-param element ranges on this rank
        dtype         dtype of the flat param, e.g. "float32"
        requires_grad bool, flat param's requires_grad (OR over the params)

    Extra keys: ``layout`` = [[fqn or None (padding), numel], ...] for the whole
    unsharded flat param (``_numels_with_padding``; excludes the shard padding that
    ``use_orig_params=False`` adds at sharding time), ``unpadded_numel`` (its sum =
    ``_unpadded_unsharded_size``), ``shard_padding`` (``_shard_numel_padded``: zeros
    at the end of *this rank's* shard) and ``sharding_strategy`` (e.g. "NO_SHARD").
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    cpu = torch.device("cpu")
    handles: list = []
    with fake_pg(world_size, rank), _record_calls(FlatParamHandle, "__init__", handles):
        model = model_fn()
        if apply is not None:
            root = apply(model, FSDP)
        else:
            fsdp_kwargs.setdefault("device_id", cpu)
            root = FSDP(model, **fsdp_kwargs)

        handle_to_name: dict[int, str] = {}
        strategy_of: dict[int, str] = {}
        for name, mod in root.named_modules():
            if isinstance(mod, FSDP) and mod._handle is not None:
                handle_to_name[id(mod._handle)] = strip_wrapper_prefixes(name)
                strategy_of[id(mod._handle)] = mod.sharding_strategy.name

        units = []
        for h in handles:
            if id(h) not in handle_to_name:  # built but not part of the final tree
                continue
            units.append(_describe_flat_param(h, handle_to_name[id(h)], strategy_of[id(h)]))
    return units


def _describe_flat_param(handle, module_fqn: str, strategy: str) -> dict:
    fp = handle.flat_param
    prefix = module_fqn + "." if module_fqn else ""
    fqns = [prefix + strip_wrapper_prefixes(f) for f in fp._fqns]
    layout: list[list] = []
    it = iter(fqns)
    for numel, is_pad in zip(fp._numels_with_padding, fp._is_padding_mask):
        layout.append([None if is_pad else next(it), int(numel)])
    spans = [
        [fqn, int(info.intra_param_start_idx), int(info.intra_param_end_idx) + 1]
        for fqn, info in zip(fqns, fp._shard_param_infos)
        if info.in_shard
    ]
    shard_numel = int(fp.numel())  # the local (sharded) flat param
    unpadded = int(fp._unpadded_unsharded_size.numel())
    sharded = handle.uses_sharded_strategy
    return {
        "module": module_fqn,
        "params": fqns,
        "numel": int(sum(fp._numels)),
        # = _padded_unsharded_size, which torch only sets at lazy init (first forward)
        "padded_numel": shard_numel * handle.world_size if sharded else unpadded,
        "shard_numel": shard_numel,
        "spans": spans,
        "dtype": dtype_name(fp.dtype),
        "requires_grad": bool(fp.requires_grad),
        # extras
        "layout": layout,
        "unpadded_numel": unpadded,
        "shard_padding": int(fp._shard_numel_padded),
        "sharding_strategy": strategy,
    }


# --------------------------------------------------------------------- FSDP2


def fsdp2_groups(
    model_fn: Callable[[], nn.Module],
    *,
    world_size: int,
    rank: int = 0,
    apply: Callable[[nn.Module, Any], Any],
    device: str = "meta",
    lazy_init: bool = False,
) -> list[dict]:
    """Build ``model_fn()`` on meta, let ``apply(model, mesh)`` call ``fully_shard``.

    Returns one dict per successful ``fully_shard`` call, in call order::

        modules  FQNs of the module(s) passed to that call ("" = root)
        params   [{"fqn", "shape", "local_shape", "dtype", "requires_grad"}, ...]
                 in the group's param order; fqn is the model's named_parameters()
                 name (a tied param: its first name); shape = global shape,
                 local_shape = this rank's DTensor local tensor shape (no padding).
                 Extra key: "padded_local_shape" (the shard padded to
                 ceil(dim0 / world_size) rows, what the all-gather moves).

    The group's param order is torch's, NOT ``named_parameters()`` order: modules
    are visited in post-order (children before their parent), each contributing
    its direct params; e.g. a ``MultiheadAttention``'s ``out_proj.*`` come before
    its own ``in_proj_weight``/``in_proj_bias``.

    A call that manages no parameter (e.g. a root whose params all sit in nested
    groups) creates no FSDPParamGroup in torch; it is still listed, with
    ``params == []``. (With ``shard_placement_fn`` giving several meshes one call
    creates several groups; their params are concatenated here.)

    Extras (not needed for layout): ``device="cpu"`` builds the model for real
    instead of on meta; ``lazy_init=True`` then runs FSDP2's root lazy init (what
    the first forward does: duplicate/tied-param and dtype validation). The model
    root must have been passed to ``fully_shard`` for that. On meta, lazy init
    raises torch's "should be materialized from meta device" error after the
    tied-param check.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    states: list = []
    with fake_pg(world_size, rank), _record_calls(FSDPState, "init", states):
        with torch.device(device):
            model = model_fn()
        mesh = init_device_mesh("cpu", (world_size,))
        apply(model, mesh)
        if lazy_init:
            if not isinstance(model, FSDPModule):
                raise ValueError("lazy_init=True needs fully_shard applied to the model root")
            model._get_fsdp_state()._lazy_init()

        mod_name: dict[int, str] = {}
        for n, m in model.named_modules(remove_duplicate=False):
            mod_name.setdefault(id(m), n)
        param_name: dict[int, str] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            param_name.setdefault(id(p), n)

        groups = []
        for st in states:
            params = []
            for pg in param_groups(st):
                for fp in pg.fsdp_params:
                    sp = fp.sharded_param
                    fqn = param_name.get(id(sp))
                    if fqn is None:  # not registered under the root (should not happen)
                        mi = fp._module_info
                        fqn = _join(mod_name.get(id(mi.module), "?"), mi.param_name)
                    params.append(
                        {
                            "fqn": fqn,
                            "shape": list(sp.shape),
                            "local_shape": list(sp.to_local().shape),
                            "dtype": dtype_name(sp.dtype),
                            "requires_grad": bool(sp.requires_grad),
                            "padded_local_shape": list(fp.padded_sharded_param_size),
                        }
                    )
            groups.append({"modules": [mod_name.get(id(m), "?") for m in st._modules], "params": params})
    return groups


def param_groups(state) -> list:
    """The FSDPParamGroups of a fully_shard state: a list ``_fsdp_param_groups`` on torch 2.13+, one
    optional ``_fsdp_param_group`` on 2.11 and earlier."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    return [state._fsdp_param_group] if state._fsdp_param_group is not None else []


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
