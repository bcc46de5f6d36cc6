"""A later failure that follows from a skipped one through an object the skipped statement worked on.

``cfg.validate()`` fails here (a data folder this machine lacks) and is skipped; the validator would
have set ``cfg.dp`` from the world size, and ``build_mesh(cfg)`` later asserts on it. The names a
skipped statement binds do not link the two (it binds nothing); the objects it acted on do: the
receivers and arguments of its calls (``cfg`` of ``cfg.validate()``, ``state`` of
``state.update(load(path))``, ``args`` of ``check_args(args)``). A later failure whose traceback
holds one of those objects in a frame of project code is reported as a consequence of the skip.
"""
from __future__ import annotations

import ast
import os
import sys
import types
from typing import List

# values that are never "state a statement left half-set"
_PLAIN = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.ModuleType, type,
          types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _value(node: ast.AST, frame):
    """The value of a name or a chain of plain attributes (instance dicts only: no property runs) in
    `frame`, or a sentinel."""
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            return frame.f_locals[node.id]
        return frame.f_globals.get(node.id, _value)
    if isinstance(node, ast.Attribute):
        base = _value(node.value, frame)
        if base is _value:
            return _value
        try:
            return vars(base).get(node.attr, _value)
        except TypeError:
            return _value
    return _value


def _is_state(value) -> bool:
    """Configuration or state a statement may leave half-set: containers, namespaces, config objects
    and instances of the project's own classes -- not loggers, tensors or other library objects that
    every frame shares."""
    from fsdp_lint.entry.project import is_local

    if isinstance(value, _PLAIN):
        return False
    if isinstance(value, (dict, list, set, types.SimpleNamespace)):
        return True
    cls = type(value)
    if cls.__name__ in ("Namespace", "DictConfig", "ListConfig"):
        return True
    module = sys.modules.get(cls.__module__)
    return is_local(getattr(module, "__file__", None) or "")


def acted_on(stmt: ast.stmt, frame) -> List[object]:
    """The objects `stmt` acts on in `frame`: the receivers and name/attribute arguments of its
    calls, the objects it stores an item or attribute into (``state["model"] = ...``) -- state only."""
    out, seen = [], set()
    for node in ast.walk(stmt):
        exprs = []
        if isinstance(node, ast.Call):
            exprs = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            if _may_set_arguments(node.func, frame):
                exprs += [a for a in node.args if isinstance(a, (ast.Name, ast.Attribute))]
                exprs += [k.value for k in node.keywords if isinstance(k.value, (ast.Name, ast.Attribute))]
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            exprs = [node.value]
        for expr in exprs:
            value = _value(expr, frame)
            if value is _value or id(value) in seen or not _is_state(value):
                continue
            seen.add(id(value))
            out.append(value)
    return out


def left_half_set(exc: BaseException) -> List[object]:
    """The objects the failing calls of a skipped statement were working on: ``self`` of each project frame of
    its traceback (``workers.init_all()`` failing inside a worker's ``init_model`` leaves that worker without the
    model it was building -- its ``update()`` later fails for that reason)."""
    from fsdp_lint.entry.project import is_local

    out, tb = [], exc.__traceback__
    tb = tb.tb_next if tb is not None else None     # (the skipped statement's own frame: `acted_on` reads it)
    while tb is not None:
        frame = tb.tb_frame
        if is_local(frame.f_code.co_filename) and "self" in frame.f_code.co_varnames[:1]:
            value = frame.f_locals.get("self")
            if value is not None and _is_state(value) and all(v is not value for v in out):
                out.append(value)
        tb = tb.tb_next
    return out


def _may_set_arguments(func: ast.expr, frame) -> bool:
    """Whether the function `func` names in `frame` may set state on the objects it is handed: the project's
    own code (``check_args(args)``, ``Trainer(cfg)``), or a callee not known here (a name the skip left
    unbound). A library's function only reads what it is handed -- a logger's ``wandb.config.update(args)``,
    ``vars(args)``, ``json.dumps(cfg)`` -- so a later failure in a frame holding `args` is no consequence of it."""
    from fsdp_lint.entry.project import is_local

    target = _callee(func, frame)
    if target is _value:
        return True
    target = getattr(target, "__func__", target)                 # a bound method
    if not isinstance(target, (types.FunctionType, type)) and callable(target):
        target = type(target)                                    # a callable instance: its class's __call__
    code = getattr(target, "__code__", None)
    if isinstance(code, types.CodeType):        # (a stand-in class's `__code__` is a property, not code)
        return is_local(code.co_filename)
    module = sys.modules.get(getattr(target, "__module__", None) or "")
    return is_local(getattr(module, "__file__", None) or "")


def _callee(func: ast.expr, frame):
    """What `func` names in `frame` -- looked up statically (no property or ``__getattr__`` runs) -- or `_value`."""
    import builtins
    import inspect

    if isinstance(func, ast.Name):
        if func.id in frame.f_locals:
            return frame.f_locals[func.id]
        if func.id in frame.f_globals:
            return frame.f_globals[func.id]
        return getattr(builtins, func.id, _value)
    if isinstance(func, ast.Attribute):
        base = _callee(func.value, frame)
        if base is _value:
            return _value
        try:
            return inspect.getattr_static(base, func.attr)
        except AttributeError:
            return _value
    return _value


def works_on_a_module(stmt: ast.stmt, frame) -> bool:
    """Whether `stmt` calls a method of an ``nn.Module`` or hands one to a call (``model.resize_token_embeddings
    (len(tokenizer))``, ``resize_embeddings(tokenizer, model)``): what it would have done changes the model."""
    module_type = getattr(sys.modules.get("torch.nn"), "Module", None)
    if module_type is None:
        return False
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call):
            exprs = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            exprs += [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(_value(e, frame), module_type) for e in exprs):
                return True
    return False


def _parts(value) -> List[object]:
    """The state one level inside `value` (a config's sections: ``args.distributed`` of ``args``)."""
    try:
        fields = list(vars(value).values())
    except TypeError:
        fields = list(value.values()) if isinstance(value, dict) else []
    return [v for v in fields if _is_state(v)]


def holds(exc: BaseException, objects: List[object], is_project) -> bool:
    """Whether a frame of project code in `exc`'s traceback holds one of `objects` or a section of one
    (a local, or an attribute of its ``self``): ``validate(args)`` skipped, then
    ``build_mesh(args.distributed)`` fails on the section the validator would have set."""
    if not objects:
        return False
    ids = {id(o) for o in objects} | {id(p) for o in objects for p in _parts(o)}
    frames, tb = [], exc.__traceback__
    while tb is not None:
        if is_project(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    if not frames:
        return False
    # where it failed: the frame's locals, or its `self`'s attributes -- a script's top level holds every
    # object it made, so there only what the failing statement reads (`TrainingArguments(...)` failing after a
    # data set's statement was skipped reads nothing of the data set: two failures, not one)
    frame, line = frames[-1]
    if frame.f_code.co_name == "<module>":
        stmt = _statement_at(frame.f_code.co_filename, line)
        return stmt is not None and any(id(_value(n, frame)) in ids for n in ast.walk(stmt)
                                        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load))
    if any(id(value) in ids for value in list(frame.f_locals.values())):
        return True
    owner = frame.f_locals.get("self")
    try:
        attrs = list(vars(owner).values()) if owner is not None else []
    except TypeError:
        attrs = []
    if any(id(v) in ids for v in attrs):
        return True
    # further out, only a frame whose statement reads the object's state (`Net(cfg.vocab_size, ...)` after
    # `cfg.validate()` was skipped); one that holds it or hands it on (a trainer built with the data set,
    # failing later in its wrap helper) is no link
    for frame, line in frames[:-1]:
        stmt = _statement_at(frame.f_code.co_filename, line)
        if stmt is not None and any(id(_value(n.value, frame)) in ids for n in _attribute_reads(stmt)):
            return True
    return False


def held_at_top_level(exc: BaseException, objects: List[object], is_project) -> bool:
    """Whether `exc` failed in a script's top level (its innermost project frame) that holds one of `objects`
    without its failing statement reading it (`holds` is False there): two failures of one script."""
    ids = {id(o) for o in objects} | {id(p) for o in objects for p in _parts(o)}
    frame, tb = None, exc.__traceback__
    while tb is not None:
        if is_project(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            frame = tb.tb_frame
        tb = tb.tb_next
    return bool(ids) and frame is not None and frame.f_code.co_name == "<module>" and \
        any(id(v) in ids for v in list(frame.f_globals.values()))


def _statement_at(path: str, line: int):
    """The innermost statement of file `path` that spans `line`, or None."""
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return None
    tree = _trees.get(key)
    if tree is None:
        try:
            with open(path, encoding="utf-8-sig") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError):
            return None
        _trees[key] = tree
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if found is None or node.lineno >= found.lineno:
                found = node
    return found


_trees: dict = {}


def _attribute_reads(stmt: ast.stmt):
    """The attributes `stmt` reads (`cfg.vocab_size`; not inside definitions it holds)."""
    todo = [stmt]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)
