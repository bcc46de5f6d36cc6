"""A failure of project code on a stand-in's value that no recorded use of the stand-in explains.

The uses of a stand-in (for an import that failed) are recorded where they happen; a failure on a line of
its traceback where one happened names the package. Some failures happen where the stand-in is only
read: ``assert init_device in ("meta", "cpu")`` with ``init_device`` from a stand-in's call three lines
above (list membership compares, it does not use), ``super().register(...)`` in a class built on a
stand-in base (``super()`` reads the bases' own attributes, which an empty stand-in class lacks),
``Runner.remote()`` of a class a stand-in decorated (``@ray.remote``). The failing line's values say
so: a stand-in, an object or class built on one, or a class one decorated."""
from __future__ import annotations

import ast
from typing import Optional, Set

from fsdp_lint.entry.project import is_local
from fsdp_lint.replay.imports import Missing, StubUse
from fsdp_lint.replay.line_values import dotted_path, named_on_line, statement_at, tree_of


def stand_in_on_failing_line(exc: BaseException) -> Optional[StubUse]:
    """The stand-in the innermost project line of `exc`'s traceback works on, as a use there."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        if is_local(tb.tb_frame.f_code.co_filename):
            last = tb
        tb = tb.tb_next
    if last is None:
        return None
    try:
        names = [_stand_in_name(value) for value in named_on_line(last.tb_frame, last.tb_lineno)]
    except Exception:  # noqa: BLE001  an explanation never turns the failure into fsdp-lint's own (a value
        return None    # whose attributes raise)
    name = next((n for n in names if n), None)
    return StubUse(name, last.tb_frame.f_code.co_filename, last.tb_lineno, in_model=False) if name else None


def _stand_in_name(value) -> Optional[str]:
    if isinstance(value, Missing):
        return value._fsdp_lint_name
    own = getattr(value, "__dict__", None)         # (a class's is a mappingproxy, a function's a dict)
    marker = own.get("_fsdp_lint_decorated_by") if callable(value) and hasattr(own, "get") else None
    if isinstance(marker, str):
        return marker          # a class or function a stand-in decorated (`@ray.remote`)
    kind = value if isinstance(value, type) else type(value)
    for base in getattr(kind, "__mro__", ()):
        name = base.__dict__.get("_fsdp_lint_stand_in")
        if isinstance(name, str):
            return name
    return None


def flows_into(path: str, use_line: int, failing_line: int) -> bool:
    """Whether what the statement at `use_line` of file `path` binds (``num_shards = len(wds.expand_urls(...))``)
    reaches the statement at `failing_line` (``assert num_shards % world == 0``), through the assignments
    between them. A stand-in met earlier that the failing line never reads (a dataclass field annotated with
    the missing package's class, a helper that built a transform) is not what failed."""
    failing = statement_at(path, failing_line)
    source = statement_at(path, use_line)
    if failing is None or source is None:
        return False
    if failing.lineno <= use_line <= (failing.end_lineno or failing.lineno):
        return True             # the failing statement used it itself
    given = _bound(source)
    if not given:
        return False
    between = sorted((n for n in ast.walk(tree_of(path) or failing)
                      if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                      and (source.end_lineno or source.lineno) < n.lineno < failing.lineno), key=lambda n: n.lineno)
    for stmt in between:
        if _reads(stmt) & given:
            given |= _bound(stmt)
    return bool(_reads(failing) & given)




def _bound(stmt: ast.stmt) -> Set[str]:
    """What an assignment binds: names and attribute chains (``self.num_shards``); what a method call
    statement fills in (its receiver)."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute):
        return {name for name in [dotted_path(stmt.value.func.value)] if name}    # `shards.extend(wds.expand(...))`
    else:
        targets = []
    out = set()
    for target in targets:
        for n in ast.walk(target):
            if isinstance(getattr(n, "ctx", None), ast.Store):
                name = dotted_path(n.value) if isinstance(n, ast.Subscript) else dotted_path(n)
                if name:
                    out.add(name)
    return out


def _reads(stmt: ast.stmt) -> Set[str]:
    """The names and attribute chains `stmt` reads, each with its prefixes (``cfg.data.shards`` reads ``cfg``,
    ``cfg.data`` and ``cfg.data.shards``)."""
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
            name = dotted_path(n)
            while name:
                out.add(name)
                name = name.rpartition(".")[0]
    return out
