"""Edits of FSDP1 auto-wrap policies written in Python: the class set of `ModuleWrapPolicy({...})` or of
`transformer_auto_wrap_policy(transformer_layer_cls={...})` (called, or bound with `functools.partial`),
found with libcst in the file that builds the policy. A class is replaced, added or removed in that set
literal only -- a set built by code (a comprehension, a function's return value) or a
`lambda_auto_wrap_policy` is no mechanical edit (None: the finding keeps its text fix)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from fsdp_lint.fix.codemods import Source
from fsdp_lint.fix.edits import Edit

# the keyword (or first positional argument) that holds a class-based policy's classes
_CLASS_ARGUMENTS = {"ModuleWrapPolicy": "module_classes", "transformer_auto_wrap_policy": "transformer_layer_cls",
                    # Lightning (Trainer and Fabric): a set of classes is its ModuleWrapPolicy
                    "FSDPStrategy": "auto_wrap_policy"}


def _dotted(expr) -> Optional[str]:
    import libcst as cst

    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr.value}" if head else None
    return None


def _module_bindings(src: Source) -> Dict[str, object]:
    """name -> the value of its one module-level `NAME = ...` (names bound twice are left out)."""
    import libcst as cst

    out: Dict[str, object] = {}
    seen: Dict[str, int] = {}
    for stmt in src.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                name = small.targets[0].target.value
                seen[name] = seen.get(name, 0) + 1
                out[name] = small.value
    return {k: v for k, v in out.items() if seen[k] == 1}


def class_sets(src: Source) -> List[object]:
    """The set/list/tuple literals that hold the classes of a class-based policy in this file."""
    import libcst as cst

    bound = _module_bindings(src)
    out: List[object] = []
    for node in src.positions:
        if not isinstance(node, cst.Call):
            continue
        name = (_dotted(node.func) or "").rpartition(".")[2]
        keyword = _CLASS_ARGUMENTS.get(name)
        args = list(node.args)
        if name == "partial" and args and (_dotted(args[0].value) or "").rpartition(".")[2] == "transformer_auto_wrap_policy":
            keyword, args = "transformer_layer_cls", args[1:]
        if keyword is None:
            continue
        value = next((a.value for a in args if a.keyword is not None and a.keyword.value == keyword), None)
        if value is None and name == "ModuleWrapPolicy" and args and args[0].keyword is None:
            value = args[0].value
        if isinstance(value, cst.Name) and value.value in bound:
            value = bound[value.value]            # POLICY_CLASSES = {...} at module level
        if isinstance(value, (cst.Set, cst.List, cst.Tuple)) and value not in out:
            out.append(value)
    return out


def _named(element, cls: str) -> bool:
    return (_dotted(element.value) or "").rpartition(".")[2] == cls


def occurrences(src: Source, cls: str) -> List[Tuple[object, object]]:
    """(set literal, element) for each element naming `cls` (`Block`, `nn.Block`, `mod.Block`)."""
    return [(s, e) for s in class_sets(src) for e in s.elements if _named(e, cls)]


def spelling(src: Source, cls: str, module: str) -> Tuple[Optional[str], List[Edit]]:
    """How the file names class `cls` of `module`: the name it already binds (a class of the file, an
    import), `alias.cls` through an `import module as alias`, or `cls` with a new
    `from module import cls` after the file's last top-level import. (None, []) when `cls` is bound
    to something else or the module cannot be imported by name."""
    import libcst as cst

    imported_as: Dict[str, str] = {}      # bound name -> "module.attr" it names
    modules: Dict[str, str] = {}          # bound name -> module for `import module [as name]`
    defined = set()
    last_import = None
    for stmt in src.module.body:
        if isinstance(stmt, cst.ClassDef):
            defined.add(stmt.name.value)
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar) and small.relative == ():
                mod = _dotted(small.module) if small.module is not None else None
                for alias in small.names:
                    bound = alias.asname.name.value if alias.asname else alias.name.value
                    imported_as[bound] = f"{mod}.{_dotted(alias.name)}"
                last_import = stmt
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    full = _dotted(alias.name)
                    if alias.asname:
                        modules[alias.asname.name.value] = full
                    else:
                        modules[full] = full
                last_import = stmt
            elif isinstance(small, cst.ImportFrom):
                last_import = stmt
    same_module = [stmt for stmt in src.module.body if isinstance(stmt, cst.SimpleStatementLine)
                   and any(isinstance(s, cst.ImportFrom) and s.relative == () and s.module is not None
                           and _dotted(s.module) == module and not isinstance(s.names, cst.ImportStar)
                           for s in stmt.body)]
    if cls in defined or imported_as.get(cls) == f"{module}.{cls}":
        return cls, []
    for name, target in imported_as.items():
        if target == f"{module}.{cls}":
            return name, []
    for name, full in modules.items():
        if full == module:
            return f"{name}.{cls}", []
    if cls in defined or cls in imported_as or cls in _module_bindings(src) or not module \
            or not all(part.isidentifier() for part in module.split(".")) or module == "__main__" or last_import is None:
        return None, []
    if same_module:             # `from model import TinyDecoder` -> `from model import TinyDecoder, Block`
        names = next(s for s in same_module[0].body if isinstance(s, cst.ImportFrom)).names
        line, col = src.end(names[-1].asname or names[-1].name)
        return cls, [Edit(src.path, line, col, line, col, f", {cls}")]
    return cls, [src.insert_after(last_import, f"from {module} import {cls}")]


def replace_class(path: str, missing: str, replacement: str, module: str) -> Optional[List[Edit]]:
    """`missing` replaced by `replacement` (a class of `module`) in the one policy class set that names
    it, with the import the file needs for it; None when the file names `missing` in no such set or
    in more than one."""
    src = Source.of(path)
    if src is None:
        return None
    hits = occurrences(src, missing)
    if len(hits) != 1:
        return None
    text, imports = spelling(src, replacement, module)
    if text is None:
        return None
    literal, element = hits[0]
    if any(_named(e, replacement) for e in literal.elements):
        return remove_class(path, missing)        # the right class is there already: drop the wrong one
    return [src.replace(element.value, text)] + imports


def remove_class(path: str, cls: str) -> Optional[List[Edit]]:
    """`cls` taken out of the one policy class set that names it (the set keeps at least one class)."""
    src = Source.of(path)
    if src is None:
        return None
    hits = occurrences(src, cls)
    if len(hits) != 1 or len(hits[0][0].elements) < 2:
        return None
    literal, element = hits[0]
    elements = list(literal.elements)
    i = elements.index(element)
    if i + 1 < len(elements):      # up to the next element: its comma and the space after it go too
        (l1, c1), (l2, c2) = src.start(element), src.start(elements[i + 1])
    else:                          # the last one: from the previous element's end
        (l1, c1), (l2, c2) = src.end(elements[i - 1].value), src.end(element)
    return [Edit(path, l1, c1, l2, c2, "")]


def add_class(path: str, present: str, cls: str, module: str) -> Optional[List[Edit]]:
    """`cls` (of `module`) added after `present` in the one policy class set that names `present`."""
    src = Source.of(path)
    if src is None:
        return None
    hits = occurrences(src, present)
    if len(hits) != 1:
        return None
    literal, element = hits[0]
    if any(_named(e, cls) for e in literal.elements):
        return None
    text, imports = spelling(src, cls, module)
    if text is None:
        return None
    line, col = src.end(element.value)
    return [Edit(path, line, col, line, col, f", {text}")] + imports


def class_module(tree, cls: str) -> Optional[str]:
    """The module that defines the model's class `cls` (from its qualified name), or None."""
    for info in tree.modules.values():
        if info.cls == cls and info.cls_qualname.endswith("." + cls):
            return info.cls_qualname[:-len(cls) - 1]
    return None


def policy_files(plan, unit) -> List[str]:
    """The files that may build the policy that auto-wrapped `unit`: those of the plan's policies (where
    the FSDP call is), then the unit's own."""
    out: List[str] = []
    for path in [p.path for p in plan.policies] + [unit.path]:
        if path and not path.startswith("<") and path not in out:
            out.append(path)
    return out


def named_in_policy(plan, unit, classes: List[str]) -> Optional[Tuple[str, str]]:
    """(file, class) for the first of `classes` (a module's MRO, most derived first) that one policy
    class set of those files names exactly once."""
    for path in policy_files(plan, unit):
        src = Source.of(path)
        if src is None:
            continue
        for cls in classes:
            if len(occurrences(src, cls)) == 1:
                return path, cls
    return None


def unwrap_statement(path: str, line: int, col: int) -> Optional[List[Edit]]:
    """FSDP1's `model.head = FSDP(model.head, ...)` (a statement of its own, outside loops) removed, so
    that the module stays in its parent's unit."""
    import libcst as cst

    from fsdp_lint.fix.codemods import wrap_call

    src = Source.of(path)
    call = wrap_call(src, line, col) if src is not None else None
    if call is None or not call.args or call.args[0].keyword is not None:
        return None
    stmt = src.statement(call)
    if not _assigns_back(src, stmt, call) or src.enclosing_loops(stmt):
        return None
    return [src.remove_statement(stmt)]


def _assigns_back(src: Source, stmt, call) -> bool:
    """`X = FSDP(X, ...)`: the statement assigns the wrapper to where the module came from."""
    import libcst as cst

    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    return (isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1
            and src.code(small.targets[0].target).strip() == src.code(call.args[0].value).strip())


def wrap_elements(path: str, line: int, col: int, is_dict: bool) -> Optional[List[Edit]]:
    """FSDP1's `model.layers = FSDP(model.layers, **kw)` on a container becomes a loop that wraps each
    element in its place: `for i, block in enumerate(model.layers): model.layers[i] = FSDP(block, **kw)`."""
    from fsdp_lint.fix import codemods

    src = Source.of(path)
    call = codemods.wrap_call(src, line, col) if src is not None else None
    if call is None or not call.args or call.args[0].keyword is not None:
        return None
    stmt = src.statement(call)
    if not _assigns_back(src, stmt, call):
        return None
    container = src.code(call.args[0].value).strip()
    used = codemods.names_in(call)
    var = next(n for n in ("block", "layer", "element", "_block") if n not in used)
    key = next(n for n in ("i", "idx", "key", "_i") if n not in used and n != var)
    if is_dict:
        key = next(n for n in ("name", "key", "_key") if n not in used and n != var)
    kws = codemods.keywords_text(src, call, without=set())
    callee = src.code(call.func).strip()
    indent = src.indent_of(stmt)
    loop = (f"for {key}, {var} in list({container}.items()):" if is_dict
            else f"for {key}, {var} in enumerate({container}):")
    text = f"{loop}\n{indent}    {container}[{key}] = {callee}({', '.join([var] + kws)})"
    (l1, _), end = src.start(stmt), src.end(stmt.body[0])     # a comment after the call stays
    return [Edit(path, l1, len(indent) + 1, end[0], end[1], text)]


def written_at(path: str, cls: str) -> Optional[Tuple[int, int]]:
    """(line, column) of the one element of a policy class set of `path` that names `cls`, or None."""
    src = Source.of(path)
    hits = occurrences(src, cls) if src is not None else []
    return src.start(hits[0][1].value) if len(hits) == 1 else None


def unwrap_units(plan, tree, units):
    """FSDP1 edits that make `units` no units of their own (their modules join the enclosing unit): a
    class the auto-wrap policy names taken out of its set -- when every unit that class makes is among
    `units` -- and `model.head = FSDP(model.head, ...)` removed. (edits, classes taken out), or None
    when one of them is not mechanical."""
    edits: List[Edit] = []
    named: List[str] = []
    for u in units:
        if u.is_root or len(u.modules) != 1:
            return None
        if u.origin == "call":
            more = unwrap_statement(u.path, u.line, u.col)
        elif u.origin == "policy":
            mro = [c for c in tree.modules[u.modules[0]].mro if c not in ("Module", "object")]
            found = named_in_policy(plan, u, mro)
            if found is None:
                return None
            path, cls = found
            makes = [x for x in plan.units if x.origin == "policy" and x.modules and cls in tree.modules[x.modules[0]].mro]
            if any(not any(x is c for c in units) for x in makes):
                return None    # the class also wraps other modules: taking it out changes them too
            more = remove_class(path, cls) if cls not in named else []
            named.append(cls)
        else:
            return None
        if more is None:
            return None
        edits += [e for e in more if e not in edits]
    return (edits, named) if edits else None
