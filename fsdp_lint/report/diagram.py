"""`--layout diagram`: what the FSDP article draws by hand, drawn from the layout.

FSDP1: each unit's FlatParameter as a bar -- parameter boundaries on the first line, the ranks'
shards on the second, alignment and world-size padding shaded. FSDP2: each parameter's dim-0 rows
split by rank (``torch.chunk``: ``ceil(rows / ws)`` per rank, the last ranks fewer or none). Bars are
scaled to the terminal width. Units with the same layout as an earlier one (the repeated blocks)
are drawn once. ``bars()`` gives the same geometry as plain data for the HTML report's SVG.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

PAD = "░"


@dataclass
class Segment:
    start: int            # element (FSDP1) or row (FSDP2) offset
    end: int
    label: str
    kind: str             # "param" | "padding" | "rank" | "empty"


@dataclass
class Bar:
    title: str
    total: int            # elements (FSDP1) or padded rows (FSDP2) the bar spans
    top: List[Segment]    # parameters (FSDP1) / ranks with their rows (FSDP2)
    bottom: List[Segment]  # ranks (FSDP1); empty for FSDP2


@dataclass
class UnitDiagram:
    unit: str
    header: str
    bars: List[Bar]
    same_as: Optional[str] = None      # drawn before under this unit's name


def bars(res) -> List[UnitDiagram]:
    """The diagram of every unit of `res` as plain data (repeated layouts referenced, not redrawn)."""
    from fsdp_lint.humanize import unit_label

    out: List[UnitDiagram] = []
    seen = {}
    for ul in res.layout.units:
        if not ul.params:
            continue
        label = unit_label(", ".join(unit_label(m) for m in ul.unit.modules))
        key = (ul.unit.cls, ul.world_size, ul.padded_numel,
               tuple((_rel(p.fqn, ul.unit.modules), p.shape, p.dtype) for p in ul.params))
        if key in seen:
            out.append(UnitDiagram(label, "", [], same_as=seen[key]))
            continue
        seen[key] = label
        if res.plan.api == "fsdp1":
            out.append(_fsdp1(ul, label))
        else:
            out.append(_fsdp2(ul, label))
    return out


def _fsdp1(ul, label: str) -> UnitDiagram:
    from fsdp_lint.humanize import exact_count as _n

    ws = ul.world_size
    top: List[Segment] = []
    pos = 0
    for p in ul.params:
        if p.offset is None:
            continue
        if p.offset > pos:
            top.append(Segment(pos, p.offset, "", "padding"))
        top.append(Segment(p.offset, p.offset + p.numel, _rel(p.fqn, ul.unit.modules), "param"))
        pos = p.offset + p.numel
    if ul.padded_numel > pos:
        top.append(Segment(pos, ul.padded_numel, "", "padding"))
    bottom = [Segment(r * ul.shard_numel, (r + 1) * ul.shard_numel, f"rank {r}", "rank") for r in range(ws)]
    header = (f"{label} ({ul.unit.cls}): FlatParameter of {_n(ul.numel)} elements, {_n(ul.padded_numel)} padded, "
              f"{ws} rank{'s' if ws != 1 else ''} x {_n(ul.shard_numel)}")
    return UnitDiagram(label, header, [Bar("", ul.padded_numel, top, bottom)])


def _fsdp2(ul, label: str) -> UnitDiagram:
    ws = ul.world_size
    out = []
    for p in ul.params:
        shape = p.shape or (1,)
        rows = shape[0]
        per = -(-rows // ws) if rows else 0
        segs = []
        for r in range(ws):
            start = min(r * per, rows)
            end = min(start + per, rows)
            if end > start:
                segs.append(Segment(r * per, r * per + (end - start), f"r{r} {end - start}", "rank"))
            if end - start < per:
                segs.append(Segment(r * per + (end - start), (r + 1) * per, "" if end > start else f"r{r} 0",
                                    "padding" if end > start else "empty"))
        title = f"{_rel(p.fqn, ul.unit.modules)} [{', '.join(map(str, p.shape))}]"
        out.append(Bar(title, per * ws, segs, []))
    header = (f"{label} ({ul.unit.cls}): {len(ul.params)} parameters, Shard(0) over {ws} rank"
              f"{'s' if ws != 1 else ''} (ceil(dim0 / {ws}) rows each; padding shaded)")
    return UnitDiagram(label, header, out)


def _rel(fqn: str, modules) -> str:
    for m in modules:
        if m and fqn.startswith(m + "."):
            return fqn[len(m) + 1:]
    return fqn


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------
def layout_diagram(res, width: Optional[int] = None) -> str:
    if not width:
        from fsdp_lint.report.width import output_width

        width = output_width()
    width = max(40, width)
    blocks = []
    for d in _grouped(bars(res)):
        if isinstance(d, str):
            blocks.append(d)
            continue
        lines = [d.header]
        if res.plan.api == "fsdp1":
            bar = d.bars[0]
            w = width - 3             # 2 of indent, and the closing boundary
            lines.append("  " + _line(bar.top, bar.total, w))
            lines.append("  " + _line(bar.bottom, bar.total, w))
        else:
            name_w = min(max(len(b.title) for b in d.bars), max(16, width // 3))
            w = max(20, width - name_w - 4)
            for bar in d.bars:
                title = bar.title if len(bar.title) <= name_w else bar.title[: name_w - 1] + "…"
                lines.append(f"  {title:<{name_w}} " + _line(bar.top, bar.total, w))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "(no unit holds parameters)"


def _grouped(diagrams: List[UnitDiagram]):
    """Diagrams, with each run of units that repeat an earlier layout folded into one line."""
    out: list = []
    run: List[UnitDiagram] = []

    def flush() -> None:
        if run:
            names = run[0].unit if len(run) == 1 else f"{run[0].unit} ... {run[-1].unit} ({len(run)} units)"
            out.append(f"{names}: same layout as {run[0].same_as}")
            run.clear()

    for d in diagrams:
        if d.same_as is not None and (not run or run[-1].same_as == d.same_as):
            run.append(d)
            continue
        flush()
        if d.same_as is not None:
            run.append(d)
        else:
            out.append(d)
    flush()
    return out


def _line(segs: List[Segment], total: int, width: int) -> str:
    """One bar of `width` characters: '|' at segment boundaries, labels centred where they fit."""
    chars = [" "] * (width + 1)
    if total <= 0:
        return "".join(chars)
    edges = []
    for s in segs:
        a, b = _col(s.start, total, width), _col(s.end, total, width)
        edges.append((a, b, s))
    for a, b, s in edges:
        fill = PAD if s.kind in ("padding", "empty") else "─" if s.kind == "param" else " "
        for i in range(a + 1, b):
            chars[i] = fill
    for a, b, s in edges:
        chars[a] = "│"
        chars[b] = "│"
    for a, b, s in edges:
        room = b - a - 1
        text = _fit(s.label, room)
        if text:
            start = a + 1 + (room - len(text)) // 2
            for i, ch in enumerate(text):
                chars[start + i] = ch
    return "".join(chars).rstrip()


def _fit(label: str, room: int) -> str:
    if room <= 0 or not label:
        return ""
    if len(label) + 2 <= room:
        return f" {label} "
    short = label.rsplit(".", 2)[-2:]
    for cand in (".".join(short), short[-1]):
        if len(cand) + 2 <= room:
            return f" {cand} "
        if len(cand) <= room:
            return cand
    return ""


def _col(x: int, total: int, width: int) -> int:
    return min(width, max(0, round(x * width / total)))


def span_cols(segs: List[Segment], total: int, width: int) -> List[Tuple[int, int, Segment]]:
    """(first column, last column, segment): the geometry the SVG renderer scales too."""
    return [(_col(s.start, total, width), _col(s.end, total, width), s) for s in segs]
