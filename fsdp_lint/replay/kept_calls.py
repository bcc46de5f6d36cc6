"""Statements the slice of the setup keeps although they bind nothing later code reads: they change
state that code uses (a needed object's parts, a library's module state)."""
from __future__ import annotations

import ast
import sys
from typing import Dict, Optional, Set


def root_name(node: ast.AST) -> Optional[str]:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def sets_library_state(import_package: Dict[str, str], trainers: Set[str], root: Optional[str],
                       needed: Set[str]) -> bool:
    """A bare call into an installed library whose names later code reads: libraries keep process
    state in their modules (fairscale's and Megatron's ``initialize_model_parallel(n)`` build the
    groups that ``get_data_parallel_group()`` returns later), so the call is set-up the later code
    depends on; so do the project's own packages (``from .utils import init_distributed`` builds the
    mesh that ``from .model_wrapper import get_model_container`` reads back through module globals).
    The standard library's calls (``os.makedirs``, ``logging.basicConfig``) are not.
    `import_package`: local name -> the top-level package it was imported from ("." for a relative
    import: the file's own package)."""
    package = import_package.get(root or "")
    if not package or package in sys.stdlib_module_names or root in trainers:
        return False
    return any(import_package.get(name) == package for name in needed)


def changes_parts(loop: ast.stmt, objects: Set[str]) -> bool:
    """A loop over a needed object's parts (its variable names a part) that passes a part to a
    function, calls a method on it or assigns to its attributes: it changes the needed object."""
    for node in ast.walk(loop):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and root_name(node.func) in objects:
                return True
            for arg in list(node.args) + [k.value for k in node.keywords]:
                arg = arg.value if isinstance(arg, ast.Starred) else arg
                if isinstance(arg, ast.Name) and arg.id in objects:
                    return True
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(sub, (ast.Attribute, ast.Subscript)) and root_name(sub) in objects
                   for t in targets for sub in ast.walk(t)):
                return True
    return False


def environment_setters(tree: ast.AST) -> Set[str]:
    """The module's functions that write the process environment (``os.environ[k] = v``,
    ``os.environ.update({...})``, ``setdefault``, ``os.putenv``): a bare call of one
    (``_bootstrap_single_process_env()`` giving a one-GPU run its ``env://`` rendezvous values) is set-up the
    code after it reads through ``os.environ``, although it binds nothing."""
    out: Set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t.value for t in targets if isinstance(t, ast.Subscript)), None)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("update", "setdefault", "__setitem__"):
                    target = node.func.value
                elif node.func.attr == "putenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
                    out.add(fn.name)
                    break
            if isinstance(target, ast.Attribute) and target.attr == "environ" and \
                    isinstance(target.value, ast.Name) and target.value.id == "os":
                out.add(fn.name)
                break
    return out
