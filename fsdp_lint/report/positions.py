"""Where a finding ends: the end of the expression or statement that starts at its `line:col`, read
from the file's syntax (GitHub annotations `endLine`/`endColumn`, SARIF `region.endLine/endColumn`,
GitLab `lines.end`). Findings carry only their start; the end is known when a node of the file starts
there (a wrap call, an optimizer, a policy argument) and unknown otherwise (a config file, a line of
a file that changed since).
"""
from __future__ import annotations

import ast
from functools import lru_cache
from typing import Dict, Optional, Tuple

Position = Tuple[int, int]          # (line, column), both 1-based; the column is one past the last character


@lru_cache(maxsize=64)
def _starts(path: str, stamp: Tuple[int, int]) -> Optional[Tuple[Dict[Position, Position], Dict[int, Position], Tuple[str, ...]]]:
    """For each (line, 1-based column) where a node starts: the farthest end of a node starting
    there; for each line: the end of the first statement on it."""
    import tokenize

    try:
        with tokenize.open(path) as fh:      # the file's own encoding, as Python reads it
            text = fh.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    lines = tuple(text.splitlines())

    def column(line: int, byte_offset: int) -> int:
        """ast's UTF-8 byte offset as a 1-based character column."""
        src = lines[line - 1] if 0 < line <= len(lines) else ""
        return len(src.encode("utf-8")[:byte_offset].decode("utf-8", "replace")) + 1

    by_start: Dict[Position, Position] = {}
    by_line: Dict[int, Position] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.expr, ast.stmt)) or getattr(node, "end_lineno", None) is None:
            continue
        start = (node.lineno, column(node.lineno, node.col_offset))
        end = (node.end_lineno, column(node.end_lineno, node.end_col_offset))
        if end > by_start.get(start, (0, 0)):
            by_start[start] = end
        if isinstance(node, ast.stmt) and (node.lineno not in by_line or start[1] < by_line[node.lineno][0]):
            by_line[node.lineno] = (start[1], end)  # type: ignore[assignment]
    stmt_ends = {ln: v[1] for ln, v in by_line.items()}   # type: ignore[index]
    return by_start, stmt_ends, lines


def end_position(path: str, line: int, col: int) -> Optional[Position]:
    """The end of what the finding at `line:col` points at; None when no node of the file starts
    there. A column in the line's indentation (col 1 on an indented line: "this line") means the
    statement that starts the line."""
    if not path or not line or not str(path).endswith(".py"):
        return None
    import os

    try:
        st = os.stat(path)
    except OSError:
        return None
    found = _starts(path, (st.st_mtime_ns, st.st_size))      # a file --fix rewrote is read again
    if found is None:
        return None
    by_start, stmt_ends, lines = found
    end = by_start.get((line, col))
    if end is None and 0 < line <= len(lines):
        src = lines[line - 1]
        indent = len(src) - len(src.lstrip())
        if col <= indent + 1:
            end = stmt_ends.get(line)
    return end

