"""Edits computed from the user's source with libcst: the exact ranges of calls, their arguments and
the statements that hold them, so that an edit touches only what the fix changes (formatting and
comments elsewhere are kept byte for byte). Every function returns plain `Edit`s, or None when the
source is not in a shape the fix can be made in mechanically (the finding keeps its text fix)."""
from __future__ import annotations

import functools
import os
from typing import Dict, List, Optional, Tuple

from fsdp_lint.fix.edits import Edit


@functools.lru_cache(maxsize=32)
def _parsed(path: str, mtime: float):
    import libcst as cst
    from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    wrapper = MetadataWrapper(cst.parse_module(text))
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    return wrapper.module, positions, parents, text.splitlines(keepends=True)


class Source:
    """One file's syntax tree with positions and parents."""

    def __init__(self, path: str):
        self.path = path
        self.module, self.positions, self.parents, self.lines = _parsed(path, os.path.getmtime(path))

    @classmethod
    def of(cls, path: str) -> Optional["Source"]:
        if not path or not os.path.isfile(path) or _foreign(path):
            return None
        try:
            return cls(path)
        except Exception:  # noqa: BLE001 - a file libcst cannot parse (its own grammar limits): no edit
            return None

    def start(self, node) -> Tuple[int, int]:
        p = self.positions[node].start
        return p.line, p.column + 1

    def end(self, node) -> Tuple[int, int]:
        p = self.positions[node].end
        return p.line, p.column + 1

    def code(self, node) -> str:
        return self.module.code_for_node(node)

    def calls_at(self, line: int, col: int = 0) -> List:
        """The calls that start at `line` (at `col` when given), outermost first."""
        import libcst as cst

        out = []
        for node, rng in self.positions.items():
            if isinstance(node, cst.Call) and rng.start.line == line and (not col or rng.start.column + 1 == col):
                out.append(node)
        out.sort(key=lambda n: self.positions[n].start.column)
        return out

    def statement(self, node):
        """The statement line (or compound statement) that holds `node`."""
        import libcst as cst

        while node is not None and not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            node = self.parents.get(node)
        return node

    def enclosing_loops(self, stmt) -> List:
        """The `for`/`while` statements around `stmt`, innermost first, up to the function or module."""
        import libcst as cst

        out, node = [], self.parents.get(stmt)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            if isinstance(node, (cst.For, cst.While)):
                out.append(node)
            elif isinstance(node, (cst.If, cst.With, cst.Try)):
                break      # the loop sits inside a condition: a statement after it would change what runs
            node = self.parents.get(node)
        return out

    def indent_of(self, stmt) -> str:
        line = self.lines[self.start(stmt)[0] - 1]
        return line[:len(line) - len(line.lstrip())]

    def insert_after(self, stmt, text: str) -> Edit:
        """A new statement (`text`, one line or several) after `stmt`, at its indentation."""
        end_line = self.end(stmt)[0]
        indent = self.indent_of(stmt)
        body = "".join(indent + t + "\n" for t in text.splitlines())
        return Edit(self.path, end_line + 1, 1, end_line + 1, 1, body)

    def replace(self, node, text: str) -> Edit:
        (l1, c1), (l2, c2) = self.start(node), self.end(node)
        return Edit(self.path, l1, c1, l2, c2, text)

    def remove_statement(self, stmt) -> Edit:
        l1, l2 = self.start(stmt)[0], self.end(stmt)[0]
        return Edit(self.path, l1, 1, l2 + 1, 1, "")


def _foreign(path: str) -> bool:
    """Installed code (a framework's, the standard library's) is never edited: only the user's own."""
    p = os.path.abspath(path).replace(os.sep, "/")
    return any(s in p for s in ("/site-packages/", "/dist-packages/", "/lib/python3"))


def wrap_call(src: Source, line: int, col: int = 0):
    """The wrap call (`fully_shard(...)`, `FSDP(...)`, ...) at a unit's recorded position."""
    calls = src.calls_at(line, col) or src.calls_at(line)
    return calls[0] if calls else None


def keyword(call, name: str):
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def set_keyword(src: Source, call, name: str, value: str) -> Optional[Edit]:
    """`name=value` in `call`: its value replaced when the keyword is there, else added after the
    last argument (on a line of its own when the arguments are one per line)."""
    existing = keyword(call, name)
    if existing is not None:
        return src.replace(existing.value, value)
    if not call.args:
        return None
    return _append_arg(src, call, f"{name}={value}")


def _append_arg(src: Source, call, text: str) -> Edit:
    last = call.args[-1]
    line, col = src.end(last.value)
    if line != src.start(call)[0]:        # one argument per line: the new one gets its own
        indent = _indent(src.lines[line - 1])
        return Edit(src.path, line, col, line, col, f",\n{indent}{text}")
    return Edit(src.path, line, col, line, col, f", {text}")


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def base_name(src: Source, expr) -> Optional[str]:
    """`model` of `model.layers`, `model.layers[0]`, `model.get_decoder().layers`."""
    import libcst as cst

    while True:
        if isinstance(expr, cst.Name):
            return expr.value
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            wrapper = isinstance(expr.func, cst.Name) and expr.func.value in _ITERATION_BUILTINS
            if isinstance(expr.func, cst.Name) and not wrapper:
                return None     # what a function returns (`wrap(wrap(block))`): not a variable's part
            expr = expr.args[0].value if wrapper and expr.args else expr.func
        else:
            return None


# calls that iterate their first argument: `for i, block in enumerate(model.layers)`
_ITERATION_BUILTINS = frozenset({"enumerate", "reversed", "list", "tuple", "iter", "zip", "sorted"})


def names_in(node) -> set:
    import libcst as cst

    out = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, n):
            out.add(n.value)

    node.visit(_V())
    return out


def keywords_text(src: Source, call, without: set) -> List[str]:
    """The call's keyword arguments as written, except those that use a name in `without`."""
    return [f"{a.keyword.value}={src.code(a.value).strip()}" for a in call.args if a.keyword is not None and not (names_in(a.value) & without)]


def apply_to_text(text: str, edits: List[Edit]) -> str:
    """`edits` (one file's, not overlapping) applied to `text`."""
    lines = text.splitlines(keepends=True)
    starts: Dict[int, int] = {}
    pos = 0
    for i, ln in enumerate(lines, start=1):
        starts[i] = pos
        pos += len(ln)
    starts[len(lines) + 1] = len(text)

    def offset(line: int, col: int) -> int:
        if line > len(lines):
            return len(text)
        return starts[line] + col - 1

    out = text
    for e in sorted(edits, key=lambda e: (e.line, e.col), reverse=True):
        a, b = offset(e.line, e.col), offset(e.end_line, e.end_col)
        content = e.content
        if a == len(out) and out and not out.endswith("\n") and e.col == 1:
            content = "\n" + content       # a statement appended after a last line without newline
        out = out[:a] + content + out[b:]
    return out


def loop_targets(loops) -> set:
    out = set()
    for loop in loops:
        target = getattr(loop, "target", None)
        if target is not None:
            out |= names_in(target)
    return out


def model_name(src: Source, expr, loops) -> Optional[str]:
    """The variable that holds the model a wrap call's argument is part of: `model` of `model.layers[0]`,
    of a loop `for block in model.layers` over its blocks, or of `blocks = model.layers` (aliases followed
    in the file, a few steps)."""
    import libcst as cst

    name = base_name(src, expr)
    bound = {}
    for node in src.positions:
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            bound.setdefault(node.targets[0].target.value, node.value)
    for _ in range(4):
        if name is None:
            return None
        loop = next((lp for lp in loops if name in names_in(lp.target)), None) if loops else None
        if loop is not None:
            name = base_name(src, loop.iter)
            continue
        value = bound.get(name)
        if isinstance(value, (cst.Attribute, cst.Subscript)):
            name = base_name(src, value)
            continue
        return name
    return None


def move_below(src: Source, stmt, anchor) -> Optional[List[Edit]]:
    """`stmt` (an assignment or a call statement in the same block as `anchor`, before it) moved to just
    after `anchor`,
    its lines as written -- when no statement in between uses the name it binds."""
    import libcst as cst

    block = src.parents.get(stmt)
    if block is None or src.parents.get(anchor) is not block or not isinstance(stmt, cst.SimpleStatementLine):
        return None
    body = list(block.body)
    if stmt not in body or anchor not in body or body.index(stmt) >= body.index(anchor):
        return None
    bound = set()
    for small in stmt.body:
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            continue        # a call statement (`fully_shard(model)`): binds nothing
        if not isinstance(small, (cst.Assign, cst.AnnAssign)):
            return None
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for t in targets:
            bound |= names_in(t)
    if any(names_in(s) & bound for s in body[body.index(stmt) + 1:body.index(anchor) + 1]):
        return None
    l1, l2 = src.start(stmt)[0], src.end(stmt)[0]
    text = "".join(src.lines[l1 - 1:l2])
    if not text.endswith("\n"):
        text += "\n"
    end = src.end(anchor)[0]
    return [Edit(src.path, l1, 1, l2 + 1, 1, ""), Edit(src.path, end + 1, 1, end + 1, 1, text)]
