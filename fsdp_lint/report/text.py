"""`report`: rendering only -- text (full/concise), JSON, SARIF 2.1.0 and GitHub annotations."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from fsdp_lint.check.rule import SEVERITIES
from fsdp_lint.humanize import display_path, exact_count as _n, human_bytes, human_count, unit_label  # noqa: F401
from fsdp_lint.report.width import fitted
from fsdp_lint.report.layout_tables import params_table, ranks_table  # noqa: F401 - the --layout tables

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def printable(text) -> str:
    """`text` with its control characters escaped (`\\n`, `\\x1b`, `\\u2028`): a module, class or path
    name from the linted code never starts a new line of the report (a `::error` line in a CI log, a
    forged finding) nor drives the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ch == "\t":
            out.append("    ")
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def file_label(res) -> str:
    """The file as the user named it, with the script's arguments when it ran with some."""
    args = getattr(res, "argv", None) or []
    shown = display_path(res.path)
    if args:
        import shlex

        shown += " -- " + " ".join(shlex.quote(a) for a in args)
    return shown


def summary_counts(results) -> Dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for r in results:
        for f in r.findings:
            counts[f.severity] += 1
    return counts


# --------------------------------------------------------------------------------------------
# text
# --------------------------------------------------------------------------------------------
_FRAMEWORK_NAMES = {"lightning": "Lightning", "accelerate": "accelerate", "transformers": "the HF Trainer"}


def summary_line(res) -> str:
    tree, plan, layout = res.tree, res.plan, res.layout
    api = plan.api or "no FSDP"
    origin = {"default": " (no wrap code: suggested per-block plan)", "cli": " (from --wrap)"}.get(plan.origin, "")
    ars = layout.all_reduces_per_step
    if getattr(plan, "framework", None) and plan.origin == "file":
        origin = f" (built by {_FRAMEWORK_NAMES.get(plan.framework, plan.framework)})"
    parts = [
        f"{tree.root_class} ({human_count(tree.numel)} params, {human_count(tree.trainable_numel)} trainable)",
        f"{api}{origin}",
        world_label(plan),
        f"{len(plan.units)} unit{'s' if len(plan.units) != 1 else ''}",
        f"{layout.all_gathers_per_step} all-gathers + {layout.reduce_scatters_per_step} reduce-scatters"
        + (f" + {ars} all-reduces" if ars else "") + " per step",
        memory_summary(layout.memory),
    ]
    tp = tp_summary(layout)
    if tp:
        parts.insert(5, tp)
    return " · ".join(parts)


def tp_summary(layout) -> str:
    """``TP (tp 2): 10 all-gathers + 10 reduce-scatters + 5 all-reduces per step``."""
    from fsdp_lint.plan.tp_comms import summary

    by_dim = summary(getattr(layout, "tp_collectives", []))
    out = []
    for dim, kinds in by_dim.items():
        size = next(c.group_size for c in layout.tp_collectives if c.mesh_dim == dim)
        text = " + ".join(f"{n} {k.replace('_', '-')}s" for k, n in sorted(kinds.items()))
        out.append(f"TP ({dim} {size}): {text} per step")
    return "; ".join(out)


def world_label(plan) -> str:
    """``world size 8``; ``mesh (dp 4, tp 2) at train.py:31`` when the file builds the mesh it shards
    over; the shard × replicate groups of HSDP/HYBRID_SHARD plans without a mesh."""
    if plan.mesh is not None:
        where = f" at {os.path.basename(plan.mesh.path)}:{plan.mesh.line}" if plan.mesh.path else ""
        return f"mesh {plan.mesh.label()}{where}"
    hybrid = [u for u in plan.units if u.replicate_size > 1]
    if hybrid:
        u = hybrid[0]
        return f"world size {plan.world_size} (shard {u.shard_size} × replicate {u.replicate_size})"
    return f"world size {plan.world_size}"


def unsupported_notes(res) -> List[str]:
    """What fsdp-lint did not model in this plan (``--allow-partial``), one line each."""
    out = []
    for item in getattr(res.plan, "unsupported", []):
        where = f"{display_path(item.path)}:{item.line}: " if item.path and item.line else ""
        out.append(f"{where}not modelled ({item.what}): {item.detail}")
    return out


def memory_summary(memory) -> str:
    """The estimate with what it covers: never a bare total that reads as the peak."""
    host = getattr(memory, "host_bytes", 0)
    offloaded = f", + {human_bytes(host)}/rank offloaded to the CPU" if host else ""
    if "activations" in memory.covers:
        return f"peak ~{human_bytes(memory.per_rank_bytes)}/rank on the device{offloaded} ({memory.activation_note})" \
            if host else f"peak ~{human_bytes(memory.per_rank_bytes)}/rank ({memory.activation_note})"
    return f"{memory.covers} ~{human_bytes(memory.per_rank_bytes)}/rank{' on the device' if host else ''}{offloaded} " \
           f"({memory.activation_note})"


def unit_table(res) -> str:
    rows = []
    with_ar = any(ul.all_reduces_per_step for ul in res.layout.units)
    for i, ul in enumerate(res.layout.units):
        u = ul.unit
        dt = "/".join(ul.dtypes) if ul.dtypes else "-"
        if ul.param_dtype not in ul.dtypes and ul.dtypes:
            dt += f"→{ul.param_dtype}"
        if ul.backward_all_gather_bytes is not None and ul.all_gathers_per_step == 2:
            # reshard_after_forward=<int>: the backward all-gather runs in smaller groups
            ag = f"{human_bytes(ul.all_gather_bytes)} + {human_bytes(ul.backward_all_gather_bytes)}"
        else:
            ag = f"{human_bytes(ul.all_gather_bytes)} ×{ul.all_gathers_per_step}"
        row = [
            i, unit_label(", ".join(unit_label(m) for m in u.modules)), u.cls, human_count(ul.numel),
            human_count(ul.trainable_numel), dt, human_count(ul.padded_numel), human_count(ul.shard_numel),
            ag, f"{human_bytes(ul.reduce_scatter_bytes)} ×{ul.reduce_scatters_per_step}",
        ]
        if with_ar:
            row.append(f"{human_bytes(ul.all_reduce_bytes)} ×{ul.all_reduces_per_step}")
        rows.append(row + [u.line or ""])
    headers = ["#", "unit", "class", "params", "trainable", "dtype", "padded", "shard/rank",
               "all-gather/rank", "reduce-scatter/rank"] + (["all-reduce/rank"] if with_ar else []) + ["line"]
    rows = [[printable(c) if isinstance(c, str) else c for c in row] for row in rows]
    return fitted(rows, headers, drop=UNIT_TABLE_DROP, wrap=("unit", "class"), min_wrap=24)


# the unit table's columns, least important first, left out one by one until the table fits the width
UNIT_TABLE_DROP = ("padded", "trainable", "line", "class", "dtype", "all-reduce/rank")


def _source_line(path: str, line: int) -> Optional[str]:
    import tokenize

    try:
        with tokenize.open(path) as fh:   # the file's own encoding, as Python reads it (BOM, coding line)
            for i, text in enumerate(fh, start=1):
                if i == line:
                    return text.rstrip("\n")
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None
    return None


def _caret_offset(src: str, col: int) -> int:
    """0-based caret position: the reported column, or the statement's first character when the column
    falls in the indentation (a column of 1 on an indented line means "this line")."""
    indent = len(src) - len(src.lstrip())
    return indent if col <= indent + 1 else col - 1


_SGR = {"path": "1", "error": "1;31", "warning": "1;33", "info": "1;36", "caret": "1;31", "fix": "36"}


def _paint(text: str, what: str, color: bool) -> str:
    """`text` in the terminal colour of `what` (ANSI SGR) when `color`; added after `printable`."""
    return f"\x1b[{_SGR[what]}m{text}\x1b[0m" if color else text


# concise shows at most this many characters of a message (the rules keep theirs shorter; a message
# made long by names from the linted code is cut, and `full` shows it whole)
from fsdp_lint.check.rule import MESSAGE_LIMIT  # noqa: E402,F401 - the rules' limit, kept by concise


def short_message(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _headline(f, base, unsafe: bool, color: bool, tail: str = "", limit: Optional[int] = None) -> str:
    sev = f.severity if f.severity in _SGR else "info"
    where = printable(f"{display_path(f.path, base)}:{f.line}:{f.col}:")
    marker = fix_marker(f, unsafe)
    message = printable(f.message)
    if limit:
        message = short_message(message, limit)
    return (f"{_paint(where, 'path', color)} {_paint(f.code, sev, color)}{_paint(marker, 'fix', color)} "
            f"{_paint('[' + f.severity + ']', sev, color)} {message}{printable(tail)}")


def fix_marker(f, unsafe: bool = False) -> str:
    """ruff's `[*]`: the finding's fix is one `--fix` applies (an unsafe one with `--unsafe-fixes`)."""
    fix = getattr(f, "fix_edits", None)
    return " [*]" if fix is not None and fix.applies(unsafe) else ""


def format_finding_full(f, base=None, unsafe: bool = False, color: bool = False) -> str:
    out = []
    caret = None
    src = _source_line(f.path, f.line) if f.line else None
    if src is not None:
        gutter = f"{f.line:>4} | "
        out.append(gutter + src.expandtabs(4))
        caret = " " * (len(gutter) - 2) + "| " + " " * _caret_offset(src.expandtabs(4), f.col)
    if f.call_site is not None:
        out.append(f"     = called from: {display_path(f.call_site[0], base)}:{f.call_site[1]}")
    if f.module or f.module == "":
        if f.module:
            out.append(f"     = module: {f.module}")
    if getattr(f, "detail", None):
        out.append(f"     = detail: {f.detail}")
    if f.fix:
        out.append(f"     = fix: {f.fix}")
    fix = getattr(f, "fix_edits", None)
    if fix is not None and fix.edits:
        label = "safe" if fix.applicability == "safe" else "unsafe, --unsafe-fixes"
        out.append(f"     = fix ({label}): {fix.title}")
    if f.evidence:
        state = {True: "confirmed", False: "not confirmed", None: "undetermined"}[f.confirmed]
        out.append(f"     = --run: {state}: {f.evidence}")
    lines = [printable(line) for line in out]
    if caret is not None:
        lines.insert(1, printable(caret) + _paint("^", "caret", color))
    return "\n".join([_headline(f, base, unsafe, color)] + lines)


def format_finding_concise(f, base=None, unsafe: bool = False, color: bool = False) -> str:
    conf = ""
    if f.confirmed is not None:
        conf = " (confirmed)" if f.confirmed else " (not confirmed)"
    via = f" (called from {display_path(f.call_site[0], base)}:{f.call_site[1]})" if f.call_site else ""
    return _headline(f, base, unsafe, color, f"{conf}{via}", limit=MESSAGE_LIMIT)


def render_text(results, *, full: bool = True, layout: Optional[str] = None, statistics: bool = False,
                show_table: bool = True, run_summary: Optional[dict] = None, failures=(),
                fixes: Optional[dict] = None, color: bool = False) -> str:
    """`fixes`: {"unsafe": --unsafe-fixes given, "fixed": findings --fix fixed (None: no --fix)}."""
    fixes = fixes or {}
    unsafe = bool(fixes.get("unsafe"))
    blocks: List[str] = []
    for res in results:
        if res.skipped:
            continue
        if full:
            # each line escaped on its own: a note's own line break is the report's, one inside a name is not
            lines = [f"{file_label(res)}: {summary_line(res)}"]
            lines += [f"  note: {note}" for note in getattr(res, "notes", None) or []]
            blocks.append("\n".join(printable(line) for line in lines + unsupported_notes(res)))
            for f in res.findings:
                blocks.append(format_finding_full(f, unsafe=unsafe, color=color))
            if show_table:
                blocks.append(unit_table(res))
            if layout == "params":
                blocks.append(params_table(res))
            elif layout == "ranks":
                blocks.append(ranks_table(res))
            elif layout == "diagram":
                from fsdp_lint.report.diagram import layout_diagram

                blocks.append(layout_diagram(res))
            if getattr(res, "granularity", None):
                from fsdp_lint.report.granularity import granularity_table

                blocks.append(granularity_table(res))
            if getattr(res, "simulated", None):
                blocks.append(simulated_text(res))
            if getattr(res, "suggestions", None):
                from fsdp_lint.report.budget_text import suggestions_table

                blocks.append(suggestions_table(res))
        elif res.findings:      # one line per finding, no blank line between them
            blocks.append("\n".join(format_finding_concise(f, unsafe=unsafe, color=color) for f in res.findings))
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
    if failures:
        tail += f"; {len(failures)} could not be linted (errors on stderr)"
    fixed = fixes.get("fixed")
    if fixed is not None:
        tail = f"Found {total + fixed} finding{'s' if total + fixed != 1 else ''} ({fixed} fixed, {total} remaining)" \
               + tail[tail.index(")") + 1:]
    tail += "."
    fixable = [f for r in results for f in r.findings if getattr(f, "fix_edits", None) is not None
               and f.fix_edits.edits]
    shown = sum(1 for f in fixable if f.fix_edits.applies(unsafe))
    hidden = len(fixable) - shown
    if shown and fixed is None:
        tail += f"\n[*] {shown} fixable with the `--fix` option"
        tail += f" ({hidden} hidden fix{'es' if hidden != 1 else ''} can be enabled with the `--unsafe-fixes` option)." \
            if hidden else "."
    elif hidden:
        tail += (f"\n{hidden} hidden fix{'es' if hidden != 1 else ''} can be enabled with the `--unsafe-fixes` "
                 f"option.")
    blocks.append(tail)
    if run_summary is not None:
        blocks.append(run_summary_text(run_summary))
    return "\n\n".join(blocks) + "\n"


# the rows of the memory comparison: (label, static breakdown keys, simulated breakdown keys)
MEMORY_ROWS = [
    ("sharded parameters", ("sharded_params",), ("sharded_params",)),
    ("unsharded parameters + all-gather buffers", ("unsharded_params_in_flight", "all_gather_buffers"),
     ("unsharded_params", "all_gather_buffers")),
    ("gradients (sharded, unsharded, reduce-scatter)", ("sharded_grads", "unsharded_grads", "reduce_scatter_buffers"),
     ("sharded_grads", "unsharded_grads", "reduce_scatter_buffers")),
    ("optimizer state", ("optimizer_state",), ("optimizer_state",)),
    ("activations", ("activations",), ("activations",)),
    ("temporaries", ("temporaries",), ("temporaries",)),
    ("inputs", ("inputs",), ("inputs",)),
    ("buffers", (), ("buffers",)),
    ("replicated (outside every unit)", ("replicated_params_grads_state",), ()),
]


def simulated_text(res) -> str:
    """`--simulate`: the measured peak and where, its breakdown beside the static estimate, and the
    collectives counted beside the static ones."""
    sim, mem, lay = res.simulated, res.layout.memory, res.layout
    if "error" in sim:
        return f"--simulate: not measured: {sim['error']}"
    at = sim.get("peak_at") or {}
    where = f" in {at['phase']} of {unit_label(at['module'])} (step {at['step']})" if at else ""
    head = (f"--simulate: rank 0 of {sim['world_size']} under the fake process group ({sim['measure']}), "
            f"{sim['steps']} steps, inputs {sim['inputs']}, {sim['optimizer'] or 'no optimizer'}, "
            f"{sim['wall_time_s']} s: peak {human_bytes(sim['peak_bytes'])}/rank{where}")
    rows = []
    for label, skeys, mkeys in MEMORY_ROWS:
        st = sum(mem.breakdown.get(k, 0) for k in skeys)
        me = sum(sim["breakdown"].get(k, 0) for k in mkeys)
        if st or me:
            rows.append([label, human_bytes(me), human_bytes(st) if skeys else "-"])
    ratio = mem.per_rank_bytes / sim["peak_bytes"] if sim["peak_bytes"] else 0.0
    rows.append(["total", human_bytes(sim["peak_bytes"]),
                 f"{human_bytes(mem.per_rank_bytes)} ({ratio:.2f}x, {mem.phase})"])
    table = fitted(rows, ["per rank", "simulated (at the peak)", f"static estimate ({mem.covers})"],
                   wrap=("per rank", f"static estimate ({mem.covers})", "simulated (at the peak)"))
    c = sim["collectives"]
    coll = (f"collectives per step: {c['all_gathers_per_step']} all-gathers "
            f"({human_bytes(c['all_gather_bytes_per_step'])}/rank) + {c['reduce_scatters_per_step']} reduce-scatters "
            f"({human_bytes(c['reduce_scatter_bytes_per_step'])}/rank); static {lay.all_gathers_per_step} "
            f"({human_bytes(sum(u.all_gather_bytes * u.all_gathers_per_step for u in lay.units))}) + "
            f"{lay.reduce_scatters_per_step} "
            f"({human_bytes(sum(u.reduce_scatter_bytes * u.reduce_scatters_per_step for u in lay.units))})")
    static_all_reduces = sum(u.all_reduces_per_step for u in lay.units)
    if c.get("all_reduces_per_step") or static_all_reduces:      # HSDP: the replicas' all-reduces
        coll += f"; all-reduces {c.get('all_reduces_per_step', 0)}, static {static_all_reduces}"
    return "\n".join([head, table, coll])


def run_summary_text(run: dict) -> str:
    """The `--run` summary: backend, ranks, steps, wall time, then per file what was measured."""
    if "files" not in run:
        return "--run: " + ", ".join(f"{k} {v}" for k, v in run.items() if not isinstance(v, (dict, list)))
    lines = [f"--run: {run['backend']} on {run['device']}, {run['ranks']} rank{'s' if run['ranks'] != 1 else ''} "
             f"({run['mode']}), {run['steps']} step{'s' if run['steps'] != 1 else ''}, {run['wall_time_s']} s: "
             f"{run['confirmed']} confirmed, {run['not_confirmed']} not confirmed, {run['undetermined']} undetermined"]
    for fs in run["files"]:
        parts = [fs["status"]]
        if fs.get("inputs"):
            parts.append(f"inputs {fs['inputs']}")
        m, st = fs.get("measured") or {}, fs.get("static") or {}
        if m and fs.get("status") == "completed":
            parts.append(f"measured per step {m['all_gathers_per_step']} all-gathers "
                         f"({human_bytes(m['all_gather_bytes_per_step'])}/rank) + {m['reduce_scatters_per_step']} "
                         f"reduce-scatters ({human_bytes(m['reduce_scatter_bytes_per_step'])}/rank), static "
                         f"{st['all_gathers_per_step']} ({human_bytes(st['all_gather_bytes_per_step'])}) + "
                         f"{st['reduce_scatters_per_step']} ({human_bytes(st['reduce_scatter_bytes_per_step'])})")
        peaks = [p for p in fs.get("peak_memory_bytes") or [] if p]
        if peaks:
            parts.append(f"peak memory {human_bytes(max(peaks))}/rank ({fs.get('memory_measure')}), static estimate "
                         f"{human_bytes(st.get('memory_per_rank_bytes', 0))} for {st.get('world_size')} ranks")
        rss = [p for p in fs.get("rss_peak_bytes") or [] if p]
        if rss:
            parts.append(f"process RSS peak {human_bytes(max(rss))} (Python, torch and allocator caches included)")
        lines.append(f"  {fs['path']}: " + "; ".join(parts))
    return "\n".join(lines)


def statistics_table(results) -> str:
    counts: Dict[str, List] = {}
    confirmed: Dict[str, int] = {}
    ran = False
    for r in results:
        for f in r.findings:
            row = counts.setdefault(f.code, [0, f.code, f.name, f.severity])
            row[0] += 1
            confirmed[f.code] = confirmed.get(f.code, 0) + (f.confirmed is True)
            ran = ran or f.confirmed is not None or bool(f.evidence)
    rows = sorted(counts.values(), key=lambda r: (-r[0], r[1]))
    headers = ["count", "code", "name", "severity"]
    if ran:  # --run: how many of them the real session confirmed
        rows = [row + [confirmed[row[1]]] for row in rows]
        headers.append("confirmed")
    return fitted(rows, headers, wrap=("name",))


# --------------------------------------------------------------------------------------------
# JSON


def settings_text(settings, path: str) -> str:
    """`--show-settings`: where the configuration came from and what is in effect for `path`."""
    from fsdp_lint.check.rule import all_rules
    from fsdp_lint.check.selection import rule_enabled
    from fsdp_lint.gpus import DEFAULT_GPU

    enabled = [r.code for r in all_rules() if rule_enabled(r.code, settings, path)]
    rows = [
        ("path", display_path(path)),
        ("config file", display_path(settings.config_path) if settings.config_path else "(none: the defaults)"),
        ("world size", f"{settings.world_size} ({settings.world_size_source})"),
        ("gpus per node", getattr(settings, "gpus_per_node", None)),
        ("gpu", getattr(settings, "gpu", None) or f"{DEFAULT_GPU} (default)"),
        ("select", ", ".join(settings.select) if settings.select is not None else "-"),
        ("extend-select", ", ".join(settings.extend_select) or "-"),
        ("ignore", ", ".join(settings.ignore) or "-"),
        ("command line", ", ".join(f"{k.replace('_', '-')}={','.join(v)}" for k, v in
                                   (settings.cli_selection or {}).items() if v) or "-"),
        ("per-file-ignores", ", ".join(f"{k}: {','.join(v)}" for k, v in (settings.per_file_ignores or {}).items())
         or "-"),
        ("fail on", settings.fail_on),
        ("rules enabled", f"{len(enabled)}: {', '.join(enabled)}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {printable(v)}\n" for k, v in rows)
