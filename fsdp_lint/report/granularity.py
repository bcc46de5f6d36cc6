"""`granularity`: the article's central table for the user's own model and world size.

The same model, API, world size and options wrapped four ways -- the whole model as one unit, one
unit per repeated block (the class ``tree.repeated_block_class()`` finds), one unit per Linear, and
the file's own plan -- each laid out by ``layout.compute_layout``: units, all-gathers per step, the
bytes one all-gather moves per rank, the forward peak of unsharded parameters (all-gather buffers
included), the per-rank memory estimate, and a verdict. Plain data; ``report`` renders it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from fsdp_lint.plan.layout import Layout, compute_layout
from fsdp_lint.plan.alternatives import alternative_plan, per_block_plan
from fsdp_lint.plan.build import WrapPlan


@dataclass
class GranularityRow:
    name: str                     # "whole model", "per TransformerBlock", "per Linear", "this file's plan"
    origin: str                   # "whole-model" | "per-block" | "per-linear" | the plan's own origin
    units: int
    all_gathers_per_step: int
    bytes_per_all_gather: int     # mean bytes one all-gather sends/receives per rank
    forward_peak_bytes: int       # unsharded parameters + all-gather buffers held at once in forward
    per_rank_bytes: int           # the memory estimate (what `covers` says it includes)
    small_all_gathers: int        # all-gathers below the collective floor (latency-bound)
    verdict: str = ""


def compare_granularity(res, settings) -> List[GranularityRow]:
    tree, plan, layout = res.tree, res.plan, res.layout
    if plan.api is None:
        return []
    trace = layout.trace
    activations = "activations" in layout.memory.covers
    floor = settings.collective_floor_bytes

    def row(name: str, origin: str, p: WrapPlan, lay: Optional[Layout] = None) -> GranularityRow:
        lay = lay or compute_layout(p, tree, trace=trace, activations=activations)
        gathers = [(u.all_gather_bytes, u.all_gathers_per_step) for u in lay.units if u.all_gathers_per_step]
        count = sum(n for _, n in gathers)
        moved = sum(b * n for b, n in gathers)
        return GranularityRow(name=name, origin=origin, units=len(p.units), all_gathers_per_step=count,
                              bytes_per_all_gather=moved // count if count else 0,
                              forward_peak_bytes=lay.memory.unsharded_peak_bytes,
                              per_rank_bytes=lay.memory.per_rank_bytes,
                              small_all_gathers=sum(n for b, n in gathers if b < floor))

    rows = [row("whole model", "whole-model", alternative_plan(tree, plan, [], "whole-model"))]
    block = tree.repeated_block_class()
    per_block = per_block_plan(tree, plan, block) if block else None
    if per_block is not None:
        rows.append(row(f"per {block}", "per-block", per_block))
    # a Linear whose weight its parent reads directly (MultiheadAttention's out_proj) stays with
    # the parent: a unit of its own would hold it sharded when it is read (FSD402)
    linears = _outermost(tree, [f for f, m in tree.modules.items() if f and "Linear" in m.mro
                                and not (trace is not None and trace.reads_outside(tree, f))])
    if linears:
        rows.append(row("per Linear", "per-linear", alternative_plan(tree, plan, linears, "per-linear")))
    own = {"file": "this file's plan", "cli": "--wrap plan", "default": None}.get(plan.origin, "this file's plan")
    if own:
        rows.append(row(own, plan.origin, plan, layout))
    _verdicts(rows, settings, plan)
    return rows


def _outermost(tree, fqns: List[str]) -> List[str]:
    out: List[str] = []
    for f in fqns:      # pre-order: an ancestor comes before its descendants
        if not (out and (f == out[-1] or tree.is_ancestor(out[-1], f))):
            out.append(f)
    return out


def _verdicts(rows: List[GranularityRow], settings, plan: WrapPlan) -> None:
    from fsdp_lint.humanize import human_bytes

    floor = settings.collective_floor_bytes

    def too_fine(r: GranularityRow) -> bool:
        return r.all_gathers_per_step > 0 and r.small_all_gathers > settings.over_fine_fraction * r.all_gathers_per_step

    candidates = [r for r in rows if r.units > 1 and not too_fine(r)]
    best = min(candidates, key=lambda r: (r.per_rank_bytes, r.forward_peak_bytes, r.all_gathers_per_step),
               default=None)
    for r in rows:
        if r.units == 1:
            r.verdict = "nothing sharded in forward: every rank gathers the whole model at once"
        elif too_fine(r):
            r.verdict = (f"too fine: {r.small_all_gathers} of {r.all_gathers_per_step} all-gathers move less than "
                         f"{human_bytes(floor)} (latency-bound)")
        elif best is not None and r is best:
            r.verdict = "best of these"
        elif best is not None:
            r.verdict = (f"forward peak {r.forward_peak_bytes / max(1, best.forward_peak_bytes):.1f}x, memory "
                         f"{r.per_rank_bytes / max(1, best.per_rank_bytes):.2f}x {best.name}")
    own = rows[-1] if rows and rows[-1].origin == plan.origin else None
    if own is not None:
        same = next((r for r in rows[:-1] if (r.units, r.all_gathers_per_step, r.per_rank_bytes)
                     == (own.units, own.all_gathers_per_step, own.per_rank_bytes)), None)
        if same is not None:
            own.verdict = f"same as {same.name}" + (f" ({same.verdict})" if same.verdict == "best of these" else "")


def granularity_table(res) -> str:
    from fsdp_lint.humanize import human_bytes

    """`--compare-granularity`: the article's table for this model and world size."""
    rows = []
    for row in res.granularity:
        rows.append([row.name, row.units, row.all_gathers_per_step, human_bytes(row.bytes_per_all_gather),
                     human_bytes(row.forward_peak_bytes), human_bytes(row.per_rank_bytes), row.verdict])
    headers = ["plan", "units", "all-gathers per step", "bytes per all-gather", "forward peak (unsharded)",
               "memory per rank", "verdict"]
    head = f"granularity on {res.plan.world_size} ranks ({res.layout.memory.covers}):\n"
    from fsdp_lint.report.width import fit_table, output_width

    width = output_width()
    text, _, _ = fit_table(rows, headers, width)
    if max(len(line) for line in text.split("\n")) <= width:
        return head + text
    # too narrow for the verdicts beside the figures: the figures, then each verdict on lines of its own
    import textwrap

    text, _, _ = fit_table([r[:-1] for r in rows], headers[:-1], width, wrap=("plan",))
    verdicts = [textwrap.fill(f"{r[0]}: {r[-1]}", max(40, width), initial_indent="  ", subsequent_indent="    ")
                for r in rows]
    return head + text + "\nverdicts:\n" + "\n".join(verdicts)
