"""How wide the text report may be, and tables that fit it.

The width is `COLUMNS` when set (a positive integer), else the terminal's width when the report goes
to one, else 80 (a log, a file, a pipe). A table wider than that leaves out its least important
columns, in the order the caller names them, then wraps the columns that can wrap; the report says
which columns it left out, so nothing is lost silently (JSON has every figure).
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence, Tuple

DEFAULT_WIDTH = 80
MIN_WRAP = 8           # a wrapped column keeps at least this many characters


def output_width(stream=None) -> int:
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    stream = stream if stream is not None else sys.stdout
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or DEFAULT_WIDTH
    except (AttributeError, OSError, ValueError):
        pass
    return DEFAULT_WIDTH


def _render(rows, headers, cols, maxw) -> str:
    from tabulate import tabulate

    import tabulate as tabulate_module

    limits = [maxw.get(i) for i in cols] if maxw else None
    padding = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = 0          # a column as wide as its widest cell or header line, no wider
    try:
        return tabulate([[row[i] for i in cols] for row in rows], headers=[headers[i] for i in cols],
                        tablefmt="simple", disable_numparse=True, maxcolwidths=limits, maxheadercolwidths=limits)
    finally:
        tabulate_module.MIN_PADDING = padding


def _wrapped_headers(rows, headers) -> List[str]:
    """Headers over several lines, broken at spaces and after a `/`, down to the width of their
    column's cells (`forward peak (unsharded)` over `18.9 MB`, `all-gather/` `rank` over `4.73 MB ×2`):
    narrower, nothing lost."""
    import re

    out = []
    for i, header in enumerate(headers):
        header = str(header)
        cells = max((len(str(r[i])) for r in rows), default=0)
        pieces = re.findall(r"[^ /]*/|[^ /]+", header)
        limit = max([cells] + [len(p) for p in pieces])
        lines: List[str] = []
        for piece in pieces:
            if lines:
                glue = "" if lines[-1].endswith("/") else " "
                if len(lines[-1]) + len(glue) + len(piece) <= limit:
                    lines[-1] += glue + piece
                    continue
            lines.append(piece)
        out.append("\n".join(lines) if lines else header)
    return out


def _widest(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _col_widths(text: str) -> List[int]:
    """Column widths read from the rule line under the headers (`----  ------`)."""
    lines = text.split("\n")
    rule = next((ln for ln in lines if ln and set(ln) <= {"-", " "}), "")
    return [len(seg) for seg in rule.split("  ") if seg]


def fit_table(rows: Sequence[Sequence], headers: Sequence[str], width: Optional[int] = None,
              drop: Sequence[str] = (), wrap: Sequence[str] = (), min_wrap: int = MIN_WRAP,
              last_resort: Sequence[str] = ()) -> Tuple[str, List[str], int]:
    """The table rendered (tabulate "simple") within `width` columns: the columns named in `drop`
    are left out one by one, in that order, until it fits; then the columns in `wrap` are wrapped
    (widest first, down to `min_wrap` characters, or its entry for the column when a dict); when that is
    not enough, the columns in `last_resort`
    are left out one by one and the wrapping done again. Returns the text, the headers left out and the
    width the whole table needs."""
    width = width or output_width()
    rows = [list(r) for r in rows]
    headers = list(headers)
    cols = list(range(len(headers)))
    text = _render(rows, headers, cols, None)
    full = _widest(text)
    left_out: List[str] = []
    names = list(headers)
    if _widest(text) > width:
        headers = _wrapped_headers(rows, headers)
        text = _render(rows, headers, cols, None)
    for name in drop:
        if _widest(text) <= width:
            break
        if name in names and names.index(name) in cols:
            cols.remove(names.index(name))
            left_out.append(name)
            text = _render(rows, headers, cols, None)
    text = _wrap_to(rows, headers, names, cols, text, width, wrap, min_wrap)
    for name in last_resort:
        if _widest(text) <= width:
            break
        if name in names and names.index(name) in cols:
            cols.remove(names.index(name))
            left_out.append(name)
            text = _wrap_to(rows, headers, names, cols, _render(rows, headers, cols, None), width, wrap, min_wrap)
    return text, left_out, full


def _wrap_to(rows, headers, names, cols, text, width, wrap, min_wrap) -> str:
    """`text` with the `wrap` columns wrapped (widest first, down to `min_wrap`) until it fits `width`."""
    maxw = {}
    for _ in range(4 * max(1, len(wrap))):
        excess = _widest(text) - width
        if excess <= 0:
            break
        widths = dict(zip(cols, _col_widths(text)))
        floor = {n: min_wrap.get(n, MIN_WRAP) if isinstance(min_wrap, dict) else min_wrap for n in wrap}
        can = [names.index(n) for n in wrap if n in names and names.index(n) in cols
               and widths.get(names.index(n), 0) > floor[n]]
        if not can:
            break
        i = max(can, key=lambda c: widths[c])
        maxw[i] = max(floor[names[i]], widths[i] - excess)
        text = _render(rows, headers, cols, maxw)
    return text


def left_out_note(left_out: Sequence[str], full: int, width: Optional[int] = None) -> str:
    """The lines under a table that left columns out: which, and the width that shows them all."""
    import textwrap

    if not left_out:
        return ""
    width = width or output_width()
    return "\n".join(textwrap.wrap(f"(not shown in {width} columns: {', '.join(left_out)}; COLUMNS={full} "
                                   f"shows them)", max(40, width)))


def fitted(rows, headers, drop=(), wrap=(), min_wrap: int = 8, last_resort=()) -> str:
    """A table within the output width (`report.width`), with a line naming the columns it left out."""
    text, left_out, full = fit_table(rows, headers, drop=drop, wrap=wrap, min_wrap=min_wrap, last_resort=last_resort)
    note = left_out_note(left_out, full)
    return text + ("\n" + note if note else "")
