"""Which functions and statements matter for the plan: those that (transitively) wrap, freeze, cast or
build optimizers, within a module and across the project's modules."""
from __future__ import annotations

import ast
import builtins
from typing import Any, Dict, Set

# (the facts are fsdp_lint.entry.source's FunctionFacts and SourceFacts, which source.py builds with these)


def mark_relevance(functions: Dict[str, Any], extra_relevant: Set[str] = frozenset(),
                   extra_wraps: Set[str] = frozenset()) -> None:
    """A function is relevant when it (transitively) holds a site; `extra_*`: names known to be
    relevant / to wrap from other modules of the project."""
    for f in functions.values():
        f.relevant = bool(f.direct_markers) or bool(f.calls & extra_relevant)
        f.wraps = bool(f.direct_markers & {"fsdp1", "fsdp2"}) or bool(f.calls & extra_wraps)
    by_name: Dict[str, list] = {}           # (a name several classes define: a call by it may be any of them)
    for f in functions.values():
        by_name.setdefault(f.name, []).append(f)
    changed = True
    while changed:
        changed = False
        for f in functions.values():
            for callee in f.calls:
                # (a special method by its name -- `super().__init__()` -- is no call of every class's own)
                special = callee.startswith("__") and callee.endswith("__")
                for g in ([functions[callee]] if callee in functions else []) if special else by_name.get(callee, ()):
                    if g is f:
                        continue
                    if g.relevant and not f.relevant:
                        f.relevant = changed = True
                    if g.wraps and not f.wraps:
                        f.wraps = changed = True


def relevant_lines_with(facts: Any, relevant_names: Set[str]) -> Set[int]:
    """The module's relevant statement lines when the names in `relevant_names` (functions of other
    project modules that wrap, freeze, cast or build optimizers) are relevant too."""
    own = {f.name for f in facts.functions.values() if f.relevant}
    names = own | called_here(facts, relevant_names)
    out = set(facts.relevant_stmt_lines)
    for line, calls in getattr(facts, "_stmt_calls", {}).items():
        if calls & names:
            out.add(line)
    return out


_BUILTIN_NAMES = frozenset(dir(builtins))


def called_here(facts: Any, names: Set[str]) -> Set[str]:
    """Which of other modules' function `names` a bare call in this module can mean: another module's
    `def list(...)` is not this module's `list(PRESETS)` unless it defines or imports that name."""
    bound = {f.name for f in facts.functions.values()} | {a for i in facts.imports for a in i.names}
    return {n for n in names if n not in _BUILTIN_NAMES or n in bound}




def calls_through_keywords(bindings: Dict[str, Set[str]], functions, module_calls: Set[str], statement_calls) -> None:
    """A function handed over as a keyword (``TrainSpec(parallelize_fn=parallelize)``, registered at import) runs
    where the attribute of that name is called (``train_spec.parallelize_fn(model)``): such a call calls it too."""
    if not bindings:
        return
    for calls in [f.calls for f in functions] + [module_calls] + list(statement_calls):
        for name in calls & bindings.keys():
            calls |= bindings[name]


def keyword_relevance(modules, relevant: Set[str]) -> Set[str]:
    """The keywords (of all `modules`' facts) that relevant functions were handed over as."""
    return {k for facts in modules for k, fns in getattr(facts, "keyword_bindings", {}).items() if fns & relevant}


def instance_call_relevance(modules, relevant: Set[str]) -> Set[str]:
    """``__call__@Class`` for each class whose ``__call__`` is relevant (its own, or a base class's): a call of
    an instance of it (``core = MyCore(...); core()``) is a call of that method."""
    out = {f"__call__@{f.cls}" for facts in modules for f in facts.functions.values()
           if f.name == "__call__" and f.cls and f.name in relevant and f.relevant}
    changed = True
    while changed:
        changed = False
        for facts in modules:
            for cls, bases in getattr(facts, "classes", {}).items():
                if f"__call__@{cls}" not in out and any(f"__call__@{b.rsplit('.', 1)[-1]}" in out for b in bases):
                    out.add(f"__call__@{cls}")
                    changed = True
    return out


def stores_into(fn: ast.AST, params: Set[str]) -> bool:
    """Whether the function writes into one of the objects `params` names: an item or attribute of it
    (``configs["vocab_size"] = len(vocab)``, ``args.num_labels = n``), or ``.update(...)``/``.setdefault(...)``/``setattr``
    on it -- a helper that builds the data and sets what the model is built from."""
    def rooted(node) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and node.id in params
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, (ast.Attribute, ast.Subscript)) and rooted(t) for t in targets):
                return True
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("update", "setdefault") and rooted(func.value):
                return True
            if isinstance(func, ast.Name) and func.id == "setattr" and node.args and rooted(node.args[0]):
                return True
    return False
