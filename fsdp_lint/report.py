"""`report`: rendering only -- text (full/concise), JSON, SARIF 2.1.0 and GitHub annotations."""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from fsdp_lint import __version__
from fsdp_lint.rule import SEVERITIES

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def display_path(path: str, base: Optional[str] = None) -> str:
    base = base or os.getcwd()
    ap = os.path.abspath(path)
    try:
        rel = os.path.relpath(ap, base)
    except ValueError:
        return ap
    return ap if rel.startswith("..") else rel.replace(os.sep, "/")


def human_count(n: int) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}" if n / div < 100 else f"{n / div:.0f}{suffix}"
    return str(n)


def human_bytes(n: int) -> str:
    for div, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}" if n / div < 100 else f"{n / div:.0f} {suffix}"
    return f"{n} B"


def unit_label(module: str) -> str:
    return module if module else "(root)"


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def summary_counts(results) -> Dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for r in results:
        for f in r.findings:
            counts[f.severity] += 1
    return counts


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------
def summary_line(res) -> str:
    tree, plan, layout = res.tree, res.plan, res.layout
    api = plan.api or "no FSDP"
    origin = {"default": " (no wrap code: suggested per-block plan)", "cli": " (from --wrap)"}.get(plan.origin, "")
    parts = [
        f"{tree.root_class} ({human_count(tree.numel)} params, {human_count(tree.trainable_numel)} trainable)",
        f"{api}{origin}",
        f"world size {plan.world_size}",
        f"{len(plan.units)} unit{'s' if len(plan.units) != 1 else ''}",
        f"{layout.all_gathers_per_step} all-gathers + {layout.reduce_scatters_per_step} reduce-scatters per step",
        f"~{human_bytes(layout.memory.per_rank_bytes)}/rank",
    ]
    return " · ".join(parts)


def unit_table(res) -> str:
    from tabulate import tabulate

    rows = []
    for i, ul in enumerate(res.layout.units):
        u = ul.unit
        dt = "/".join(ul.dtypes) if ul.dtypes else "-"
        if ul.param_dtype not in ul.dtypes and ul.dtypes:
            dt += f"→{ul.param_dtype}"
        rows.append([
            i, unit_label(", ".join(unit_label(m) for m in u.modules)), u.cls, human_count(ul.numel),
            human_count(ul.trainable_numel), dt, human_count(ul.padded_numel), human_count(ul.shard_numel),
            f"{human_bytes(ul.all_gather_bytes)} ×{ul.all_gathers_per_step}",
            f"{human_bytes(ul.reduce_scatter_bytes)} ×{ul.reduce_scatters_per_step}",
            u.line or "",
        ])
    headers = ["#", "unit", "class", "params", "trainable", "dtype", "padded", "shard/rank",
               "all-gather/rank", "reduce-scatter/rank", "line"]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def params_table(res) -> str:
    from tabulate import tabulate

    plan = res.plan
    rows = []
    ws = plan.world_size
    for ul in res.layout.units:
        for p in ul.params:
            if plan.api == "fsdp1":
                rows.append([unit_label(ul.unit.module), p.fqn, _shape(p.shape), p.dtype,
                             "yes" if p.requires_grad else "no", p.offset, p.padding_before])
            else:
                pad_rows = (p.padded_numel // (p.numel // p.shape[0]) - p.shape[0]) if p.shape and p.shape[0] and p.numel else 0
                rows.append([unit_label(ul.unit.module), p.fqn, _shape(p.shape), p.dtype,
                             "yes" if p.requires_grad else "no", _shape(p.local_shape_first),
                             _shape(p.local_shape_last), pad_rows])
    if plan.api == "fsdp1":
        headers = ["unit", "parameter", "shape", "dtype", "trainable", "flat offset", "align pad before"]
    else:
        headers = ["unit", "parameter", "shape", "dtype", "trainable", "local (rank 0)", f"local (rank {ws - 1})",
                   "pad rows"]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def ranks_table(res) -> str:
    from tabulate import tabulate

    plan = res.plan
    rows = []
    for ul in res.layout.units:
        ws = ul.world_size
        for rank in range(ws):
            if plan.api == "fsdp1":
                spans = ul.rank_spans(rank)
                held = sum(s.numel for s in spans)
                desc = ", ".join(
                    f"{s.fqn}" if (s.start == 0 and s.end == _numel_of(ul, s.fqn)) else f"{s.fqn}[{s.start}:{s.end}]"
                    for s in spans) or "(padding only)"
                rows.append([unit_label(ul.unit.module), rank, f"{rank * ul.shard_numel}:{(rank + 1) * ul.shard_numel}",
                             held, ul.shard_numel - held, desc])
            else:
                parts = []
                held = 0
                for p in ul.params:
                    local = p.local_shape(rank, ws)
                    if not p.shape:
                        continue
                    rows_per = -(-p.shape[0] // ws) if p.shape[0] else 0
                    start = min(rank * rows_per, p.shape[0])
                    parts.append(f"{p.fqn}[{start}:{start + local[0]}]")
                    inner = p.numel // p.shape[0] if p.shape[0] else 0
                    held += local[0] * inner
                rows.append([unit_label(ul.unit.module), rank, "rows", held, ul.shard_numel - held, ", ".join(parts)])
    headers = ["unit", "rank", "flat range" if plan.api == "fsdp1" else "shard", "elements", "padding", "holds"]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True, maxcolwidths=[None] * 5 + [100])


def _numel_of(ul, fqn: str) -> int:
    for p in ul.params:
        if p.fqn == fqn:
            return p.numel
    return -1


def _source_line(path: str, line: int) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            for i, text in enumerate(fh, start=1):
                if i == line:
                    return text.rstrip("\n")
    except OSError:
        return None
    return None


def format_finding_full(f, base=None) -> str:
    out = [f"{display_path(f.path, base)}:{f.line}:{f.col}: {f.code} [{f.severity}] {f.message}"]
    src = _source_line(f.path, f.line) if f.line else None
    if src is not None:
        gutter = f"{f.line:>4} | "
        out.append(gutter + src)
        out.append(" " * (len(gutter) - 2) + "| " + " " * max(0, f.col - 1) + "^")
    if f.module or f.module == "":
        if f.module:
            out.append(f"     = module: {f.module}")
    if f.fix:
        out.append(f"     = fix: {f.fix}")
    if f.evidence:
        state = {True: "confirmed", False: "not confirmed", None: "not run"}[f.confirmed]
        out.append(f"     = --run: {state}: {f.evidence}")
    return "\n".join(out)


def format_finding_concise(f, base=None) -> str:
    conf = ""
    if f.confirmed is not None:
        conf = " (confirmed)" if f.confirmed else " (not confirmed)"
    return f"{display_path(f.path, base)}:{f.line}:{f.col}: {f.code} [{f.severity}] {f.message}{conf}"


def render_text(results, *, full: bool = True, layout: Optional[str] = None, statistics: bool = False,
                show_table: bool = True, run_summary: Optional[dict] = None) -> str:
    blocks: List[str] = []
    for res in results:
        if res.skipped:
            continue
        if full:
            header = f"{display_path(res.path)}: {summary_line(res)}"
            blocks.append(header)
            for f in res.findings:
                blocks.append(format_finding_full(f))
            if show_table:
                blocks.append(unit_table(res))
            if layout == "params":
                blocks.append(params_table(res))
            elif layout == "ranks":
                blocks.append(ranks_table(res))
        else:
            for f in res.findings:
                blocks.append(format_finding_concise(f))
    counts = summary_counts(results)
    total = sum(counts.values())
    if statistics:
        blocks.append(statistics_table(results))
    checked = sum(1 for r in results if not r.skipped)
    skipped = sum(1 for r in results if r.skipped)
    tail = f"Found {total} finding{'s' if total != 1 else ''} ({counts['error']} error, {counts['warning']} warning, " \
           f"{counts['info']} info) in {checked} file{'s' if checked != 1 else ''}"
    if skipped:
        tail += f"; {skipped} skipped (no model or FSDP use)"
    blocks.append(tail + ".")
    if run_summary is not None:
        blocks.append("--run: " + ", ".join(f"{k} {v}" for k, v in run_summary.items() if not isinstance(v, (dict, list))))
    return "\n\n".join(blocks) + "\n"


def statistics_table(results) -> str:
    from tabulate import tabulate

    counts: Dict[str, List] = {}
    for r in results:
        for f in r.findings:
            row = counts.setdefault(f.code, [0, f.code, f.name, f.severity])
            row[0] += 1
    rows = sorted(counts.values(), key=lambda r: (-r[0], r[1]))
    return tabulate(rows, headers=["count", "code", "name", "severity"], tablefmt="simple", disable_numparse=True)


# --------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------
def file_to_json(res, *, layout: Optional[str] = None) -> dict:
    path = display_path(res.path)
    if res.skipped:
        return {"path": path, "skipped": res.skipped}
    tree, plan, lay = res.tree, res.plan, res.layout
    units = []
    for ul in lay.units:
        u = ul.unit
        params = []
        for p in ul.params:
            entry = {"fqn": p.fqn, "shape": list(p.shape), "dtype": p.dtype, "requires_grad": p.requires_grad,
                     "numel": p.numel}
            if plan.api == "fsdp2":
                entry["local_shape"] = list(p.local_shape_first)
                entry["local_shape_last"] = list(p.local_shape_last)
                entry["padded_numel"] = p.padded_numel
            else:
                entry["offset"] = p.offset
                entry["padding_before"] = p.padding_before
            params.append(entry)
        unit = {
            "module": u.module, "modules": u.modules, "class": u.cls, "path": display_path(u.path) if u.line else None,
            "line": u.line or None, "origin": u.origin, "numel": ul.numel, "trainable_numel": ul.trainable_numel,
            "dtypes": ul.dtypes, "param_dtype": ul.param_dtype, "reduce_dtype": ul.reduce_dtype,
            "padded_numel": ul.padded_numel, "shard_numel": ul.shard_numel,
            "all_gather_bytes": ul.all_gather_bytes, "reduce_scatter_bytes": ul.reduce_scatter_bytes,
            "all_gathers_per_step": ul.all_gathers_per_step, "reduce_scatters_per_step": ul.reduce_scatters_per_step,
            "all_reduces_per_step": ul.all_reduces_per_step,
            "reshard_after_forward": u.reshard_after_forward, "is_root": u.is_root, "params": params,
        }
        if plan.api == "fsdp1" and layout == "ranks":
            unit["ranks"] = [[{"fqn": s.fqn, "start": s.start, "end": s.end} for s in ul.rank_spans(r)]
                             for r in range(ul.world_size)]
        units.append(unit)
    return {
        "path": path,
        "model": {"target": res.target, "class": tree.root_class, "numel": tree.numel,
                  "trainable_numel": tree.trainable_numel},
        "plan": {
            "api": plan.api, "world_size": plan.world_size, "root_wrapped": plan.root_wrapped,
            "use_orig_params": plan.use_orig_params, "sharding_strategy": plan.sharding_strategy,
            "origin": plan.origin, "units": units,
            "leftover_params": plan.leftover_params, "ignored_params": plan.ignored_params,
            "all_gathers_per_step": lay.all_gathers_per_step,
            "reduce_scatters_per_step": lay.reduce_scatters_per_step,
            "step_bytes": lay.step_bytes,
        },
        "memory": {"per_rank_bytes": lay.memory.per_rank_bytes, "breakdown": lay.memory.breakdown,
                   "optimizer": lay.memory.optimizer},
        "findings": [f.to_json(display_path(f.path)) for f in res.findings],
    }


def render_json(results, *, layout: Optional[str] = None, run_summary: Optional[dict] = None) -> str:
    counts = summary_counts(results)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "files": [file_to_json(r, layout=layout) for r in results],
        "summary": {"files": len(results), **counts},
    }
    if run_summary is not None:
        doc["run"] = run_summary
    return json.dumps(doc, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# SARIF 2.1.0 and GitHub annotations
# --------------------------------------------------------------------------------------------
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def repo_root(start: Optional[str] = None) -> str:
    d = os.path.abspath(start or os.getcwd())
    probe = d
    while True:
        if os.path.exists(os.path.join(probe, ".git")):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return d
        probe = parent


def render_sarif(results) -> str:
    from fsdp_lint.rule import all_rules

    root = repo_root()
    rules = all_rules()
    index = {r.code: i for i, r in enumerate(rules)}
    sarif_rules = []
    for r in rules:
        doc = r.doc()
        sarif_rules.append({
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": doc.split("\n\n")[0] if doc else r.summary},
            "help": {"text": doc or r.summary, "markdown": doc or r.summary},
            "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
            "properties": {"tags": ["fsdp", r.name]},
        })
    out_results = []
    for res in results:
        for f in res.findings:
            uri = os.path.relpath(os.path.abspath(f.path), root).replace(os.sep, "/")
            result = {
                "ruleId": f.code,
                "ruleIndex": index.get(f.code, 0),
                "level": _SARIF_LEVEL[f.severity],
                "message": {"text": f.message + (f" Fix: {f.fix}" if f.fix else "")},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
                    "region": {"startLine": max(1, f.line), "startColumn": max(1, f.col)},
                }}],
            }
            if f.module:
                result["properties"] = {"module": f.module}
            out_results.append(result)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "fsdp-lint", "version": __version__,
                                "informationUri": "https://github.com/fsdp-lint/fsdp-lint", "rules": sarif_rules}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": "file://" + root.rstrip("/") + "/"}},
            "results": out_results,
        }],
    }
    return json.dumps(doc, indent=2) + "\n"


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def render_github(results) -> str:
    lines = []
    level = {"error": "error", "warning": "warning", "info": "notice"}
    for res in results:
        for f in res.findings:
            msg = f.message + (f" Fix: {f.fix}" if f.fix else "")
            lines.append(
                f"::{level[f.severity]} file={_gh_escape(display_path(f.path), True)},line={f.line},col={f.col},"
                f"title={_gh_escape(f'{f.code} {f.name}', True)}::{_gh_escape(msg)}")
    return "\n".join(lines) + ("\n" if lines else "")
