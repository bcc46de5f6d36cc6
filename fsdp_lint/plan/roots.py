"""`roots`: small facts about a plan's units that the layout and the memory estimate share: which units
run as FSDP roots (never resharded after forward), and integer helpers."""
from __future__ import annotations

from typing import Dict, List

from fsdp_lint.plan.build import Unit, WrapPlan
from fsdp_lint.model.tree import ModuleTree


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def runs_as_root(unit: Unit, plan: WrapPlan, tree: ModuleTree) -> bool:
    """Whether `unit` is a root at lazy initialisation: no other unit contains its modules. Roots do
    not reshard after forward (FSDP1 never; FSDP2 unless reshard_after_forward is given). Without
    a root wrap every top-level unit is such a root."""
    if unit.is_root:
        return True
    holders = _units_by_module(plan)
    for m in unit.modules:
        # an ancestor module that another unit holds (walked up by FQN: depth, not units²)
        for a in tree.ancestors(m):
            if any(other is not unit for other in holders.get(a, ())):
                return False
    return True


def _units_by_module(plan: WrapPlan) -> Dict[str, List[Unit]]:
    """module FQN -> the units that hold it; kept on the plan while its list of units is unchanged."""
    cached = plan.__dict__.get("_units_by_module")
    if cached is None or cached[0] is not plan.units or cached[1] != len(plan.units):
        by_module: Dict[str, List[Unit]] = {}
        for u in plan.units:
            for m in u.modules:
                by_module.setdefault(m, []).append(u)
        cached = (plan.units, len(plan.units), by_module)
        plan.__dict__["_units_by_module"] = cached
    return cached[2]
