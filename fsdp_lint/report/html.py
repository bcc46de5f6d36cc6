"""`--format html`: one self-contained HTML file (inline CSS and SVG; no script, no network).

Per file: the summary and the findings, the plan (the unit table), the layout diagram (the
``diagram`` geometry as SVG), the memory estimate as a stacked bar, with ``--compare-granularity`` the
granularity table as bar charts, and after ``--simulate`` the memory over the two simulated steps
per category beside the static estimate. Rendering only: everything comes from the results.
"""
from __future__ import annotations

import html
from typing import Dict, List, Optional, Sequence, Tuple

from fsdp_lint.version import __version__

# category -> (label, colour); the order stacks them bottom-up
CATEGORY_STYLE = [
    ("sharded_params", "sharded parameters", "#4e79a7"),
    ("optimizer_state", "optimizer state", "#9c755f"),
    ("sharded_grads", "sharded gradients", "#59a14f"),
    ("unsharded_params", "unsharded parameters", "#76b7b2"),
    ("unsharded_params_in_flight", "unsharded parameters", "#76b7b2"),
    ("all_gather_buffers", "all-gather buffers", "#a0cbe8"),
    ("unsharded_grads", "unsharded gradients", "#8cd17d"),
    ("reduce_scatter_buffers", "reduce-scatter buffers", "#b6992d"),
    ("replicated_params_grads_state", "replicated (outside every unit)", "#bab0ac"),
    ("buffers", "buffers", "#d7b5a6"),
    ("inputs", "inputs", "#f1ce63"),
    ("activations", "activations", "#f28e2b"),
    ("temporaries", "temporaries", "#e15759"),
]
_COLOR = {k: c for k, _, c in CATEGORY_STYLE}
_LABEL = {k: label for k, label, _ in CATEGORY_STYLE}
_SEVERITY = {"error": "#c0392b", "warning": "#d68910", "info": "#2e86c1"}

_CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.muted{color:#666}.summary{font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:12.5px;background:#f6f8fa;padding:8px 10px;border-radius:4px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0}th,td{border:1px solid #e1e4e8;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:4px solid;padding:6px 10px;margin:8px 0;background:#fbfbfb}.code{font-weight:600}
.fix{color:#333;margin-top:4px}.legend span{display:inline-block;margin:2px 10px 2px 0;font-size:12px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
svg text{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif}
"""


def render_html(results, *, run_summary: Optional[dict] = None, failures=()) -> str:
    from fsdp_lint.report.text import display_path, summary_counts

    counts = summary_counts(results)
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>fsdp-lint report</title><style>{_CSS}</style></head><body>",
             f"<h1>fsdp-lint report</h1><div class=\"muted\">fsdp-lint {_e(__version__)} &middot; "
             f"{counts['error']} error, {counts['warning']} warning, {counts['info']} info in "
             f"{sum(1 for r in results if not r.skipped)} file(s)</div>"]
    for path, message in failures:
        parts.append(f"<h2>{_e(display_path(path))}</h2><div class=\"finding\" style=\"border-color:#c0392b\">"
                     f"could not be linted: {_e(message)}</div>")
    for res in results:
        if res.skipped:
            continue
        parts.append(_file_section(res))
    if run_summary is not None:
        from fsdp_lint.report.text import run_summary_text

        parts.append(f"<h2>--run</h2><pre class=\"summary\">{_e(run_summary_text(run_summary))}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _file_section(res) -> str:
    from fsdp_lint.report.text import display_path, summary_line

    out = [f"<h2>{_e(display_path(res.path))}</h2>", f"<div class=\"summary\">{_e(summary_line(res))}</div>"]
    if res.findings:
        out.append("<h3>Findings</h3>")
        for f in res.findings:
            color = _SEVERITY.get(f.severity, "#888")
            extra = f"<div class=\"fix\"><b>fix:</b> {_e(f.fix)}</div>" if f.fix else ""
            if f.evidence:
                state = {True: "confirmed", False: "not confirmed", None: "undetermined"}[f.confirmed]
                extra += f"<div class=\"fix\"><b>--run {state}:</b> {_e(f.evidence)}</div>"
            out.append(f"<div class=\"finding\" style=\"border-color:{color}\"><span class=\"code\" "
                       f"style=\"color:{color}\">{_e(f.code)} {_e(f.severity)}</span> "
                       f"<span class=\"muted\">{_e(display_path(f.path))}:{f.line}</span><br>{_e(getattr(f, 'text', f.message))}{extra}</div>")
    out.append("<h3>Plan</h3>" + _unit_table(res))
    out.append("<h3>Layout</h3>" + _layout_svg(res))
    out.append("<h3>Memory per rank (static estimate)</h3>" + _memory_bar(res))
    if getattr(res, "granularity", None):
        out.append("<h3>Granularity</h3>" + _granularity(res))
    sim = getattr(res, "simulated", None)
    if sim:
        out.append("<h3>Simulated memory over the step</h3>" + _simulated(res, sim))
    if getattr(res, "suggestions", None):
        out.append("<h3>Plans against the memory budget (--suggest)</h3>" + _suggestion_bars(res))
    return "\n".join(out)


def _suggestion_bars(res) -> str:
    """The candidates side by side as bars of their per-rank peak, the usable memory as a line."""
    from fsdp_lint.humanize import human_bytes

    cands, budget = res.suggestions, getattr(res, "budget", None)
    usable = budget.usable_bytes if budget is not None else 0
    w, label_w, bar_h, gap, top = 1100, 420, 18, 6, 22
    h = top + len(cands) * (bar_h + gap) + 20
    peak = max([c["peak_bytes"] for c in cands] + [c.get("simulated_peak_bytes") or 0 for c in cands] + [usable]) or 1
    scale = (w - label_w - 110) / peak
    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">",
           "<text x=\"0\" y=\"14\" font-size=\"13\" font-weight=\"600\">peak per rank (static estimate; "
           "a tick: simulated)</text>"]
    for i, c in enumerate(cands):
        y = top + i * (bar_h + gap)
        length = scale * c["peak_bytes"]
        color = "#59a14f" if c["fits"] else "#e15759" if c["fits"] is False else "#bab0ac"
        label = c["change"] if len(c["change"]) <= 60 else c["change"][:57] + "..."
        svg.append(f"<text x=\"{label_w - 8}\" y=\"{y + 13}\" font-size=\"12\" text-anchor=\"end\">"
                   f"<title>{_e(c['change'])}</title>{_e(label)}</text>"
                   f"<rect x=\"{label_w}\" y=\"{y}\" width=\"{length:.1f}\" height=\"{bar_h}\" fill=\"{color}\"/>"
                   f"<text x=\"{label_w + length + 6:.1f}\" y=\"{y + 13}\" font-size=\"12\">"
                   f"{_e(human_bytes(c['peak_bytes']))}</text>")
        if c.get("simulated_peak_bytes") is not None:   # the simulated peak: a tick on the bar
            sx = label_w + scale * c["simulated_peak_bytes"]
            svg.append(f"<line x1=\"{sx:.1f}\" y1=\"{y - 2}\" x2=\"{sx:.1f}\" y2=\"{y + bar_h + 2}\" "
                       f"stroke=\"#1f3b73\" stroke-width=\"3\"><title>simulated "
                       f"{_e(human_bytes(c['simulated_peak_bytes']))}</title></line>")
    if usable:
        x = label_w + scale * usable
        svg.append(f"<line x1=\"{x:.1f}\" y1=\"{top - 4}\" x2=\"{x:.1f}\" y2=\"{h - 14}\" stroke=\"#333\" "
                   f"stroke-dasharray=\"4 3\"/><text x=\"{x:.1f}\" y=\"{h - 2}\" font-size=\"11\" "
                   f"text-anchor=\"middle\">usable {_e(human_bytes(usable))} ({_e(budget.device)})</text>")
    svg.append("</svg>")
    return "".join(svg)


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------
def _unit_table(res) -> str:
    from fsdp_lint.humanize import human_bytes, human_count, unit_label

    rows = []
    for i, ul in enumerate(res.layout.units):
        u = ul.unit
        dt = "/".join(ul.dtypes) or "-"
        if ul.dtypes and ul.param_dtype not in ul.dtypes:
            dt += f" &rarr; {_e(ul.param_dtype)}"
        rows.append(f"<tr><td class=n>{i}</td><td>{_e(unit_label(', '.join(unit_label(m) for m in u.modules)))}</td>"
                    f"<td>{_e(u.cls)}</td><td class=n>{human_count(ul.numel)}</td>"
                    f"<td class=n>{human_count(ul.trainable_numel)}</td><td>{dt}</td>"
                    f"<td class=n>{human_count(ul.shard_numel)}</td>"
                    f"<td class=n>{human_bytes(ul.all_gather_bytes)} &times;{ul.all_gathers_per_step}</td>"
                    f"<td class=n>{human_bytes(ul.reduce_scatter_bytes)} &times;{ul.reduce_scatters_per_step}</td>"
                    f"<td class=n>{u.line or ''}</td></tr>")
    head = ("<tr><th>#</th><th>unit</th><th>class</th><th>params</th><th>trainable</th><th>dtype</th>"
            "<th>shard/rank</th><th>all-gather/rank</th><th>reduce-scatter/rank</th><th>line</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _granularity(res) -> str:
    from fsdp_lint.humanize import human_bytes

    rows = res.granularity
    table = "".join(
        f"<tr><td>{_e(r.name)}</td><td class=n>{r.units}</td><td class=n>{r.all_gathers_per_step}</td>"
        f"<td class=n>{human_bytes(r.bytes_per_all_gather)}</td><td class=n>{human_bytes(r.forward_peak_bytes)}</td>"
        f"<td class=n>{human_bytes(r.per_rank_bytes)}</td><td>{_e(r.verdict)}</td></tr>" for r in rows)
    head = ("<tr><th>plan</th><th>units</th><th>all-gathers/step</th><th>bytes/all-gather</th>"
            "<th>forward peak (unsharded)</th><th>memory/rank</th><th>verdict</th></tr>")
    charts = [_hbars("forward peak of unsharded parameters", [(r.name, r.forward_peak_bytes) for r in rows], True),
              _hbars("all-gathers per step", [(r.name, r.all_gathers_per_step) for r in rows], False),
              _hbars(f"memory per rank ({res.layout.memory.covers})", [(r.name, r.per_rank_bytes) for r in rows], True)]
    return f"<table>{head}{table}</table>" + "".join(charts)


def _hbars(title: str, items: Sequence[Tuple[str, int]], as_bytes: bool) -> str:
    from fsdp_lint.humanize import human_bytes

    w, label_w, bar_h, gap = 1100, 230, 18, 6
    top = 22
    h = top + len(items) * (bar_h + gap) + 6
    peak = max((v for _, v in items), default=0) or 1
    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">",
           f"<text x=\"0\" y=\"14\" font-size=\"13\" font-weight=\"600\">{_e(title)}</text>"]
    for i, (name, value) in enumerate(items):
        y = top + i * (bar_h + gap)
        length = (w - label_w - 110) * value / peak
        svg.append(f"<text x=\"{label_w - 8}\" y=\"{y + 13}\" font-size=\"12\" text-anchor=\"end\">{_e(name)}</text>"
                   f"<rect x=\"{label_w}\" y=\"{y}\" width=\"{length:.1f}\" height=\"{bar_h}\" fill=\"#4e79a7\"/>"
                   f"<text x=\"{label_w + length + 6:.1f}\" y=\"{y + 13}\" font-size=\"12\">"
                   f"{_e(human_bytes(value) if as_bytes else str(value))}</text>")
    svg.append("</svg>")
    return "".join(svg)


# --------------------------------------------------------------------------------------------
# the layout diagram
# --------------------------------------------------------------------------------------------
def _layout_svg(res) -> str:
    from fsdp_lint.report.diagram import bars

    diagrams = bars(res)
    if not diagrams:
        return "<p class=muted>no unit holds parameters</p>"
    out = []
    repeats: Dict[str, List[str]] = {}
    for d in diagrams:
        if d.same_as is not None:
            repeats.setdefault(d.same_as, []).append(d.unit)
    for d in diagrams:
        if d.same_as is not None:
            continue
        note = ""
        if d.unit in repeats:
            same = repeats[d.unit]
            note = (f" <span class=muted>(same layout: {_e(same[0])}"
                    f"{' &hellip; ' + _e(same[-1]) if len(same) > 1 else ''}, {len(same)} more)</span>")
        out.append(f"<div><b>{_e(d.header)}</b>{note}</div>")
        out.append(_fsdp1_svg(d) if res.plan.api == "fsdp1" else _fsdp2_svg(d))
    return "\n".join(out)


_RANK_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]
_PARAM_COLORS = ["#dbe9f6", "#fde7d3", "#e0f0da", "#f9dede", "#e2f1f0", "#fbf3d5", "#ece1eb", "#ffe9ec"]


def _fsdp1_svg(d) -> str:
    w, x0, h = 1100, 4, 92
    bar = d.bars[0]
    scale = (w - 2 * x0) / max(1, bar.total)
    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">"]
    for i, s in enumerate(bar.top):
        x, width = x0 + s.start * scale, max(0.5, (s.end - s.start) * scale)
        fill = "url(#pad)" if s.kind == "padding" else _PARAM_COLORS[i % len(_PARAM_COLORS)]
        svg.append(f"<rect x=\"{x:.2f}\" y=\"4\" width=\"{width:.2f}\" height=\"34\" fill=\"{fill}\" "
                   f"stroke=\"#555\" stroke-width=\"0.6\"><title>{_e(s.label or 'padding')}: elements "
                   f"{s.start:,}-{s.end:,}</title></rect>")
        label = _fit_text(s.label, width)
        if label:
            svg.append(f"<text x=\"{x + width / 2:.2f}\" y=\"25\" font-size=\"11\" text-anchor=\"middle\">"
                       f"{_e(label)}</text>")
    for r, s in enumerate(bar.bottom):
        x, width = x0 + s.start * scale, (s.end - s.start) * scale
        color = _RANK_COLORS[r % len(_RANK_COLORS)]
        svg.append(f"<rect x=\"{x:.2f}\" y=\"46\" width=\"{width:.2f}\" height=\"22\" fill=\"{color}\" "
                   f"fill-opacity=\"0.85\" stroke=\"#fff\"><title>{_e(s.label)}: elements {s.start:,}-{s.end:,}"
                   f"</title></rect>")
        label = _fit_text(s.label, width)
        if label:
            svg.append(f"<text x=\"{x + width / 2:.2f}\" y=\"61\" font-size=\"11\" fill=\"#fff\" "
                       f"text-anchor=\"middle\">{_e(label)}</text>")
        svg.append(f"<line x1=\"{x:.2f}\" y1=\"2\" x2=\"{x:.2f}\" y2=\"70\" stroke=\"#222\" stroke-dasharray=\"3,2\"/>")
    svg.append(f"<text x=\"{x0}\" y=\"86\" font-size=\"11\" fill=\"#666\">parameters of the FlatParameter (top), "
               f"the rank that holds each element (bottom); hatched: padding</text>")
    svg.append(_PATTERN + "</svg>")
    return "".join(svg)


def _fsdp2_svg(d) -> str:
    w, name_w, row_h = 1100, 300, 20
    h = 8 + len(d.bars) * row_h + 18
    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">"]
    for i, bar in enumerate(d.bars):
        y = 4 + i * row_h
        svg.append(f"<text x=\"{name_w - 8}\" y=\"{y + 13}\" font-size=\"11.5\" text-anchor=\"end\">"
                   f"{_e(bar.title)}</text>")
        scale = (w - name_w - 8) / max(1, bar.total)
        for s in bar.top:
            rank = int(s.label.split()[0][1:]) if s.label.startswith("r") else 0
            x, width = name_w + s.start * scale, max(0.5, (s.end - s.start) * scale)
            fill = _RANK_COLORS[rank % len(_RANK_COLORS)] if s.kind == "rank" else "url(#pad)"
            svg.append(f"<rect x=\"{x:.2f}\" y=\"{y}\" width=\"{width:.2f}\" height=\"{row_h - 4}\" fill=\"{fill}\" "
                       f"stroke=\"#fff\" stroke-width=\"0.8\"><title>{_e(bar.title)}: {_e(s.label or 'padding')}"
                       f"</title></rect>")
            label = _fit_text(s.label, width)
            if label and s.kind == "rank":
                svg.append(f"<text x=\"{x + width / 2:.2f}\" y=\"{y + 12}\" font-size=\"10.5\" fill=\"#fff\" "
                           f"text-anchor=\"middle\">{_e(label)}</text>")
    svg.append(f"<text x=\"{name_w}\" y=\"{h - 4}\" font-size=\"11\" fill=\"#666\">dim-0 rows of each parameter "
               f"by rank (r0 = rank 0); hatched: padding of the collective, or a rank with no rows</text>")
    svg.append(_PATTERN + "</svg>")
    return "".join(svg)


_PATTERN = ("<defs><pattern id=\"pad\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
            "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eee\"/>"
            "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#aaa\" stroke-width=\"2\"/></pattern></defs>")


def _fit_text(label: str, width: float) -> str:
    if not label:
        return ""
    for cand in (label, label.rsplit(".", 1)[-1]):
        if len(cand) * 6.2 + 6 <= width:
            return cand
    return ""


# --------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------
def _legend(keys) -> str:
    seen, items = set(), []
    for k in keys:
        label = _LABEL.get(k, k)
        if label in seen:
            continue
        seen.add(label)
        items.append(f"<span><i style=\"background:{_COLOR.get(k, '#999')}\"></i>{_e(label)}</span>")
    return f"<div class=legend>{''.join(items)}</div>"


def _memory_bar(res) -> str:
    from fsdp_lint.humanize import human_bytes

    mem = res.layout.memory
    parts = [(k, v) for k, _, _ in CATEGORY_STYLE for kk, v in mem.breakdown.items() if kk == k and v]
    total = sum(v for _, v in parts) or 1
    w, h = 1100, 40
    x = 0.0
    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">"]
    for k, v in parts:
        width = (w - 2) * v / total
        svg.append(f"<rect x=\"{x:.2f}\" y=\"4\" width=\"{width:.2f}\" height=\"28\" fill=\"{_COLOR.get(k, '#999')}\" "
                   f"stroke=\"#fff\"><title>{_e(_LABEL.get(k, k))}: {human_bytes(v)}</title></rect>")
        if width > 70:
            svg.append(f"<text x=\"{x + width / 2:.2f}\" y=\"22\" font-size=\"11\" text-anchor=\"middle\">"
                       f"{human_bytes(v)}</text>")
        x += width
    svg.append("</svg>")
    return (f"<div>{_e(human_bytes(mem.per_rank_bytes))} per rank at the {_e(mem.phase)}: {_e(mem.covers)} "
            f"<span class=muted>({_e(mem.activation_note)})</span></div>" + "".join(svg) + _legend(k for k, _ in parts))


def _simulated(res, sim: dict) -> str:
    from fsdp_lint.report.text import MEMORY_ROWS, human_bytes

    if "error" in sim:
        return f"<p>not measured: {_e(sim['error'])}</p>"
    points = sim.get("timeline") or []
    keys = [k for k, _, _ in CATEGORY_STYLE if any(p["bytes"].get(k) for p in points)]
    w, h, left, bottom = 1100, 300, 70, 34
    top = 10
    peak = max((sum(p["bytes"].values()) for p in points), default=0) or 1
    n = max(1, len(points) - 1)

    def px(i: int) -> float:
        return left + (w - left - 10) * i / n

    def py(v: float) -> float:
        return top + (h - top - bottom) * (1 - v / peak)

    svg = [f"<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">"]
    base = [0.0] * len(points)
    for k in keys:
        upper = [b + p["bytes"].get(k, 0) for b, p in zip(base, points)]
        pts = [f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(upper)]
        pts += [f"{px(i):.1f},{py(v):.1f}" for i, v in reversed(list(enumerate(base)))]
        svg.append(f"<polygon points=\"{' '.join(pts)}\" fill=\"{_COLOR.get(k, '#999')}\" fill-opacity=\"0.9\">"
                   f"<title>{_e(_LABEL.get(k, k))}</title></polygon>")
        base = upper
    for frac in (0.25, 0.5, 0.75, 1.0):
        y = py(peak * frac)
        svg.append(f"<line x1=\"{left}\" y1=\"{y:.1f}\" x2=\"{w - 10}\" y2=\"{y:.1f}\" stroke=\"#000\" "
                   f"stroke-opacity=\"0.12\"/><text x=\"{left - 6}\" y=\"{y + 4:.1f}\" font-size=\"11\" "
                   f"text-anchor=\"end\">{human_bytes(int(peak * frac))}</text>")
    last, text_end = None, 0.0
    for i, p in enumerate(points):
        key = (p["step"], p["phase"])
        if key != last and p["step"]:
            x = px(i)
            svg.append(f"<line x1=\"{x:.1f}\" y1=\"{top}\" x2=\"{x:.1f}\" y2=\"{h - bottom}\" stroke=\"#333\" "
                       f"stroke-dasharray=\"2,3\" stroke-opacity=\"0.6\"/>")
            label = f"step {p['step']} {p['phase']}"
            width = len(label) * 5.6
            if x + 3 >= text_end + 6 and x + 3 + width <= w:      # labels that would overlap are left out
                svg.append(f"<text x=\"{x + 3:.1f}\" y=\"{h - bottom + 14}\" font-size=\"10.5\">{_e(label)}</text>")
                text_end = x + 3 + width
        last = key
    static = res.layout.memory.per_rank_bytes
    if static <= peak * 1.3:
        y = py(min(static, peak))
        svg.append(f"<line x1=\"{left}\" y1=\"{y:.1f}\" x2=\"{w - 10}\" y2=\"{y:.1f}\" stroke=\"#c0392b\" "
                   f"stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/><text x=\"{w - 14}\" y=\"{y - 4 if y > top + 14 else y + 13:.1f}\" "
                   f"font-size=\"11\" "
                   f"text-anchor=\"end\" fill=\"#c0392b\">static estimate {human_bytes(static)}</text>")
    svg.append(f"<text x=\"{left}\" y=\"{h - 4}\" font-size=\"11\" fill=\"#666\">memory of rank 0 over the "
               f"simulated steps (tensor memory, {_e(sim['measure'])})</text></svg>")
    at = sim.get("peak_at") or {}
    head = (f"<div>peak {human_bytes(sim['peak_bytes'])} per rank"
            + (f" in {_e(at['phase'])} of {_e(at['module'] or '(root)')} (step {at['step']})" if at else "")
            + f"; rank 0 of {sim['world_size']}, inputs {_e(sim.get('inputs') or '?')}, "
              f"{_e(sim.get('optimizer') or 'no optimizer')}</div>")
    rows = []
    for label, skeys, mkeys in MEMORY_ROWS:
        st = sum(res.layout.memory.breakdown.get(k, 0) for k in skeys)
        me = sum(sim["breakdown"].get(k, 0) for k in mkeys)
        if st or me:
            rows.append(f"<tr><td>{_e(label)}</td><td class=n>{human_bytes(me)}</td>"
                        f"<td class=n>{human_bytes(st) if skeys else '-'}</td></tr>")
    rows.append(f"<tr><th>total</th><th class=n>{human_bytes(sim['peak_bytes'])}</th>"
                f"<th class=n>{human_bytes(static)}</th></tr>")
    table = ("<table><tr><th>per rank</th><th>simulated (at the peak)</th><th>static estimate</th></tr>"
             + "".join(rows) + "</table>")
    return head + "".join(svg) + _legend(keys) + table


def _e(text) -> str:
    return html.escape(str(text), quote=True)
