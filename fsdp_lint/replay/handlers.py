"""The script's own exception handlers: a failure that an enclosing ``try`` of the project catches by
name, and does not raise again, is the script's business -- it runs that handler on a GPU node too.

The replay skips a failing setup statement as if it had worked (a data set, a tokenizer, a file the
simulated node lacks). Skipping the statement that a project handler is waiting for would change the
script's control flow: ``if profile is None: raise EnvError(...)`` skipped makes the helper return
``None`` where its caller's ``except EnvError: return torch.bfloat16`` picks the precision, and the plan
says float16 where the job runs bf16. So such a failure is not skipped; it travels to the handler, as
Python delivers it.

Only handlers that name the failure's class (or a base of it other than ``Exception`` and
``BaseException``) count: a blanket ``except Exception`` around a whole ``main()`` is a logger, not a
decision, and a handler that raises (``except KeyError: raise ConfigError(...)``) ends the script
there on a node too. Read from the syntax tree of the project file of each frame on the stack, up to
the replay's own runner; handler classes are evaluated in the frame (names and attributes only).
"""
from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Tuple

from fsdp_lint.replay.records import FSDP_LINT_DIR

_TRY = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_BLANKET = (Exception, BaseException)

_trees: Dict[str, Optional[Tuple[float, ast.Module]]] = {}
_handlers_at: Dict[Tuple[str, float, int], List[ast.ExceptHandler]] = {}

# Python's protocol methods: what they raise is control flow a caller in C takes (`getattr(obj, name,
# default)` and `hasattr` catch the AttributeError of `__getattr__`), never a statement to skip
PROTOCOL_METHODS = frozenset({
    "__getattr__", "__getattribute__", "__getitem__", "__missing__", "__contains__", "__len__", "__iter__",
    "__next__", "__bool__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__index__",
    "__int__", "__float__", "__str__", "__repr__", "__format__", "__dir__", "__reduce__", "__reduce_ex__",
    "__getstate__", "__setstate__", "__copy__", "__deepcopy__", "__fspath__", "__set_name__", "__class_getitem__",
    "__instancecheck__", "__subclasscheck__", "__get__", "__enter__", "__exit__"})


def _tree(path: str) -> Optional[ast.Module]:
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    cached = _trees.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        with open(path, encoding="utf-8-sig") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    _trees[path] = (mtime, tree)
    return tree


def _enclosing_handlers(path: str, line: int) -> List[ast.ExceptHandler]:
    """The handlers of the ``try`` statements whose body holds `line`, innermost first, within the
    innermost function or class body that holds it (a ``try`` outside a ``def`` is another frame's)."""
    tree = _tree(path)
    if tree is None:
        return []
    key = (path, _trees[path][0], line)
    found = _handlers_at.get(key)
    if found is not None:
        return found
    tries: List[ast.stmt] = []
    node: ast.AST = tree
    while True:
        inner = None
        for child in ast.iter_child_nodes(node):
            start, end = getattr(child, "lineno", None), getattr(child, "end_lineno", None)
            if start is not None and end is not None and start <= line <= end:
                inner = child
                break
        if inner is None:
            break
        if isinstance(inner, _SCOPES) and not _in_header(inner, line):
            tries = []
        if isinstance(inner, _TRY) and inner.body and inner.body[0].lineno <= line <= inner.body[-1].end_lineno:
            tries.append(inner)
        node = inner
    found = [h for t in reversed(tries) for h in t.handlers]
    _handlers_at[key] = found
    return found


def _in_header(scope: ast.AST, line: int) -> bool:
    """`line` is in a ``def``'s decorators or arguments (evaluated in the enclosing frame), not its body."""
    body = getattr(scope, "body", None)
    if not isinstance(body, list) or not body:
        return False
    return line < body[0].lineno


def _reraises(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in ("exit", "_exit", "abort"):
                return True
    return False


def _classes(expr: ast.expr, frame) -> Tuple[type, ...]:
    """The exception classes a handler names, evaluated in `frame` (names and attributes only)."""
    parts = expr.elts if isinstance(expr, ast.Tuple) else [expr]
    out = []
    for part in parts:
        if not all(isinstance(n, (ast.Name, ast.Attribute, ast.Load)) for n in ast.walk(part)):
            continue
        try:
            value = eval(compile(ast.Expression(body=part), "<handler>", "eval"), frame.f_globals, frame.f_locals)
        except Exception:
            continue
        for cls in (value if isinstance(value, tuple) else (value,)):
            if isinstance(cls, type) and issubclass(cls, BaseException):
                out.append(cls)
    return tuple(out)


def _catches(handler: ast.ExceptHandler, exc: BaseException, frame) -> bool:
    if handler.type is None:
        return False                      # a bare `except:` is a blanket handler
    named = [c for c in _classes(handler.type, frame) if c not in _BLANKET]
    return any(isinstance(exc, c) for c in named) and not _reraises(handler)


def handled_by_the_script(exc: BaseException, frame, line: int, is_project) -> bool:
    """Whether a ``try`` of the project around the statement at `line` of `frame`, or around a call
    further up the stack, catches `exc` by name and does not raise again."""
    f, at = frame, line
    for _ in range(64):
        if f is None:
            return False
        path = os.path.abspath(f.f_code.co_filename)
        if path.startswith(FSDP_LINT_DIR + os.sep):
            return False                  # the replay's own runner: the top of the script's stack
        if is_project(path):
            for handler in _enclosing_handlers(path, at):
                if _catches(handler, exc, f):
                    return True
        f = f.f_back
        at = f.f_lineno if f is not None else 0
    return False
