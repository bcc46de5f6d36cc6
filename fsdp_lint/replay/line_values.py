"""What a failing line of project code works on: the objects its names stand for in its frame.

A failure is explained by what its line was given: an ``assert init_device in ("meta", "cpu")`` whose
value came from a stand-in for a package that could not be imported, a ``super().register(...)`` in a
class built on such a stand-in, a ``Trainer(..., tokenizer=tok)`` whose ``Trainer`` is an installed
library's. The line is read as a statement of its file (the smallest statement that holds it, so that
a call over several lines is whole) and its names are looked up as Python would: locals, globals,
builtins."""
from __future__ import annotations

import ast
import linecache
import os
import types
from typing import Dict, List, Optional, Tuple

_TREES: Dict[Tuple[str, float], Optional[ast.AST]] = {}


def tree_of(fname: str) -> Optional[ast.AST]:
    """The parsed file `fname` (None where it cannot be read or parsed)."""
    try:
        key = (fname, os.path.getmtime(fname))
    except OSError:
        return None
    if key not in _TREES:
        try:
            _TREES[key] = ast.parse("".join(linecache.getlines(fname)))
        except (SyntaxError, ValueError):
            _TREES[key] = None
    return _TREES[key]


def statement_at(fname: str, line: int) -> Optional[ast.stmt]:
    """The innermost statement of `fname` that spans `line` (the branch's assignment, not its `if`)."""
    tree = tree_of(fname)
    best = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or (node.end_lineno or node.lineno) - node.lineno <= (best.end_lineno or best.lineno) - best.lineno:
                best = node
    return best


def _own_nodes(stmt: ast.stmt):
    """The nodes of `stmt` itself: not the bodies of the compound statements, functions or classes in it."""
    todo = [stmt]
    while todo:
        node = todo.pop()
        yield node
        for name, value in ast.iter_fields(node):
            if name in ("body", "orelse", "finalbody", "handlers") and isinstance(value, list) \
                    and value and isinstance(value[0], (ast.stmt, ast.excepthandler)):
                continue
            children = value if isinstance(value, list) else [value]
            todo.extend(c for c in children if isinstance(c, ast.AST))


def _look_up(frame: types.FrameType, name: str):
    for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
        if name in scope:
            return scope[name]
    return None


def called_on_line(frame: types.FrameType, line: int) -> List[object]:
    """What the calls of the statement at `line` call, by the name heading each (``Trainer`` of
    ``Trainer(...)``, ``trainer`` of ``trainer.fit(...)``)."""
    stmt = statement_at(frame.f_code.co_filename, line)
    out = []
    for node in _own_nodes(stmt) if stmt is not None else ():
        if isinstance(node, ast.Call):
            head = node.func
            while isinstance(head, ast.Attribute):
                head = head.value
            if isinstance(head, ast.Name):
                out.append(_look_up(frame, head.id))
    return out


def named_on_line(frame: types.FrameType, line: int) -> List[object]:
    """What each name the statement at `line` reads stands for; for a ``super()`` call, the frame's
    ``self`` or ``cls`` too (what ``super()`` looks up from)."""
    stmt = statement_at(frame.f_code.co_filename, line)
    out = []
    for node in _own_nodes(stmt) if stmt is not None else ():
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id == "super" and frame.f_code.co_argcount:
                out.append(frame.f_locals.get(frame.f_code.co_varnames[0]))
            else:
                out.append(_look_up(frame, node.id))
    return out


def dotted_path(node: ast.AST) -> Optional[str]:
    """``a.b.c`` of a name or an attribute chain; None for anything else (a call, a subscript)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted_path(node.value)
        return f"{base}.{node.attr}" if base else None
    return None
