"""Other plans for the same model: per block, whole model, per Linear, a --suggest candidate -- with the
linted plan's API, world size and options, to compare peaks and collectives."""
from __future__ import annotations

from typing import List, Optional

from fsdp_lint.model.tree import ModuleTree
from fsdp_lint.plan.build import Unit, WrapPlan, _assign_params, _post_order


def per_block_plan(tree: ModuleTree, plan: WrapPlan, block=None) -> Optional[WrapPlan]:
    """The per-block plan for `plan`'s model: one unit per outermost instance of the repeated block
    classes (``tree.repeated_blocks()`` unless `block`, a class or several, is given), children
    first, then the root;
    with `plan`'s API, world size and options (sharding strategy, ``use_orig_params``, mixed
    precision and shard size of its root unit, ignored modules and parameters). Feed it to
    ``compute_layout`` to compare peaks and collectives. None when the model has no repeated block."""
    block = block or tree.repeated_blocks()
    if not block:
        return None
    instances = tree.instances_of(block)
    if not instances:
        return None
    return alternative_plan(tree, plan, instances, "per-block")


def alternative_plan(tree: ModuleTree, plan: WrapPlan, modules: List, origin: str) -> WrapPlan:
    """`plan` with other units: one per module in `modules` (children first; a tuple of modules is
    one unit of them all, FSDP2's ``fully_shard([a, b])``, placed as its first), then the root; the
    API, world size and options as in ``per_block_plan`` (``modules=[]``: the whole model as one
    unit)."""
    template = plan.root_unit or (plan.units[-1] if plan.units else None)
    alt = WrapPlan(api=plan.api or "fsdp2", world_size=plan.world_size, units=[], root_wrapped=False,
                   use_orig_params=plan.use_orig_params, sharding_strategy=plan.sharding_strategy,
                   origin=origin, ignored_params=list(plan.ignored_params),
                   ignored_modules=list(plan.ignored_modules), optimizers=list(plan.optimizers),
                   mesh=plan.mesh, param_sharding=plan.param_sharding,
                   param_shard_dims=dict(plan.param_shard_dims))

    groups = {m[0]: list(m) for m in modules if not isinstance(m, str)}

    def unit(fqn: str, seq: int) -> Unit:
        return Unit(module=fqn, modules=groups.get(fqn, [fqn]), cls=tree.modules[fqn].cls,
                    path=template.path if template else f"<{origin}>", line=template.line if template else 0,
                    col=template.col if template else 0, seq=seq, origin=origin,
                    param_dtype=template.param_dtype if template else None,
                    reduce_dtype=template.reduce_dtype if template else None,
                    shard_size=template.shard_size if template else plan.world_size,
                    replicate_size=template.replicate_size if template else 1,
                    mesh=template.mesh if template else None,
                    cpu_offload=template.cpu_offload if template else False)

    for seq, fqn in enumerate(_post_order(tree, [m if isinstance(m, str) else m[0] for m in modules])):
        alt.units.append(unit(fqn, seq))
    alt.units.append(unit("", len(alt.units)))
    _assign_params(alt, tree)
    return alt
