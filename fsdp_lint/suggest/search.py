"""The candidates: the file's plan with activation checkpointing of every block, the FSDP2 root
resharded after forward, CPU offload, and their combinations; each with its per-rank peak (the
static estimate), whether it fits the budget, and its collectives per step. Sorted: those that fit
first, then the least communication per step, the fewest changes, the lowest peak."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
from typing import Callable, Dict, List, Optional

from fsdp_lint.plan.budget import budget_for
from fsdp_lint.plan.layout import compute_layout
from fsdp_lint.suggest.changes import describe

# what CPU offload moves off the device: FSDP2 CPUOffloadPolicy / FSDP1 CPUOffload(offload_params=True)
_OFFLOADED = ("sharded_params", "sharded_grads", "optimizer_state")


def suggest(model, tree, plan, layout, settings, retrace: Callable[[object], object]) -> List[Dict]:
    """`retrace(plan)`: the forward traced again (``plan.trace.trace_forward``) while the blocks'
    forwards are checkpointed (``activation_checkpointed(model, plan)`` around it)."""
    if not plan.units or layout.trace is None or layout.trace.error:
        return []
    ac_trace = None
    if not layout.trace.checkpointed:
        with activation_checkpointed(model, plan):
            ac_trace = retrace(plan)
        if ac_trace is not None and getattr(ac_trace, "error", None):
            ac_trace = None
    options = ["ac"] if ac_trace is not None else []
    root = plan.root_unit
    if plan.api == "fsdp2" and root is not None and root.params and not root.reshard_after_forward_explicit:
        options.append("root-reshard")
    options.append("offload")
    out = []
    for n in range(0, len(options) + 1):
        for kinds in itertools.combinations(options, n):
            cand = plan
            if "root-reshard" in kinds:
                cand = _with_root_resharded(plan)
            trace = ac_trace if "ac" in kinds else layout.trace
            lay = compute_layout(cand, tree, trace=trace, activations=True) if (cand is not plan or "ac" in kinds) \
                else layout
            breakdown = dict(lay.memory.breakdown)
            if "offload" in kinds:
                for k in _OFFLOADED:
                    breakdown[k] = 0
            peak = sum(breakdown.values())
            memory = dataclasses.replace(lay.memory, per_rank_bytes=peak, breakdown=breakdown)
            budget = budget_for(memory, settings)
            out.append({"change": describe(list(kinds), plan, tree), "kinds": list(kinds), "fits": budget.fits,
                        "peak_bytes": peak, "simulated_peak_bytes": None,
                        "all_gather_bytes_per_step": sum(u.all_gather_bytes_per_step for u in lay.units),
                        "reduce_scatter_bytes_per_step": sum(u.reduce_scatter_bytes_per_step for u in lay.units)})
    out.sort(key=lambda c: (c["fits"] is not True, c["all_gather_bytes_per_step"] + c["reduce_scatter_bytes_per_step"],
                            len(c["kinds"]), c["peak_bytes"]))
    return out


def _with_root_resharded(plan):
    cand = copy.copy(plan)
    cand.__dict__.pop("_units_by_module", None)
    cand.units = [dataclasses.replace(u, reshard_after_forward=True, reshard_after_forward_explicit=True)
                  if u.is_root else u for u in plan.units]
    return cand


@contextlib.contextmanager
def activation_checkpointed(model, plan):
    """The forward of every non-root unit's modules under ``torch.utils.checkpoint`` (non-reentrant),
    as ``checkpoint_wrapper`` runs it; undone afterwards."""
    import functools

    import torch.utils.checkpoint as cp

    from fsdp_lint.model.unwrap import resolve_module

    patched = []
    for u in plan.units:
        if u.is_root:
            continue
        for fqn in u.modules:
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
