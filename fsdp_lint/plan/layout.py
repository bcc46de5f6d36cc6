"""`layout`: what FSDP builds for a plan, as arithmetic (tests compare it with torch itself).

FSDP1: one FlatParameter per unit. Parameters in order; with ``use_orig_params=True`` each starts
aligned to 16 bytes of the compute dtype and the total is padded to a multiple of the world size;
rank r holds the r-th chunk of ``ceil(total / ws)`` elements (``torch.chunk`` + padding).

FSDP2: every parameter is a DTensor sharded on dim 0 with ``torch.chunk`` semantics: ``ceil(d0/ws)``
rows per rank, trailing ranks get fewer or none; the collectives pad each to ``ceil(d0/ws) * ws``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from fsdp_lint.plan.build import Unit, WrapPlan
from fsdp_lint.model.tree import ModuleTree, dtype_itemsize
from fsdp_lint.plan.memory import MEMORY_CATEGORIES, Memory, estimate_memory, stays_gathered  # noqa: F401
from fsdp_lint.plan.roots import _prod, ceil_div, runs_as_root  # noqa: F401 - re-exported

ALIGNMENT_BYTES = 16


@dataclass
class ParamLayout:
    fqn: str
    shape: Tuple[int, ...]
    dtype: str
    requires_grad: bool
    numel: int
    # FSDP1: where the parameter sits in the unit's FlatParameter
    offset: Optional[int] = None
    padding_before: int = 0
    # FSDP2: Shard(0) local shapes and the padding of the collective
    local_shape_first: Optional[Tuple[int, ...]] = None    # rank 0
    local_shape_last: Optional[Tuple[int, ...]] = None     # rank ws-1
    padded_numel: Optional[int] = None                     # ceil(d0/ws)*ws rows
    # FSDP2 over a DTensor (tensor/expert parallelism): its local shape before FSDP shards it (rank 0's)
    # and the placements of the sharded parameter on its mesh dimensions, as torch prints them
    pre_shape: Optional[Tuple[int, ...]] = None
    placements: Optional[List[str]] = None
    mesh_dims: Optional[List[str]] = None
    shard_dim: int = 0                                     # FSDP2: Shard(dim) (shard_placement_fn), else 0

    def local_shape(self, rank: int, ws: int) -> Tuple[int, ...]:
        return fsdp2_local_shape(self.pre_shape if self.pre_shape is not None else self.shape, rank, ws,
                                 self.shard_dim)


@dataclass
class RankSpan:
    fqn: str
    start: int       # intra-parameter element range [start, end)
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass
class UnitLayout:
    unit: Unit
    numel: int                    # parameters' elements (unpadded)
    trainable_numel: int
    dtypes: List[str]
    param_dtype: str              # the dtype collectives all-gather in
    reduce_dtype: str             # the dtype gradients are reduce-scattered in
    padded_numel: int             # elements all-gathered (incl. alignment and world-size padding)
    shard_numel: int              # elements each rank holds (incl. padding)
    all_gather_bytes: int         # one all-gather, per rank sent/received: (ws-1)/ws * padded bytes
    reduce_scatter_bytes: int     # one reduce-scatter, per rank
    all_gathers_per_step: int
    reduce_scatters_per_step: int
    all_reduces_per_step: int
    params: List[ParamLayout] = field(default_factory=list)
    grad_numel: int = 0           # gradient elements allocated per rank (FSDP1: the whole shard)
    world_size: int = 1           # ranks of the shard group
    # issue 11: HSDP / HYBRID_SHARD replicas, reshard_after_forward=<int>
    replicate_size: int = 1       # ranks of the replicate group (the all-reduce of the gradient shards)
    all_reduce_bytes: int = 0     # one all-reduce, per rank: 2 (n-1)/n x the tensor's bytes (ring)
    backward_all_gather_bytes: Optional[int] = None   # when it differs from the forward one (int reshard)
    post_forward_numel: int = 0   # elements a rank keeps between forward and backward (int reshard)

    @property
    def padding(self) -> int:
        return self.padded_numel - self.numel

    @property
    def unsharded_bytes(self) -> int:
        """Bytes of the unit's parameters while gathered (padded, in the all-gather dtype)."""
        return self.padded_numel * dtype_itemsize(self.param_dtype)

    @property
    def all_gather_bytes_per_step(self) -> int:
        if self.backward_all_gather_bytes is not None and self.all_gathers_per_step == 2:
            return self.all_gather_bytes + self.backward_all_gather_bytes
        return self.all_gather_bytes * self.all_gathers_per_step

    @property
    def reduce_scatter_bytes_per_step(self) -> int:
        return self.reduce_scatter_bytes * self.reduce_scatters_per_step

    @property
    def all_reduce_bytes_per_step(self) -> int:
        return self.all_reduce_bytes * self.all_reduces_per_step

    @property
    def step_bytes(self) -> int:
        return self.all_gather_bytes_per_step + self.reduce_scatter_bytes_per_step + self.all_reduce_bytes_per_step

    def rank_spans(self, rank: int) -> List[RankSpan]:
        """FSDP1: the parameters and element ranges in rank `rank`'s FlatParameter shard."""
        start, end = rank * self.shard_numel, (rank + 1) * self.shard_numel
        out = []
        for p in self.params:
            if p.offset is None:
                continue
            a, b = max(start, p.offset), min(end, p.offset + p.numel)
            if a < b:
                out.append(RankSpan(p.fqn, a - p.offset, b - p.offset))
        return out


@dataclass
class Layout:
    api: Optional[str]
    world_size: int
    units: List[UnitLayout]
    memory: Memory
    tp_collectives: List = field(default_factory=list)   # tensor parallelism's (tp_comms.TPCollective)
    trace: Optional[Any] = None      # fsdp_lint.plan.trace.Trace of the forward, when it ran

    @property
    def all_gathers_per_step(self) -> int:
        return sum(u.all_gathers_per_step for u in self.units)

    @property
    def reduce_scatters_per_step(self) -> int:
        return sum(u.reduce_scatters_per_step for u in self.units)

    @property
    def all_reduces_per_step(self) -> int:
        return sum(u.all_reduces_per_step for u in self.units)

    @property
    def collectives_per_step(self) -> int:
        return sum(u.all_gathers_per_step + u.reduce_scatters_per_step + u.all_reduces_per_step for u in self.units)

    @property
    def step_bytes(self) -> int:
        return sum(u.step_bytes for u in self.units)

    def for_unit(self, unit: Unit) -> Optional[UnitLayout]:
        for u in self.units:
            if u.unit is unit:
                return u
        return None


def fsdp2_local_shape(shape: Tuple[int, ...], rank: int, ws: int, dim: int = 0) -> Tuple[int, ...]:
    """The local shape of a FSDP2 ``Shard(dim)`` parameter on shard rank `rank` (``torch.chunk``:
    ``ceil(size/ws)`` along `dim`, the last ranks fewer or none)."""
    if not shape:
        return shape
    size = shape[dim]
    rows = ceil_div(size, ws) if size else 0
    local = max(0, min(rows, size - rank * rows)) if rows else 0
    return (*shape[:dim], local, *shape[dim + 1:])


def flat_param_layout(params: List[Tuple[str, Tuple[int, ...], str, bool, int]], ws: int, use_orig_params: bool,
                      compute_dtype: str) -> Tuple[List[ParamLayout], int]:
    """Offsets of `params` in a FlatParameter and its total (padded) numel."""
    aligned = ALIGNMENT_BYTES // dtype_itemsize(compute_dtype) if use_orig_params else 0
    total = 0
    out = []
    for fqn, shape, dtype, rg, numel in params:
        pad = 0
        if aligned > 0:
            to_pad = aligned - (total % aligned)
            if 0 < to_pad < aligned:
                pad = to_pad
        total += pad
        out.append(ParamLayout(fqn, shape, dtype, rg, numel, offset=total, padding_before=pad))
        total += numel
    if aligned > 0:
        to_pad = ws - (total % ws)
        if 0 < to_pad < ws:
            total += to_pad
    return out, total


def _unit_layout(unit: Unit, plan: WrapPlan, tree: ModuleTree) -> UnitLayout:
    ws = max(1, unit.shard_size or plan.world_size)
    as_root = runs_as_root(unit, plan, tree)
    infos = [tree.params[f] for f in unit.params]
    numel = sum(p.numel for p in infos)
    trainable = sum(p.numel for p in infos if p.requires_grad)
    dtypes = sorted({p.dtype for p in infos})
    orig_dtype = infos[0].dtype if infos else "float32"
    param_dtype = unit.param_dtype or orig_dtype
    reduce_dtype = unit.reduce_dtype or unit.param_dtype or orig_dtype
    any_trainable = trainable > 0
    strategy = plan.sharding_strategy or "FULL_SHARD"
    if plan.api == "fsdp1":
        no_shard = strategy == "NO_SHARD" or ws == 1
        params, total = flat_param_layout(
            [(p.fqn, p.shape, p.dtype, p.requires_grad, p.numel) for p in infos], ws,
            bool(plan.use_orig_params), param_dtype)
        if no_shard:
            shard = total
            padded = total
        else:
            shard = ceil_div(total, ws)
            padded = shard * ws
        ag_bytes = (ws - 1) * shard * dtype_itemsize(param_dtype) if not no_shard else 0
        rs_bytes = (ws - 1) * shard * dtype_itemsize(reduce_dtype) if not no_shard else 0
        has_params = bool(infos)
        reshards = unit.reshard_after_forward and not as_root and strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")
        ags = 0 if (no_shard or not has_params) else 1 + (1 if reshards else 0)
        rss = 1 if (has_params and any_trainable and not no_shard) else 0
        # NO_SHARD all-reduces the gradients, also on one rank (torch 2.13 issues the call);
        # HYBRID_SHARD all-reduces the reduce-scattered gradient shard across the replicas
        ars = 1 if (has_params and any_trainable and no_shard) else 0
        ar_numel = total if no_shard else shard
        ar_group = ws if no_shard else max(1, unit.replicate_size)
        if not no_shard and ar_group > 1 and has_params and any_trainable:
            ars = 1
        ar_bytes = ring_all_reduce_bytes(ar_numel * dtype_itemsize(reduce_dtype), ar_group) if ars else 0
        bwd_ag_bytes = None
        post_forward = 0
        grad_numel = shard if any_trainable else 0
    else:
        params = []
        shard = 0
        padded = 0
        ag_elems_bytes = 0
        rs_elems_bytes = 0
        grad_numel = 0
        last_rank = max(1, plan.world_size) - 1
        last_coord = unit.mesh.shard.coordinate(last_rank) if unit.mesh is not None else ws - 1
        for p in infos:
            # a DTensor (TP/EP) parameter: FSDP shards its local tensor (torch's _init_sharding_spec_tp)
            sharding = plan.param_sharding.get(p.fqn)
            pre_first = sharding.local_shape(p.shape, 0) if sharding is not None else p.shape
            pre_last = sharding.local_shape(p.shape, last_rank) if sharding is not None else p.shape
            shape = pre_first if pre_first else (1,)
            dim = plan.param_shard_dims.get(p.fqn, 0) if len(shape) > 1 else 0
            rows = ceil_div(shape[dim], ws) if shape[dim] else 0
            inner = _prod(shape) // shape[dim] if shape[dim] else 0
            local_numel = rows * inner
            shard += local_numel
            padded += local_numel * ws
            itemsize = dtype_itemsize(unit.param_dtype or p.dtype)
            ag_elems_bytes += local_numel * itemsize
            if p.requires_grad:
                rs_elems_bytes += local_numel * dtype_itemsize(unit.reduce_dtype or unit.param_dtype or p.dtype)
                grad_numel += fsdp2_local_shape(shape, 0, ws, dim)[dim] * inner
            params.append(ParamLayout(
                p.fqn, p.shape, p.dtype, p.requires_grad, p.numel,
                local_shape_first=fsdp2_local_shape(pre_first, 0, ws, dim) if pre_first else pre_first,
                local_shape_last=fsdp2_local_shape(pre_last, last_coord, ws, dim) if pre_last else pre_last,
                shard_dim=dim,
                padded_numel=local_numel * ws,
                pre_shape=tuple(pre_first) if sharding is not None else None,
                placements=spmd_placements(unit, sharding),
                mesh_dims=spmd_mesh_dims(unit, sharding)))
        ag_bytes = (ws - 1) * ag_elems_bytes
        rs_bytes = (ws - 1) * rs_elems_bytes
        has_params = bool(infos)
        # the root does not reshard after forward unless the file asks for it explicitly
        # (torch 2.6/2.7: not even then; fsdp2_torch reads which)
        from fsdp_lint.replay.fsdp2_torch import root_reshards_when_explicit

        explicit = unit.reshard_after_forward_explicit and root_reshards_when_explicit()
        reshards = unit.reshard_after_forward and not (as_root and not explicit)
        # on a 1-rank mesh torch >= 2.12 skips both collectives (FSDPParamGroup.unshard, foreach_reduce);
        # 2.9 still issues the reduce-scatter, 2.6-2.8 both (0 bytes to other ranks): as the installed torch
        from fsdp_lint.replay.fsdp2_torch import one_rank_all_gather, one_rank_reduce_scatter

        ags = (1 + (1 if reshards else 0)) if has_params and (ws > 1 or one_rank_all_gather()) else 0
        rss = 1 if (has_params and any_trainable and (ws > 1 or one_rank_reduce_scatter())) else 0
        # HSDP: the reduce-scattered gradients are all-reduced across the replicate dimension
        ars = 1 if (has_params and any_trainable and unit.replicate_size > 1) else 0
        ar_bytes = ring_all_reduce_bytes(rs_elems_bytes, unit.replicate_size) if ars else 0
        # reshard_after_forward=<int>: after forward each rank keeps 1/k of the unsharded parameters
        # and the backward all-gather runs in groups of k ranks (torch's post-forward mesh)
        raf = unit.reshard_after_forward
        bwd_ag_bytes = None
        post_forward = 0
        if reshards and isinstance(raf, int) and not isinstance(raf, bool) and 1 < raf < ws:
            bwd_ag_bytes = (raf - 1) * (ag_elems_bytes * ws // raf)
            post_forward = padded // raf
    return UnitLayout(
        unit=unit, numel=numel, trainable_numel=trainable, dtypes=dtypes, param_dtype=param_dtype,
        reduce_dtype=reduce_dtype, padded_numel=padded, shard_numel=shard, all_gather_bytes=ag_bytes,
        reduce_scatter_bytes=rs_bytes, all_gathers_per_step=ags, reduce_scatters_per_step=rss,
        all_reduces_per_step=ars, params=params, grad_numel=grad_numel, world_size=ws,
        replicate_size=max(1, unit.replicate_size), all_reduce_bytes=ar_bytes,
        backward_all_gather_bytes=bwd_ag_bytes, post_forward_numel=post_forward)


def param_local_shape(plan: WrapPlan, unit: Unit, p: ParamLayout, rank: int) -> Tuple[int, ...]:
    """FSDP2: parameter `p`'s local shape on global rank `rank` (its TP/EP local tensor on that
    rank, then FSDP's dim-0 chunk at the rank's coordinate in the unit's shard group)."""
    sharding = plan.param_sharding.get(p.fqn)
    pre = sharding.local_shape(p.shape, rank) if sharding is not None else p.shape
    ws = max(1, unit.shard_size)
    coord = unit.mesh.shard.coordinate(rank) if unit.mesh is not None else rank % ws
    return fsdp2_local_shape(tuple(pre), coord, ws, p.shard_dim if len(pre) > 1 else 0)


def ring_all_reduce_bytes(nbytes: int, group: int) -> int:
    """Bytes one rank sends (and receives) in a ring all-reduce of an `nbytes` tensor over `group`
    ranks: a reduce-scatter and an all-gather, 2 (n - 1) / n x the tensor (rounded down)."""
    return 2 * (group - 1) * nbytes // group if group > 1 else 0


def spmd_placements(unit: Unit, sharding) -> List[str]:
    """The placements of an FSDP2-sharded parameter as torch names them (``FSDPParam``'s
    ``_spmd_placements``): HSDP's ``Replicate()``, FSDP's ``Shard(0)`` -- ``_StridedShard`` when tensor
    parallelism shards dim 0 too -- then the parameter's own TP/EP placements."""
    from fsdp_lint.model.mesh import placement_str

    out = ["Replicate()"] if unit.replicate_size > 1 or (unit.mesh is not None and unit.mesh.replicate is not None) \
        else []
    if sharding is None:
        return out + ["Shard(dim=0)"]
    split = sharding.num_shards(0)
    out.append(placement_str(("SS", 0, split)) if split > 1 else "Shard(dim=0)")
    return out + [placement_str(p) for p in sharding.placements]


def spmd_mesh_dims(unit: Unit, sharding) -> List[str]:
    """The mesh dimensions `spmd_placements` refer to (their names; ``?`` for an unnamed one)."""
    dims = []
    if unit.mesh is not None and unit.mesh.replicate is not None:
        dims.append(unit.mesh.replicate.name or "?")
    dims.append(unit.mesh.shard.name or "?" if unit.mesh is not None else "?")
    if sharding is not None:
        dims += [d.name or "?" for d in sharding.mesh.dims]
    return dims


def _needs_backward(units: List[UnitLayout], plan: WrapPlan, tree: ModuleTree, trace) -> List[bool]:
    """Per unit: whether autograd reaches it in backward (its forward output requires grad), the
    condition for FSDP's pre-backward hook and so for the backward all-gather. From the traced
    forward when there is one; else from registration order: a unit is reached when it or a
    module registered before it holds trainable parameters (a frozen first half is not)."""
    if trace is not None and not trace.error and len(trace.unit_output_requires_grad) == len(units):
        return [True if rg is None else bool(rg) for rg in trace.unit_output_requires_grad]
    order = {f: i for i, f in enumerate(tree.modules)}
    first_trainable = min((order.get(p.module, 0) for p in tree.params.values() if p.requires_grad),
                          default=None)
    out = []
    for ul in units:
        start = min((order.get(m, 0) for m in ul.unit.modules), default=0)
        out.append(ul.trainable_numel > 0 or (first_trainable is not None and first_trainable <= start))
    return out


def _backward_prefetch(units: List[UnitLayout], reached: List[bool], trace, tree: ModuleTree) -> None:
    """FSDP2 prefetches in backward the unit whose forward returned just before the one starting
    its backward (post-forward order), whether autograd will reach it or not: the unit before the
    first reached one (a frozen first half's last block) is gathered once more."""
    if trace is not None:
        order = [i for i in trace.unit_post_order if i < len(units)]
    else:   # registration order, the roots last (their forward returns last)
        pos = {f: i for i, f in enumerate(tree.modules)}
        order = sorted(range(len(units)), key=lambda i: (units[i].unit.is_root,
                                                         min((pos.get(m, 0) for m in units[i].unit.modules), default=0)))
    for k in range(1, len(order)):
        cur, prev = units[order[k]], units[order[k - 1]]
        if reached[order[k]] and cur.all_gathers_per_step and not reached[order[k - 1]] \
                and prev.all_gathers_per_step and prev.unit.reshard_after_forward:
            prev.all_gathers_per_step += 1


def compute_layout(plan: WrapPlan, tree: ModuleTree, trace=None, activations: bool = False) -> Layout:
    """The layout of `plan`. `trace` (``fsdp_lint.plan.trace.Trace``, optional) says which units autograd
    reaches in backward; with `activations` its saved tensors enter the memory estimate."""
    units = [_unit_layout(u, plan, tree) for u in plan.units]
    traced = trace is not None and not trace.error and len(trace.unit_forward_calls) == len(units)
    reached = _needs_backward(units, plan, tree, trace)
    for i, ul in enumerate(units):
        if ul.all_gathers_per_step < 2:
            continue                         # not sharded, or gathered once for the whole step
        # gathered at each forward entered from outside the unit (an FSDP2 group whose modules
        # run apart, a module called twice), and again in backward only when autograd reaches it
        entries = max(1, trace.unit_forward_calls[i]) if traced else 1
        ul.all_gathers_per_step = entries * (2 if reached[i] else 1)
    if plan.api == "fsdp2":
        _backward_prefetch(units, reached, trace if traced else None, tree)
    from fsdp_lint.plan.tp_comms import tp_collectives

    return Layout(api=plan.api, world_size=plan.world_size, units=units,
                  memory=estimate_memory(plan, tree, units, trace, activations), trace=trace,
                  tp_collectives=tp_collectives(plan.tp_styles))


def fsdp1_flatten_error(params, use_orig_params: bool) -> Optional[str]:
    """The error torch raises when it flattens `params` (ParamInfo, FlatParameter order) into one
    FSDP1 FlatParameter (``FlatParamHandle._validate_tensors_to_flatten``), or None."""
    dtype = None
    requires_grad = None
    for p in params:
        if dtype is None and not p.is_floating:
            return "Cannot flatten integer dtype tensors"
        if dtype is not None and p.dtype != dtype:
            return f"Must flatten tensors with uniform dtype but got torch.{dtype} and torch.{p.dtype}"
        if not use_orig_params and requires_grad is not None and p.requires_grad != requires_grad:
            return "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
        dtype = p.dtype
        requires_grad = bool(requires_grad) or p.requires_grad
    return None
