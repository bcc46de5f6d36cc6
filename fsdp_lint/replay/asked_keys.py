"""The keys a script reads from the rows of a stood-in data set, learnt from a first attempt.

A stand-in (`fsdp_lint.replay.data_standins`) has the columns the script asks the ``datasets`` object
for. Code that reads the *rows* -- often after they left the library (``pd.DataFrame(ds)``,
``df.to_dict(orient="records")``, ``[dict(r) for r in ds]``) -- asks for its keys where the stand-in cannot
see it: ``assert "instruction" in example and "input" in example``, ``all(k in ex for k in
required_keys)``, ``example["output"]``, ``example.get("input")``, ``example.get(self.prompter.field_messages)``
(a key the config names), a prompt template's fields (``prompt_dict["prompt_inputs"].format_map(example)``);
a row is a dict, a ``datasets`` lazy row, or a batch of rows (``map(fn, batched=True)``). On the node the
data set has them.

The rule: when a replay's statement fails (skipped or fatal) in a frame that holds a row of a stand-in
(a dict whose values include the stand-in's placeholder), the keys that the frame's function reads from
that row by name are columns the script needs. They are learnt, and the replay runs again from the
start with stand-ins that have them (at most `ROUNDS` times; each round learns the keys of a new
failure). The keys come from the script's own code, never from a guess; a failure that learns nothing
new is reported as it is.
"""
from __future__ import annotations

import ast
import linecache
import string
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Set

ROUNDS = 4


def _is_row(value) -> bool:
    from fsdp_lint.replay.data_standins import TEXT, placeholder

    # a dict, or the lazy row ``datasets`` hands a ``map``/``filter`` function (a Mapping)
    if not isinstance(value, Mapping) or not value or len(value) > 256:
        return False
    chat = placeholder("messages")

    def held(v) -> bool:
        return v == TEXT or v == chat
    # a row, or a batch of rows (``map(fn, batched=True)``: each column a list of the rows' values)
    return any(held(v) or (isinstance(v, list) and v and all(held(x) for x in v))
               for v in value.values() if isinstance(v, (str, list)))


def _function_node(frame) -> Optional[ast.AST]:
    code = frame.f_code
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return None
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    if code.co_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and \
                getattr(node, "lineno", None) == code.co_firstlineno:
            return node
        decorated = getattr(node, "decorator_list", None)
        if decorated and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                min(d.lineno for d in decorated) == code.co_firstlineno:
            return node
    return None


def _value(expr, frame) -> Any:
    """The value of a plain name / constant-key subscript / attribute in `frame` (nothing is called)."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        if expr.id in frame.f_locals:
            return frame.f_locals[expr.id]
        return frame.f_globals.get(expr.id)
    if isinstance(expr, ast.Subscript):
        base, key = _value(expr.value, frame), _value(expr.slice, frame)
        try:
            return base[key] if isinstance(base, (dict, list, tuple)) else None
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(expr, ast.Attribute):
        base = _value(expr.value, frame)
        return getattr(base, expr.attr, None) if base is not None else None     # a callable strategy too
    return None


def _strings(value) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(v, str) for v in value):
        return list(value)
    return []


def _keys_read(fn: ast.AST, row_names: Set[str], frame) -> Set[str]:
    keys: Set[str] = set()
    loop_vars: Dict[str, List[str]] = {}      # `for k in required_keys` / `all(k in ex for k in KEYS)`
    for node in ast.walk(fn):
        gens = node.generators if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)) else []
        targets = [(g.target, g.iter) for g in gens] + ([(node.target, node.iter)] if isinstance(node, ast.For) else [])
        for target, it in targets:
            if isinstance(target, ast.Name):
                loop_vars[target.id] = _strings(_value(it, frame))

    def key_of(expr) -> List[str]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.Name):
            return loop_vars.get(expr.id) or _strings(frame.f_locals.get(expr.id))
        if isinstance(expr, (ast.Attribute, ast.Subscript)):
            return _strings(_value(expr, frame))     # a key the config names: `row.get(self.cfg.field_messages)`
        return []

    def is_row(expr) -> bool:
        return isinstance(expr, ast.Name) and expr.id in row_names

    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript) and is_row(node.value):
            keys.update(key_of(node.slice))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and is_row(node.comparators[0]):
            keys.update(key_of(node.left))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop") and is_row(node.func.value) and node.args:
                keys.update(key_of(node.args[0]))
            elif node.func.attr in ("format_map", "format") and (
                    any(is_row(a) for a in node.args) or any(k.arg is None and is_row(k.value) for k in node.keywords)):
                template = _value(node.func.value, frame)
                if isinstance(template, str):
                    try:
                        keys.update(f for _, f, _, _ in string.Formatter().parse(template) if f)
                    except ValueError:
                        pass
    return {k for k in keys if k and len(k) < 64}


def _frames(exc: BaseException) -> Iterable[Any]:
    tb = exc.__traceback__
    out = []
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return reversed(out[-8:])           # the innermost first


def keys_asked(exc: BaseException) -> Set[str]:
    """The keys the frames of `exc` read from stand-in rows that those rows lack."""
    found: Set[str] = set()
    for frame in _frames(exc):
        rows = {name: v for name, v in frame.f_locals.items() if _is_row(v)}
        if not rows:
            continue
        fn = _function_node(frame)
        if fn is None:
            continue
        have = set().union(*(set(r) for r in rows.values()))
        found |= _keys_read(fn, set(rows), frame) - have
    return found


def forget() -> None:
    """A new replay: no key learnt yet."""
    from fsdp_lint.replay import data_standins

    data_standins.ASKED.clear()


def learn(exceptions: Iterable[BaseException]) -> bool:
    """Add the keys the failures `exceptions` asked stand-in rows for to the stand-ins' columns; whether
    any is new (then the replay runs again)."""
    from fsdp_lint.replay import data_standins

    new = False
    for exc in exceptions:
        if exc is None:
            continue
        try:
            keys = keys_asked(exc)
        except Exception:  # noqa: BLE001 - learning is best effort; the failure is reported as it is
            continue
        for key in sorted(keys):
            if key not in data_standins.ASKED:
                data_standins.ASKED[key] = None
                new = True
    return new


def in_rounds(make_run, timeout):
    """``make_run().execute(timeout)``, again (a fresh run) while a round's failures learn new keys."""
    from fsdp_lint.replay.records import ReplayError

    import time

    forget()
    deadline = time.monotonic() + timeout if timeout else None
    for round_ in range(ROUNDS + 1):
        run = make_run()
        left = max(1.0, deadline - time.monotonic()) if deadline is not None else None
        last = round_ == ROUNDS or (left is not None and left < 0.25 * timeout)   # the rounds share the deadline
        try:
            result = run.execute(left)
        except ReplayError as exc:
            if not last and learn([exc.__cause__] + [s.exc for s in run.failures.skips]):
                continue
            raise
        if last or not learn([s.exc for s in run.failures.skips]):
            return result
    raise AssertionError("unreachable")  # pragma: no cover
