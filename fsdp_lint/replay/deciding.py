"""The statements that decide what a wrap is given: a failure there may not be skipped quietly.

``mp, policy = get_policies(cfg)`` then ``FSDP(model, mixed_precision=mp, ...)``: inside
``get_policies``, ``ok = bf16_support()`` fails on a stand-in for a package this machine lacks and is
skipped, ``if ok: mp = bfSixteen`` then fails on the unbound name and is skipped too, and the wrap is
built with ``mp = None``: a float32 plan where a GPU node with the package runs bfloat16 (issue 15,
item 5: a missing package that changes the precision or the wrap is a refusal, not a note).

Two backward slices per file, both flow-insensitive (a statement that binds a name the slice needs
joins it with what it reads and the tests of the blocks around it). Names and attribute chains:
``cfg.mp = ...`` matters to a wrap that reads ``cfg.mp`` (or the whole ``cfg``), ``cfg.seed = ...`` does
not -- a tracker that is not installed failing on the seed stays a skip:

* the *wrap slice*: from the arguments of the wrap, policy, dtype and freeze sites in their scope;
* the *return slice* of each function: from the values it returns.

A statement decides the wrap when it is in a wrap slice, or in its function's return slice while the
caller's current statement decides it (``Failures.decides_wrap`` walks the frames).
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Set, Tuple

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SITE_KINDS = ("fsdp1", "fsdp2", "policy", "dtype", "freeze")


@dataclass
class _Item:
    span: Tuple[int, int]
    binds: FrozenSet[str]          # names it binds, or whose object it stores into (``cfg.mp = ...``)
    reads: FrozenSet[str]          # names its own expressions read, and the tests of the blocks around it
    data: bool = False             # ``loader = DataLoader(...)``: binds a data pipeline


@dataclass
class Deciding:
    wrap_lines: Set[int] = field(default_factory=set)
    return_lines: Set[int] = field(default_factory=set)
    # what another file's call of this file's functions decides: name -> (parameters, the deciding ones,
    # whether the first parameter is the instance) -- `setup_fsdp(model, cfg)` imported from utils/fsdp.py
    exported: Dict[str, Tuple[List[str], Set[str], bool]] = field(default_factory=dict)
    # the lines of sites that decide nothing of a wrap: a freeze of what no wrap is given (a frozen VAE beside the
    # wrapped model), a framework call given data only (`loader = accelerator.prepare(DataLoader(...))`)
    undeciding_sites: Set[int] = field(default_factory=set)


def _chain(node: ast.AST):
    """``cfg.fsdp.mp`` of an attribute chain on a name (``cfg``), or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _reads(nodes) -> Set[str]:
    """The names and attribute chains the expressions read (``cfg.mp`` where only that is read, ``cfg``
    where the object itself is: passed to a call, subscripted)."""
    out: Set[str] = set()
    for node in nodes:
        inner = set()          # the Name/Attribute nodes inside a longer chain already counted
        for n in _walk(node):
            if id(n) in inner:
                continue
            if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
                sub = n.value      # the object stored into is not read (`cfg.mp = x`, `cfg["mp"] = x`)
                while isinstance(sub, (ast.Attribute, ast.Subscript)) and id(sub) not in inner:
                    inner.add(id(sub))
                    sub = sub.value
                inner.add(id(sub))
                continue
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                chain = _chain(n)
                if chain is not None:
                    out.add(chain)
                    sub = n.value
                    while isinstance(sub, ast.Attribute):
                        inner.add(id(sub))
                        sub = sub.value
                    inner.add(id(sub))
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                out.add(n.id)
    return out


def _matches(stored: str, needed: Set[str]) -> bool:
    """A store of ``cfg.mp`` matters to a read of ``cfg.mp``, ``cfg.mp.dtype`` or ``cfg`` (the whole
    object); a store of ``cfg`` to any read under it; a store of ``cfg.seed`` not to a read of ``cfg.mp``."""
    for n in needed:
        if stored == n or stored.startswith(n + ".") or n.startswith(stored + "."):
            return True
    return False


def _walk(node: ast.AST):
    """ast.walk without entering nested definitions (their bodies are their own scopes)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, _DEFS):
                todo.append(child)


def _stored(nodes) -> Set[str]:
    out: Set[str] = set()
    for node in nodes:
        for n in _walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                chain = _chain(n)            # `cfg.mp = ...`: that attribute
                if chain is None:            # `cfg["a"].mp = ...`: the object under the subscript
                    base = n.value
                    while isinstance(base, (ast.Attribute, ast.Subscript)):
                        base = base.value
                    chain = base.id if isinstance(base, ast.Name) else None
                if chain:
                    out.add(chain)
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
                base = n.value               # `cfg["mp"] = ...`: the container (its keys are values)
                while isinstance(base, ast.Subscript):
                    base = base.value
                chain = _chain(base)
                if chain:
                    out.add(chain)
            elif isinstance(n, ast.NamedExpr):
                out.add(n.target.id)
    return out


def _header(stmt: ast.stmt) -> List[ast.AST]:
    """The expressions of a block statement outside its bodies."""
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.target, stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return list(stmt.items)
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        return [h.type for h in stmt.handlers if h.type is not None]
    if isinstance(stmt, ast.Match):
        return [stmt.subject]
    return []


def _bodies(stmt: ast.stmt) -> List[List[ast.stmt]]:
    out = [getattr(stmt, a) for a in ("body", "orelse", "finalbody") if isinstance(getattr(stmt, a, None), list)]
    out += [h.body for h in getattr(stmt, "handlers", [])]
    out += [c.body for c in getattr(stmt, "cases", [])]
    return out


def _items(body: List[ast.stmt], control: FrozenSet[str] = frozenset()) -> List[_Item]:
    """The statements of one scope (nested blocks included, nested definitions not)."""
    out: List[_Item] = []
    for stmt in body:
        if isinstance(stmt, _DEFS):
            out.append(_Item((stmt.lineno, stmt.lineno), frozenset({stmt.name}), control))
            continue
        bodies = _bodies(stmt)
        span = (stmt.lineno, stmt.end_lineno or stmt.lineno)
        if not bodies:
            data = isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and _is_data(stmt.value)
            out.append(_Item(span, frozenset(_stored([stmt])), control | frozenset(_reads([stmt])), data))
            continue
        header = _header(stmt)
        reads = control | frozenset(_reads(header))
        header_end = max(stmt.lineno, bodies[0][0].lineno - 1) if bodies[0] else stmt.lineno
        out.append(_Item((stmt.lineno, header_end), frozenset(_stored(header)), reads))
        for inner in bodies:
            out.extend(_items(inner, reads))
    return out


# what builds a data pipeline (`DataLoader(Prompts(tokenizer))`, `build_train_loader(cfg)`, `MyDataset(path)`): the
# data decides nothing of a wrap, also where it is handed to the same call (`accelerator.prepare(model, loader)`)
_DATA_CALL = re.compile(r"(?i)(data_?loader|dataset|(^|_)loader)$")


def _is_data(node: ast.AST) -> bool:
    if isinstance(node, ast.Starred):
        node = node.value
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return bool(_DATA_CALL.search(name))


def _slice(items: List[_Item], needed: Set[str]) -> Set[int]:
    """The lines of `items` that bind what `needed` names; `needed` grows to all they read. A statement that
    binds a data pipeline (`loader = DataLoader(...)`) is no part of it."""
    lines: Set[int] = set()
    items = [item for item in items if not item.data]
    taken = [False] * len(items)
    changed = True
    while changed:
        changed = False
        for i, item in enumerate(items):
            if not taken[i] and any(_matches(b, needed) for b in item.binds):
                taken[i], changed = True, True
                lines.update(range(item.span[0], item.span[1] + 1))
                needed |= item.reads
    return lines


def _scopes(tree: ast.Module):
    """(scope node, its body) for the module and every function in it."""
    yield tree, tree.body
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.body


def _calls_at(body: List[ast.stmt], lines: Set[int]):
    for stmt in body:
        for n in _walk(stmt) if not isinstance(stmt, _DEFS) else ():
            if isinstance(n, ast.Call) and n.lineno in lines:
                yield n


def _params(fn) -> List[str]:
    """The parameters a call's arguments bind, in order (``self`` left out of a method)."""
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return names + [a.arg for a in fn.args.kwonlyargs]


def _callees(tree: ast.Module) -> Dict[str, List[Tuple[ast.AST, bool]]]:
    """Name -> the functions a call by that name runs in this file, each with whether its first
    parameter is the instance: module-level functions (``setup_fsdp(model, cfg)``), classes (``Trainer(model,
    cfg)`` runs ``__init__``), methods (``self.wrap(model)``)."""
    out: Dict[str, List[Tuple[ast.AST, bool]]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append((node, False))
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in sub.decorator_list)
                    key = node.name if sub.name == "__init__" else "." + sub.name
                    out.setdefault(key, []).append((sub, not static))
    return out


def _argument_reads(call: ast.Call, fn, bound: bool, deciding: Set[str]) -> Set[str]:
    """What the arguments of `call` that bind the `deciding` parameters of `fn` (a function node, or its
    parameter names) read."""
    params = fn if isinstance(fn, list) else _params(fn)
    params = params[1:] if bound else params
    exprs = [a for i, a in enumerate(call.args) if i < len(params) and params[i] in deciding
             and not isinstance(a, ast.Starred)]
    exprs += [k.value for k in call.keywords if k.arg in deciding or (k.arg is None and deciding)]
    return _reads(exprs)


def imported_functions(tree: ast.Module) -> Dict[str, Tuple[str, int, str]]:
    """Name used in this file -> (module, level, name) of a module-level ``from module import name [as n]``."""
    out: Dict[str, Tuple[str, int, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = (node.module or "", node.level, alias.name)
    return out


def imported_deciding(tree: ast.Module, path: str, resolve, deciding_of) -> Dict[str, Tuple[List[str], Set[str], bool]]:
    """The project functions `tree` (the file `path`) imports from other files whose wrap sites read their
    parameters: `resolve` gives an absolute module's project file, `deciding_of` a file's `Deciding` (None
    for a file this replay did not compile)."""
    out = {}
    for name, (module, level, func) in imported_functions(tree).items():
        if level:
            base = os.path.dirname(path)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            stem = os.path.join(base, *module.split(".")) if module else base
            target = next((c for c in (stem + ".py", os.path.join(stem, "__init__.py")) if os.path.isfile(c)), None)
        else:
            target = resolve(module) if resolve is not None else None
        found = deciding_of(os.path.abspath(target)) if isinstance(target, str) else None
        if found is not None and func in found.exported:
            out[name] = found.exported[func]
    return out


def deciding_lines(tree: ast.Module, sites, external=None) -> Deciding:
    """The lines of `tree` whose statements decide what its wrap/policy/dtype/freeze sites are given,
    and the lines of its functions' return slices. A function of the file whose sites read its
    parameters (the model handed to ``setup_fsdp(model, cfg)``, a trainer class that wraps what it is
    given) makes its callers' arguments for them deciding too: the model's constructor arguments, the
    config fields they come from. `external`: name -> the ``Deciding.exported`` entry of a project function
    another file defines and this one imports (its wrap sites read those parameters)."""
    out = Deciding()
    external = external or {}
    site_lines = {s.line for s in sites if s.kind in _SITE_KINDS and s.kind != "freeze"}
    freeze_lines = {s.line for s in sites if s.kind == "freeze"}
    scopes = [(scope, body, _items(body)) for scope, body in _scopes(tree)]
    callees = _callees(tree)
    deciding: Dict[int, Set[str]] = {}         # id(function) -> its parameters that decide a wrap
    kept: Dict[int, Set[int]] = {}             # id(scope) -> the lines of its freeze sites that decide a wrap
    for _ in range(8):                         # callers of callers, to a fixed point
        changed = False
        for scope, body, items in scopes:
            needed: Set[str] = set()
            for call in _calls_at(body, site_lines):
                needed |= _reads([a for a in (*call.args, *(k.value for k in call.keywords)) if not _is_data(a)])
            for call in _calls_in(body):
                name = call.func.id if isinstance(call.func, ast.Name) else (
                    "." + call.func.attr if isinstance(call.func, ast.Attribute) else None)
                for fn, bound in callees.get(name, ()):
                    if deciding.get(id(fn)):
                        needed |= _argument_reads(call, fn, bound, deciding[id(fn)])
                if name in external:
                    params, wanted, bound = external[name]
                    needed |= _argument_reads(call, params, bound, wanted)
            freezing, kept[id(scope)] = _freezes_needed(body, freeze_lines, items, needed)
            needed |= freezing
            if not needed:
                continue
            out.wrap_lines |= _slice(items, needed)
            if scope is not tree:
                hit = {p for p in _params(scope) if any(n == p or n.startswith(p + ".") for n in needed)}
                if not hit <= deciding.get(id(scope), set()):
                    deciding.setdefault(id(scope), set()).update(hit)
                    changed = True
        if not changed:
            break
    out.undeciding_sites = (freeze_lines - set().union(set(), *kept.values())) | data_only_sites(tree, sites)
    for name, fns in callees.items():       # what an importer's call of them decides
        for fn, bound in fns:
            if deciding.get(id(fn)) and not name.startswith("."):
                out.exported[name] = (_params(fn), set(deciding[id(fn)]), bound)
    for name, entry in external.items():    # and what it imports to export again (a package's __init__)
        out.exported.setdefault(name, entry)
    for scope, body, items in scopes:
        if scope is not tree:
            returns = [n for s in body if not isinstance(s, _DEFS) for n in _walk(s) if isinstance(n, ast.Return)]
            if returns:
                for r in returns:
                    out.return_lines.update(range(r.lineno, (r.end_lineno or r.lineno) + 1))
                out.return_lines |= _slice(items, _reads([r.value for r in returns if r.value is not None]))
    return out


def data_only_sites(tree: ast.Module, sites) -> Set[int]:
    """The lines of wrap sites whose call is given a data pipeline only (``accelerator.prepare(loader)``,
    ``prepare(DataLoader(Prompts(tokenizer)))``): they decide nothing of a wrap."""
    lines = {s.line for s in sites if s.kind in ("fsdp1", "fsdp2", "framework")}
    out: Set[int] = set()
    for _, body in _scopes(tree):
        data_names = {b for item in _items(body) if item.data for b in item.binds}
        for call in _calls_at(body, lines):
            given = [*call.args, *(k.value for k in call.keywords)]
            if given and all(_is_data(a) or isinstance(a, ast.Name) and a.id in data_names for a in given):
                out.add(call.lineno)
    return out


def _freezes_needed(body: List[ast.stmt], freeze_lines: Set[int], items: List[_Item], needed: Set[str]):
    """(what they read, their lines) of the scope's freeze sites where what they freeze is what its wraps are given (or the scope wraps
    nothing itself: a model frozen here is wrapped by a caller). A frozen helper model the scope's wraps never
    read -- a VAE or teacher loaded after the trained model was wrapped, ``vae.requires_grad_(False)`` -- decides
    nothing of the plan: its failing load is skipped as any statement that needs a file this machine lacks."""
    freezes = [(call.lineno, _reads([call])) for call in _calls_at(body, freeze_lines)]
    if needed:
        closure = set(needed)
        _slice(items, closure)
        freezes = [(line, reads) for line, reads in freezes if any(_matches(r, closure) for r in reads)]
    return set().union(set(), *(reads for _, reads in freezes)), {line for line, _ in freezes}


def _calls_in(body: List[ast.stmt]):
    for stmt in body:
        for n in _walk(stmt) if not isinstance(stmt, _DEFS) else ():
            if isinstance(n, ast.Call):
                yield n
