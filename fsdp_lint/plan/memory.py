"""`memory`: the static per-rank memory estimate of a plan's training step, from its layout (sharded
and unsharded parameters, gradients, optimizer state, reduce-scatter buffers) and, with an input
shape, the activations of the traced forward -- activation checkpointing included."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fsdp_lint.plan.build import WrapPlan
from fsdp_lint.model.tree import ModuleTree, dtype_itemsize
from fsdp_lint.plan.roots import _prod, ceil_div, runs_as_root


@dataclass
class Memory:
    per_rank_bytes: int
    breakdown: Dict[str, int]
    optimizer: str
    covers: str = "params + grads + optimizer state"    # what per_rank_bytes includes
    phase: str = "end of backward"                      # the moment of the step it describes
    activation_inputs: Optional[str] = None             # the inputs activations were traced with
    activation_note: str = ""                           # how activations are (not) covered
    unsharded_peak_bytes: int = 0     # the most unsharded parameters + all-gather buffers held at once (forward)
    # the activations alive at the peak, by unit (repeated units' FQNs as a glob: ``layers.*``)
    activations_by_unit: Dict[str, int] = field(default_factory=dict)
    checkpointed_regions: int = 0     # activation-checkpointed regions the traced forward ran
    # CPU offload (FSDP2 CPUOffloadPolicy / FSDP1 CPUOffload(offload_params=True)): the offloaded units'
    # sharded parameters, gradients and optimizer state, in host memory (not in per_rank_bytes)
    host_bytes: int = 0


# the static breakdown's keys, always all present (JSON consumers read them by name)
MEMORY_CATEGORIES = ("sharded_params", "unsharded_params_in_flight", "all_gather_buffers", "sharded_grads",
                     "unsharded_grads", "reduce_scatter_buffers", "optimizer_state", "replicated_params_grads_state",
                     "activations", "temporaries", "inputs")
_OPTIMIZER_STATES = {"SGD": 1, "Adagrad": 1, "RMSprop": 1, "Adafactor": 1, "Lion": 1, "Muon": 1}


def stays_gathered(ul, plan: WrapPlan, tree: ModuleTree) -> bool:
    """Whether the unit keeps its parameters unsharded from its forward to the end of backward:
    roots (FSDP1 always; FSDP2 unless reshard_after_forward was given explicitly) and units that
    do not reshard after forward (FSDP1 SHARD_GRAD_OP, FSDP2 reshard_after_forward=False)."""
    unit = ul.unit
    if not unit.reshard_after_forward:
        return True
    if plan.api == "fsdp2" and unit.reshard_after_forward_explicit:
        return False
    return runs_as_root(unit, plan, tree)


def _optimized(plan: WrapPlan):
    """The model's parameters the script's optimizers hold (`torch.optim.AdamW(some_params)`), or None
    when no optimizer holding them was recorded (then every trainable parameter has its state). An
    optimizer built over FSDP1's FlatParameters holds none of them by name: None too."""
    held = {fqn for o in plan.optimizers for fqn in o.params}
    return held or None


def _held_share(unit_layout, tree: ModuleTree, held) -> float:
    """The share of the unit's trainable elements the optimizers hold (1 without a recorded optimizer)."""
    if held is None:
        return 1.0
    trainable = [p for p in unit_layout.unit.params if tree.params[p].requires_grad]
    total = sum(tree.params[p].numel for p in trainable)
    return sum(tree.params[p].numel for p in trainable if p in held) / total if total else 0.0


def estimate_memory(plan: WrapPlan, tree: ModuleTree, units: list, trace=None,
            activations: bool = False) -> Memory:
    """Per-rank memory at the peak of a training step (the second one: optimizer state exists,
    gradients were set to None before its forward), the larger of two moments:

    * the start of backward: sharded parameters, optimizer state, the units that stay gathered
      (the root) plus the block being gathered, and -- with an input shape -- every activation
      saved for backward, the outputs, the first gradients of the loss (about twice the largest
      saved tensor) and the inputs;
    * the end of backward: the same without activations, with the sharded gradients, the root's
      unsharded gradients and the reduce-scatter buffer of the largest unit.
    """
    opt_cls = plan.optimizers[-1].cls if plan.optimizers else "AdamW"
    states = _OPTIMIZER_STATES.get(opt_cls, 2)
    held = _optimized(plan)
    sharded_params = sharded_grads = optimizer = host = 0
    for u in units:
        itemsizes = [tree.params[p].itemsize for p in u.unit.params] or [4]
        orig = max(itemsizes)
        share = _held_share(u, tree, held)
        if plan.api == "fsdp1":
            params, grads = u.shard_numel * orig, u.grad_numel * orig
            trainable_shard = u.grad_numel if u.trainable_numel == u.numel else ceil_div(u.trainable_numel, u.world_size)
            state = round(states * trainable_shard * orig * share)
        else:
            params = sum(  # rank 0's local shard (of the TP-local tensor for DTensor params)
                _prod(p.local_shape_first or (1,)) * dtype_itemsize(p.dtype) for p in u.params)
            grads, state = u.grad_numel * orig, round(states * u.grad_numel * orig * share)
        if getattr(u.unit, "cpu_offload", False):
            host += params + grads + state          # the device holds the unit only while it is gathered
            continue
        sharded_params, sharded_grads, optimizer = sharded_params + params, sharded_grads + grads, optimizer + state
    replicated = 0
    for fqn in list(plan.leftover_params) + list(plan.ignored_params):
        p = tree.params[fqn]
        state = states if held is None or fqn in held else 0
        replicated += p.numel * p.itemsize * (1 + (1 + state if p.requires_grad else 0))
    # unsharded parameters: the units that stay gathered (roots, no reshard after forward), plus
    # the largest other unit being gathered (torch holds one all-gather in flight at the peak)
    kept = [u for u in units if u.all_gathers_per_step and stays_gathered(u, plan, tree)]
    others = [u for u in units if u.all_gathers_per_step and u not in kept]
    gathered = sum(u.unsharded_bytes for u in kept)
    in_flight = max((u.unsharded_bytes for u in others), default=0)
    # end of backward: the unit computing its gradients is gathered, its gradients unsharded in the
    # compute dtype and its reduce-scatter input in the reduce dtype (the largest unit: the root)
    reduced = [u for u in units if u.reduce_scatters_per_step or u.all_reduces_per_step]
    last = max(reduced, key=lambda u: u.padded_numel, default=None)
    unsharded_grads = last.padded_numel * dtype_itemsize(last.param_dtype) if last is not None else 0
    rs_buffers = last.padded_numel * dtype_itemsize(last.reduce_dtype) if last is not None and last.reduce_scatters_per_step else 0
    base = {
        "sharded_params": sharded_params,
        "optimizer_state": optimizer,
        "replicated_params_grads_state": replicated,
    }
    # reshard_after_forward=<int>: every such unit keeps 1/k of its parameters from its forward to
    # its backward
    post_forward = sum(u.post_forward_numel * dtype_itemsize(u.param_dtype) for u in units)
    if post_forward:
        base["post_forward_shards"] = post_forward
    end_of_backward = dict(base, sharded_grads=sharded_grads, unsharded_params_in_flight=gathered + in_flight,
                           unsharded_grads=unsharded_grads, reduce_scatter_buffers=rs_buffers)
    covers = "params + grads + optimizer state"
    activations_by_unit: Dict[str, int] = {}
    breakdown = end_of_backward
    phase = "end of backward"
    traced = trace is not None and not trace.error
    if activations and traced:
        # FSDP1 prefetches the next unit in backward (BACKWARD_PRE) into its unsharded FlatParameter;
        # FSDP2 gathers a unit into an all-gather buffer, then copies it out into its parameters
        if plan.api == "fsdp1":
            unsharded, ag_buffers = gathered + 2 * in_flight, 0
        else:
            unsharded, ag_buffers = gathered + in_flight, in_flight
        start_of_backward = dict(base, unsharded_params_in_flight=unsharded, all_gather_buffers=ag_buffers,
                                 activations=trace.activation_bytes,
                                 temporaries=2 * trace.largest_saved_bytes, inputs=trace.input_bytes)
        moments = [("start of backward", start_of_backward, {})]
        if trace.segments:
            moments = backward_moments(plan, tree, units, trace, base, kept, states)
        at, peak, by_unit = max(moments, key=lambda m: sum(m[1].values()))
        if sum(peak.values()) >= sum(end_of_backward.values()):
            breakdown, phase, activations_by_unit = peak, at, by_unit
        covers = "params + grads + optimizer state + activations"
    full = dict.fromkeys(MEMORY_CATEGORIES, 0)
    full.update(breakdown)
    return Memory(per_rank_bytes=sum(full.values()), breakdown=full, optimizer=opt_cls, covers=covers,
                  phase=phase, activation_inputs=(trace.inputs if traced else None) if activations else None,
                  activation_note=_activation_note(trace, activations),
                  activations_by_unit=activations_by_unit,
                  checkpointed_regions=trace.checkpointed if traced else 0, host_bytes=host,
                  unsharded_peak_bytes=_unsharded_peak(plan, gathered, [u.unsharded_bytes for u in others]))


def _unsharded_peak(plan: WrapPlan, gathered: int, others: List[int]) -> int:
    """The forward peak of unsharded parameters. FSDP1 gathers into the unsharded FlatParameter:
    the units that stay gathered plus the largest other unit, twice when the next one is
    prefetched. FSDP2 gathers into an all-gather buffer and copies out; the buffer of the previous
    group is held until the next all-gather completes: at the first block after a root with
    parameters, the root's buffer and copy plus the block's (2 x root + 2 x block; 3 x block after
    a root without parameters)."""
    largest = max(others, default=0)
    if plan.api == "fsdp1":
        return gathered + largest * (2 if len(others) > 1 else 1)
    if not others:
        return 2 * gathered
    return gathered + largest + largest + max(gathered, largest if len(others) > 1 else 0)


def _activation_note(trace, activations: bool) -> str:
    if activations and trace is not None and not trace.error:
        return f"activations for inputs {trace.inputs}"
    if activations and trace is not None and trace.error:
        return f"activations: the forward could not be traced ({trace.error})"
    return "activations: pass --input-shape or --simulate"


def unit_glob(module: str) -> str:
    """``layers.3.mlp`` -> ``layers.*.mlp``: repeated units named once."""
    import re

    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", module) if module else "(root)"


def backward_moments(plan: WrapPlan, tree: ModuleTree, units: list, trace, base: Dict[str, int], kept: list,
                     states: int) -> List[Tuple[str, Dict[str, int], Dict[str, int]]]:
    """The moments of the steady step's backward, one per stretch of saved tensors (``trace.segments``),
    walked in reverse forward order: (where, breakdown, activations by unit).

    At the backward of a stretch, alive are: every tensor saved before it and its own (freed as its
    backward ends), for an activation-checkpointed region what its backward recomputes; the outputs
    and inputs (held by the training loop); the gradient flowing in (at the first moment the loss's
    gradient of the outputs) and the one flowing out (about the stretch's largest saved tensor); the
    units that stay gathered, the unit itself and the one prefetched next (FSDP2: in its all-gather
    buffer); the unit's unsharded gradients in the compute dtype (the roots' from the first moment to
    the end of backward); the sharded gradients of the units done, and the reduce-scatter input of
    the last one done (held until the next reduce-scatter)."""
    segs = trace.segments
    kept_ids = {id(u) for u in kept}
    first_seg: Dict[int, int] = {}
    for k, seg in enumerate(segs):
        if seg.unit is not None and seg.unit < len(units):
            first_seg.setdefault(seg.unit, k)
    itemsize = {}
    for i, u in enumerate(units):
        itemsize[i] = max([tree.params[p].itemsize for p in u.unit.params] or [4])

    def unsharded_grad(i: int) -> int:
        u = units[i]
        if not u.trainable_numel or not u.numel:
            return 0
        return u.padded_numel * u.trainable_numel // u.numel * dtype_itemsize(u.param_dtype)

    def grad_shard(i: int) -> int:
        return 0 if getattr(units[i].unit, "cpu_offload", False) else units[i].grad_numel * itemsize[i]

    def rs_input(i: int) -> int:
        u = units[i]
        if not u.reduce_scatters_per_step or not u.numel:
            return 0
        return u.padded_numel * u.trainable_numel // u.numel * dtype_itemsize(u.reduce_dtype)

    gathered = sum(u.unsharded_bytes for u in kept)
    kept_grads = sum(unsharded_grad(i) for i, u in enumerate(units) if id(u) in kept_ids)
    # the order units start their backward: each one's last stretch, walked backwards
    order: List[int] = []
    for seg in reversed(segs):
        if seg.unit is not None and seg.unit < len(units) and seg.unit not in order \
                and id(units[seg.unit]) not in kept_ids and units[seg.unit].all_gathers_per_step:
            order.append(seg.unit)
    prefix = [0]
    for seg in segs:
        prefix.append(prefix[-1] + seg.saved_bytes)
    out = []
    for k in range(len(segs) - 1, -1, -1):
        seg = segs[k]
        u = seg.unit if seg.unit is not None and seg.unit < len(units) else None
        gathered_u = u is not None and id(units[u]) not in kept_ids and units[u].all_gathers_per_step
        nxt = 0
        if gathered_u and u in order and order.index(u) + 1 < len(order):
            nxt = units[order[order.index(u) + 1]].unsharded_bytes
        elif not gathered_u and order and k == len(segs) - 1:
            nxt = units[order[0]].unsharded_bytes         # the first unit's backward all-gather, prefetched
        own = units[u].unsharded_bytes if gathered_u else 0
        done = [i for i, f in first_seg.items() if f > k and units[i].trainable_numel]
        last_done = max(done, key=lambda i: first_seg[i], default=None)
        recompute = seg.recompute_bytes if seg.checkpointed else 0
        outgoing = max(seg.largest_bytes, seg.recompute_largest_bytes)
        if recompute:
            # once the region is recomputed, the gradients flowing in and out are about the size of
            # its inputs (the checkpoint's kept tensors, just before it), not of its largest tensor
            held = max(seg.largest_bytes, segs[k - 1].largest_bytes if k and segs[k - 1].unit == seg.unit else 0)
            outgoing = held or outgoing
        incoming = trace.output_bytes if k == len(segs) - 1 else outgoing
        grads_now = kept_grads + (unsharded_grad(u) if gathered_u else 0)
        if plan.api == "fsdp1":
            unsharded, ag = gathered + own + nxt, 0
        else:
            unsharded, ag = gathered + own, nxt
        moment = dict(base, unsharded_params_in_flight=unsharded, all_gather_buffers=ag,
                      activations=prefix[k + 1] + recompute + trace.output_bytes,
                      temporaries=incoming + outgoing, inputs=trace.input_bytes,
                      unsharded_grads=grads_now, sharded_grads=sum(grad_shard(i) for i in done),
                      reduce_scatter_buffers=rs_input(last_done) if last_done is not None else 0)
        by_unit: Dict[str, int] = {}
        for j in range(k + 1):
            name = unit_glob(units[segs[j].unit].unit.module) if segs[j].unit is not None and \
                segs[j].unit < len(units) else "(outside every unit)"
            by_unit[name] = by_unit.get(name, 0) + segs[j].saved_bytes + (recompute if j == k else 0)
        name = units[u].unit.module if u is not None else ""
        out.append((f"backward of {name or '(root)'}" + (" (recomputing its forward)" if recompute else ""),
                    moment, by_unit))
        if k == len(segs) - 1:
            # the first moment: the loss's gradient of the logits, before any parameter's gradient
            out.append(("start of backward", dict(moment, temporaries=max(trace.loss_grad_bytes, incoming),
                                                  unsharded_grads=0), by_unit))
    return out
