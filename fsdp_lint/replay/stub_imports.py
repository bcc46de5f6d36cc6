"""The replay's helper names in transformed code, and the transform of project imports: a package not
installed here gets tracked stand-ins (`fsdp_lint.replay.imports.Missing`) instead of stopping the file, at
module level and inside functions."""
from __future__ import annotations

import ast

SKIP = "__fsdp_lint_skip__"
SKIPPABLE = "__fsdp_lint_skippable__"      # what a tolerant statement catches: Exception, NetworkWait
STUB_IMPORT = "__fsdp_lint_stub_import__"
REBIND = "__fsdp_lint_rebind__"
LOOP = "__fsdp_lint_training_loop__"
SETUP_DONE = "__fsdp_lint_setup_done__"
CAUGHT = "__fsdp_lint_caught__"      # a handler of the script's: what it caught (replay.caught)
LENGTH = "__fsdp_lint_length__"      # the length of a data set whose data was skipped (a project Dataset's __len__)
_EXC = "__fsdp_lint_exc__"
HELPER_NAMES = (SKIP, STUB_IMPORT, REBIND, LOOP, SETUP_DONE, CAUGHT)
_STUBS = "__fsdp_lint_stubs__"


def _globals_call() -> ast.expr:
    return ast.Call(ast.Name("globals", ast.Load()), [], [])


def _located(node: ast.AST, like: ast.stmt) -> ast.AST:
    """`node` and every node inside it that has no position get `like`'s."""
    for n in ast.walk(node):
        if "lineno" in n._attributes and not hasattr(n, "lineno"):
            ast.copy_location(n, like)
    return node


def _call_stmt(name: str, *args: ast.expr, like: ast.stmt) -> ast.stmt:
    node = ast.Expr(ast.Call(func=ast.Name(name, ast.Load()), args=list(args), keywords=[]))
    return _located(node, like)


def tolerant_import(stmt: ast.stmt) -> ast.stmt:
    """A module-level import: failing, the runtime binds tracked stand-ins into the module's globals."""
    names = [a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"]
    if isinstance(stmt, ast.ImportFrom):
        module = "." * (stmt.level or 0) + (stmt.module or "")
    else:
        module = ", ".join(a.name for a in stmt.names)
    handler = ast.ExceptHandler(
        type=ast.Name("ImportError", ast.Load()), name=_EXC,
        body=[ast.If(
            test=ast.UnaryOp(ast.Not(), ast.Call(ast.Name(STUB_IMPORT, ast.Load()), [
                ast.List([ast.Constant(n) for n in names], ast.Load()), _globals_call(),
                ast.Constant(module or None), ast.Name(_EXC, ast.Load())], [])),
            body=[ast.Raise()], orelse=[])],
    )
    # positions for the new nodes only (the user's statement keeps its own)
    return ast.copy_location(ast.Try(body=[stmt], handlers=[_located(handler, stmt)], orelse=[], finalbody=[]),
                             stmt)

def tolerant_local_import(stmt: ast.stmt) -> ast.stmt:
    """An import inside a function (``from loguru._logger import Core`` in ``setup_logger()``): a package
    not installed here gets its stand-ins as a module-level import does, bound to the function's names."""
    names = [a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"]
    if not names:
        return stmt
    module = "." * (stmt.level or 0) + (stmt.module or "") if isinstance(stmt, ast.ImportFrom) else \
        ", ".join(a.name for a in stmt.names)
    stubs = ast.Name(_STUBS, ast.Load())
    handler = ast.ExceptHandler(
        type=ast.Name("ImportError", ast.Load()), name=_EXC,
        body=[ast.Assign([ast.Name(_STUBS, ast.Store())], ast.Dict([], [])),
              ast.If(test=ast.UnaryOp(ast.Not(), ast.Call(ast.Name(STUB_IMPORT, ast.Load()), [
                  ast.List([ast.Constant(n) for n in names], ast.Load()), stubs, ast.Constant(module or None),
                  ast.Name(_EXC, ast.Load())], [])), body=[ast.Raise()], orelse=[])]
        + [ast.Assign([ast.Name(n, ast.Store())], ast.Subscript(stubs, ast.Constant(n), ast.Load())) for n in names],
    )
    return ast.copy_location(ast.Try(body=[stmt], handlers=[_located(handler, stmt)], orelse=[], finalbody=[]),
                             stmt)


def length_fallback(node: ast.FunctionDef) -> ast.stmt:
    """The body of ``__len__`` of a project class (a torch Dataset reading its files in ``__init__``): where it
    fails because a statement that would have loaded the data was skipped (`len(self.prompts)` after the
    parquet file was not here), or returns 0 because such a statement of the data set was skipped (the list it
    filled is empty: `fsdp_lint.replay.empty_data`), the length is the stand-in data sets' -- a sampler, a
    loader and the steps of a schedule are built from it as on the node; anything else is as written."""
    for ret in _own_returns(node.body):
        ret.value = _located(ast.Call(ast.Name(LENGTH, ast.Load()), [ast.Constant(node.lineno), ret.value], []), ret)
    handler = ast.ExceptHandler(
        type=ast.Name(SKIPPABLE, ast.Load()), name=_EXC,
        body=[ast.Return(ast.Call(ast.Name(LENGTH, ast.Load()), [
            ast.Constant(node.lineno), ast.Name(_EXC, ast.Load())], []))])
    return ast.copy_location(ast.Try(body=node.body, handlers=[_located(handler, node)], orelse=[],
                                      finalbody=[]), node)


def _own_returns(stmts):
    todo = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
