"""The search: every combination of the axes of ``space`` that the file's front-end can write, each
with its per-rank peak (the static estimate), whether it fits the budget and its collectives per
step. Cheap by construction: the replay is not repeated; the forward is traced again only once per
(granularity, activation checkpointing, parameter dtype) -- what changes the saved tensors or their
units -- and every other axis only lays the plan out again (arithmetic).

Listed: the file's plan, and the candidates that fit (at most ``MAX_LISTED``), the least
communication per step first (all-gather + reduce-scatter + all-reduce bytes per rank), then the
fewest changes, then the lowest peak; a candidate whose changes include all of another fitting one's
with no less communication is left out (the smaller change does). When none fits, the
``MAX_UNFIT`` lowest peaks are listed instead (``fits: false``)."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Callable, Dict, List, Optional

from fsdp_lint.plan.budget import budget_for
from fsdp_lint.plan.layout import compute_layout
from fsdp_lint.suggest.changes import describe, expressible
from fsdp_lint.suggest.space import (Choice, checkpointed_blocks, granular_plan, search_space, with_precision,
                                     with_sharding)

# what CPU offload moves off the device: FSDP2 CPUOffloadPolicy / FSDP1 CPUOffload(offload_params=True)
_OFFLOADED = ("sharded_params", "sharded_grads", "optimizer_state")
MAX_LISTED = 8
MAX_UNFIT = 3


def suggest(model, tree, plan, layout, settings, retrace: Callable[[object], object]) -> List[Dict]:
    """The candidates listed (see the module's docstring) of ``candidates``."""
    return _listed(candidates(model, tree, plan, layout, settings, retrace))


def candidates(model, tree, plan, layout, settings, retrace: Callable[[object], object]) -> List[Dict]:
    """Every candidate the search builds, the file's plan among them, unsorted and unpruned.
    `retrace(plan)`: the forward traced again (``plan.trace.trace_forward``), here while the
    blocks to checkpoint run under ``torch.utils.checkpoint`` (``checkpointed(model, fqns)``)."""
    if not plan.units or layout.trace is None or layout.trace.error:
        return []
    activations = "activations" in layout.memory.covers
    space = search_space(tree, plan, layout.trace, settings, expressible(plan, tree))
    traces: Dict[tuple, object] = {}

    def trace_for(granularity: str, ac: str, precision: str, cand_plan):
        key = (granularity, ac, precision != "file")
        if key not in traces:
            if key == ("file", "file", False):
                traces[key] = layout.trace
            else:
                with checkpointed(model, checkpointed_blocks(space, ac)):
                    t = retrace(cand_plan)
                traces[key] = None if t is None or getattr(t, "error", None) else t
        return traces[key]

    file_per_block = sorted(u.module for u in plan.units if not u.is_root) == sorted(space.blocks)
    out = []
    splits = {g: splits_a_tie(granular_plan(tree, plan, space, g), tree) for g in space.granularity}
    for g, ac, prec in itertools.product(space.granularity, space.ac, space.precision):
        if splits[g] and (g, ac, prec) != ("file", "file", "file"):
            continue          # torch raises at the first forward (FSDP2) or unties them (FSDP1): not offered
        base = with_precision(granular_plan(tree, plan, space, g), prec)
        trace = trace_for(g, ac, prec, base)
        if trace is None:
            continue
        for reshard, hsdp in itertools.product(space.reshard, space.hsdp):
            if hsdp and reshard == "node":
                continue
            cand = with_sharding(base, tree, space, reshard, hsdp)
            lay = layout if cand is plan and trace is layout.trace else \
                compute_layout(cand, tree, trace=trace, activations=activations)
            for offload in space.offload:
                choice = Choice(granularity=g, ac=ac, precision=prec, reshard=reshard, hsdp=hsdp, offload=offload)
                if splits[g] and choice.kinds:
                    continue      # only the file's own plan keeps a split tie (FSD401 says so)
                out.append(_candidate(choice, cand, lay, plan, tree, space, settings, file_per_block))
    return out


def _candidate(choice: Choice, cand, lay, plan, tree, space, settings, file_per_block: bool) -> Dict:
    breakdown = dict(lay.memory.breakdown)
    if choice.offload:
        for k in _OFFLOADED:
            breakdown[k] = 0
    peak = sum(breakdown.values())
    budget = budget_for(dataclasses.replace(lay.memory, per_rank_bytes=peak, breakdown=breakdown), settings)
    kinds = choice.kinds
    ckpt = checkpointed_blocks(space, choice.ac)
    last = max((u for u in cand.units if not u.is_root), key=lambda u: list(tree.modules).index(u.module)
               if u.module in tree.modules else -1, default=None)
    extra = [m for m in space.granularity[choice.granularity] if m not in space.blocks]
    details = {"blocks": space.blocks, "extra": extra, "checkpointed": ckpt, "last": last.module if last else "",
               "node": space.node, "replicas": plan.world_size // space.node, "file_per_block": file_per_block}
    ag = sum(u.all_gather_bytes_per_step for u in lay.units)
    rs = sum(u.reduce_scatter_bytes_per_step for u in lay.units)
    ar = sum(u.all_reduce_bytes_per_step for u in lay.units)
    return {"change": describe(kinds, plan, tree, details), "kinds": kinds, "fits": budget.fits,
            "peak_bytes": peak, "simulated_peak_bytes": None,
            "all_gather_bytes_per_step": ag, "reduce_scatter_bytes_per_step": rs, "all_reduce_bytes_per_step": ar,
            "plan": _as_data(cand, choice, ckpt, space, plan)}


def _as_data(cand, choice: Choice, ckpt: List[str], space, plan) -> Dict:
    """The candidate as plain data: what ``--simulate`` applies with torch's own FSDP API."""
    return {
        "api": cand.api,
        "units": [list(u.modules) for u in cand.units],
        "reshard_after_forward": [u.reshard_after_forward if u.reshard_after_forward_explicit else None
                                  for u in cand.units],
        "param_dtype": cand.units[0].param_dtype if cand.units else None,
        "reduce_dtype": cand.units[0].reduce_dtype if cand.units else None,
        "mesh": [plan.world_size // space.node, space.node] if choice.hsdp else None,
        "sharding_strategy": cand.sharding_strategy,
        "use_orig_params": bool(cand.use_orig_params),
        "checkpointed": list(ckpt),
        "offload": choice.offload,
        "optimizer": plan.optimizers[-1].cls if plan.optimizers else "AdamW",
    }


def splits_a_tie(plan, tree) -> bool:
    """Whether the modules sharing a (tied) parameter fall in different units of `plan` (FSD401)."""
    ignored = set(plan.ignored_params)
    for info in tree.params.values():
        if not info.aliases or info.fqn in ignored:
            continue
        owners = {n.rpartition(".")[0] for n in info.all_fqns} & set(tree.modules)
        units = {id(plan.unit_of_module(m)) for m in owners}
        if len(units) > 1:
            return True
    return False


def communication(c: Dict) -> int:
    return c["all_gather_bytes_per_step"] + c["reduce_scatter_bytes_per_step"] + c["all_reduce_bytes_per_step"]


def _order(c: Dict):
    return (c["fits"] is not True, communication(c), len(c["kinds"]), c["peak_bytes"])


def _listed(cands: List[Dict]) -> List[Dict]:
    own = next((c for c in cands if not c["kinds"]), None)
    fitting = [c for c in cands if c["fits"] is True and c["kinds"]]
    kept = [c for c in fitting
            if not any(set(d["kinds"]) < set(c["kinds"]) and communication(d) <= communication(c) for d in fitting)]
    kept = sorted(kept, key=_order)[:MAX_LISTED]
    if not kept:
        kept = sorted((c for c in cands if c["kinds"]), key=lambda c: (c["peak_bytes"], communication(c)))[:MAX_UNFIT]
    return sorted(([own] if own is not None else []) + kept, key=_order)


@contextlib.contextmanager
def checkpointed(model, fqns: List[str]):
    """The forward of the modules `fqns` under ``torch.utils.checkpoint`` (non-reentrant), as
    ``checkpoint_wrapper`` runs it; undone afterwards."""
    import functools

    import torch.utils.checkpoint as cp

    from fsdp_lint.model.unwrap import resolve_module

    patched = []
    for fqn in fqns:
        m: Optional[object] = resolve_module(model, fqn)
        if m is None or "forward" in m.__dict__:
            continue
        m.forward = functools.partial(cp.checkpoint, m.forward, use_reentrant=False)
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
