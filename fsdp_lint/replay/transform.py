"""The code transform: training loops dropped, harmless statements made tolerant, checkpoints."""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from fsdp_lint.source import SourceFacts

# --------------------------------------------------------------------------------------------
# AST transform
# --------------------------------------------------------------------------------------------
_CHECKPOINT = "__fsdp_lint_checkpoint__"
_SKIP = "__fsdp_lint_skip__"
_STUB_IMPORT = "__fsdp_lint_stub_import__"
_REBIND = "__fsdp_lint_rebind__"

_NEVER_WRAP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Return, ast.Global, ast.Nonlocal,
               ast.Pass, ast.Break, ast.Continue, ast.Import, ast.ImportFrom)


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    left = stmt.test.left
    return isinstance(left, ast.Name) and left.id == "__name__"


def _call_stmt(name: str, *args: ast.expr, like: ast.stmt) -> ast.stmt:
    node = ast.Expr(ast.Call(func=ast.Name(name, ast.Load()), args=list(args), keywords=[]))
    return ast.copy_location(node, like)


class _Transformer:
    def __init__(self, facts: SourceFacts):
        self.relevant = facts.relevant_stmt_lines
        self.dropped = facts.dropped_loop_lines
        # (function name, first line) -> list of (start, end) line spans that are terminal
        self.terminal_spans: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
        self.synthetic: Set[int] = set()          # ids of statements the transform inserted
        self.imported: Set[str] = set()           # names bound by imports anywhere in the file
        self.torch_names: Set[str] = set()        # ... of them, those bound from torch

    def is_relevant(self, stmt: ast.stmt) -> bool:
        return stmt.lineno in self.relevant

    def module(self, tree: ast.Module) -> ast.Module:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                base = node.module or "" if isinstance(node, ast.ImportFrom) else ""
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    local = alias.asname or alias.name.split(".")[0]
                    self.imported.add(local)
                    if (base or alias.name).split(".")[0] == "torch":
                        self.torch_names.add(local)
        body: List[ast.stmt] = []

        def synthetic(node: ast.stmt) -> ast.stmt:
            self.synthetic.add(id(node))
            return node

        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                body.append(synthetic(self._tolerant_import(stmt)))
                body.append(synthetic(_call_stmt(_REBIND, ast.Call(ast.Name("globals", ast.Load()), [], []), like=stmt)))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # transformed by self._body below (exactly once)
                body.append(stmt)
                body.append(synthetic(_call_stmt(_REBIND, ast.Call(ast.Name("globals", ast.Load()), [], []), like=stmt)))
            elif _is_main_guard(stmt):
                if any(self._contains_relevant(s) for s in stmt.body):
                    stmt.test = ast.copy_location(ast.Constant(True), stmt.test)
                    stmt.orelse = []
                    body.append(stmt)
                # a guard with nothing that touches the plan never runs
            else:
                body.append(stmt)
        spans: List[Tuple[int, int]] = []
        tree.body = self._body(body, spans, top=True)
        self.terminal_spans[("<module>", 1)] = spans
        return tree

    def _tolerant_import(self, stmt: ast.stmt) -> ast.stmt:
        names = [a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"]
        if isinstance(stmt, ast.ImportFrom):
            module = stmt.module or ""
        else:
            module = ", ".join(a.name for a in stmt.names)
        handler = ast.ExceptHandler(
            type=ast.Name("ImportError", ast.Load()), name=None,
            body=[_call_stmt(_STUB_IMPORT, ast.List([ast.Constant(n) for n in names], ast.Load()), ast.Call(ast.Name("globals", ast.Load()), [], []),
                             ast.Constant(module.split(".")[0] if module else None), like=stmt)],
        )
        node = ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[])
        return ast.copy_location(node, stmt)

    def _visit_defs(self, node: ast.stmt) -> None:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self._visit_defs(item)
            return
        spans: List[Tuple[int, int]] = []
        if self._contains_relevant(node):
            node.body = self._body(node.body, spans, top=True)
        else:
            # code that does not touch the plan (model constructors, helpers) runs as written:
            # an error in a model's __init__ is an error; only training loops never run
            _DropLoops(self.dropped).visit(node)
        self.terminal_spans[(node.name, node.lineno)] = spans

    def _contains_relevant(self, stmt: ast.stmt) -> bool:
        for node in ast.walk(stmt):
            if isinstance(node, ast.stmt) and node.lineno in self.relevant and not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                return True
        return False

    def _body(self, stmts: List[ast.stmt], spans: List[Tuple[int, int]], top: bool,
              terminal: bool = True, needed_after: Optional[Set[str]] = None) -> List[ast.stmt]:
        """Transform one statement list; `terminal` says whether its last relevant statement ends
        the enclosing function's relevant work (then a checkpoint follows it). `needed_after`:
        names the code after this statement list reads (see `_slice`)."""
        last_relevant = max((i for i, s in enumerate(stmts) if self._is_rel(s)), default=None)
        skip, needed_at = self._slice(stmts, last_relevant, terminal, top, needed_after or set())
        out: List[ast.stmt] = []
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._visit_defs(stmt)
                out.append(stmt)
                continue
            if stmt.lineno in self.dropped or (isinstance(stmt, (ast.For, ast.While, ast.AsyncFor))
                                                and not self._is_rel(stmt) and stmt.lineno in self.dropped):
                out.append(ast.copy_location(ast.Pass(), stmt))
                continue
            if i in skip:
                out.append(ast.copy_location(ast.Pass(), stmt))
                continue
            if id(stmt) in self.synthetic:
                out.append(stmt)
                continue
            if not self._is_rel(stmt):
                if isinstance(stmt, ast.While):
                    out.append(ast.copy_location(ast.Pass(), stmt))
                elif isinstance(stmt, _NEVER_WRAP):
                    out.append(stmt)
                else:
                    out.append(self._tolerant(stmt))
                continue
            is_last = terminal and i == last_relevant
            if isinstance(stmt, (ast.If, ast.With, ast.AsyncWith, ast.Try)):
                inner_spans: List[Tuple[int, int]] = []
                for attr in ("body", "orelse", "finalbody"):
                    sub = getattr(stmt, attr, None)
                    if sub:
                        setattr(stmt, attr, self._body(sub, inner_spans, top=False, terminal=is_last,
                                                       needed_after=needed_at[i]))
                for handler in getattr(stmt, "handlers", []) or []:
                    handler.body = self._body(handler.body, inner_spans, top=False, terminal=is_last,
                                              needed_after=needed_at[i])
                if is_last:
                    spans.extend(inner_spans or [(stmt.lineno, stmt.end_lineno or stmt.lineno)])
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                loop_needed = needed_at[i] | _reads(stmt)     # the next iteration reads them too
                for attr in ("body", "orelse"):
                    setattr(stmt, attr, self._body(getattr(stmt, attr), [], top=False, terminal=False,
                                                   needed_after=loop_needed)
                            or [ast.copy_location(ast.Pass(), stmt)])
                if is_last:
                    spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
            elif is_last:
                spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
            out.append(stmt)
            if is_last:
                out.append(_call_stmt(_CHECKPOINT, like=stmt))
        if out:
            return out
        return [ast.copy_location(ast.Pass(), stmts[0])] if stmts else [ast.Pass()]

    def _is_rel(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        return self._contains_relevant(stmt)

    def _slice(self, stmts: List[ast.stmt], last_relevant: Optional[int], terminal: bool, top: bool,
               needed_after: Set[str]) -> Tuple[Set[int], Dict[int, Set[str]]]:
        """Which statements before the last relevant one can be left out, and which names are
        needed after each statement.

        Setup code runs only as far as the wrap plan depends on it: a statement before the last
        relevant statement runs when it binds a name that code running later reads, or may change
        an object such code uses (a method call on it, an attribute assignment, passing it to a
        function), or calls torch (``torch.manual_seed``, ``torch.set_default_dtype``) or changes
        ``sys.path``/``os.environ``. Data sets, loaders, downloads, checkpoints directories, logging
        and profiling set-up that the model does not depend on never run.
        """
        needed_at: Dict[int, Set[str]] = {}
        if last_relevant is None:
            return set(), {i: set(needed_after) for i in range(len(stmts))}
        needed = set(needed_after)
        for stmt in stmts[last_relevant + 1:]:
            # statements after the last relevant one run only when the function is not where the
            # replay stops; a `return` hands its values back in any case
            if isinstance(stmt, ast.Return) or not terminal:
                needed |= _reads(stmt)
        for stmt in stmts:
            if isinstance(stmt, (ast.Global, ast.Nonlocal)):
                needed |= set(stmt.names)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # a function reads the names of its enclosing scope when it is called, whenever
                # it was defined
                needed |= self._def_reads(stmt)
        skip: Set[int] = set()
        for i in range(len(stmts) - 1, -1, -1):
            stmt = stmts[i]
            needed_at[i] = set(needed)
            if i > last_relevant:
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if stmt.lineno in self.dropped:
                continue
            if (id(stmt) in self.synthetic or isinstance(stmt, _NEVER_WRAP) or self._is_rel(stmt)
                    or _plain_assignment(stmt) or self._keeps(stmt, needed)):
                needed |= _reads(stmt)
                continue
            skip.add(i)
        return skip, needed_at

    def _def_reads(self, node: ast.stmt) -> Set[str]:
        """Names a definition may read when it runs. Training loops never run, so what only they
        read is not needed; the set-up before them (``main()`` building and wrapping the model,
        then training) does run and reads module-level settings (``learning_rate = 6e-4``)."""
        out: Set[str] = set()
        todo = [node]
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and n.lineno in self.dropped:
                continue
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                out.add(n.id)
            todo.extend(ast.iter_child_nodes(n))
        return out

    def _keeps(self, stmt: ast.stmt, needed: Set[str]) -> bool:
        binds = _binds(stmt)
        if binds & needed:
            return True
        objects = needed - self.imported
        # a statement that only computes a value nobody needs (`loader = DataLoader(dataset, ...)`)
        # runs only for a method call on a needed object; a bare call also for torch/sys calls and
        # for passing a needed object along
        bare = not binds
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                root = _root_name(node.func)
                if bare and (root in self.torch_names or root == "sys"):
                    return True                  # torch.manual_seed(0), torch.set_default_dtype(...)
                if isinstance(node.func, ast.Attribute) and root in objects:
                    return True                  # model.apply(init), config.update(...)
                if not bare:
                    continue
                for arg in list(node.args) + [k.value for k in node.keywords]:
                    if isinstance(arg, ast.Starred):
                        arg = arg.value
                    if isinstance(arg, ast.Name) and arg.id in objects:
                        return True              # apply_activation_checkpointing(model, ...)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, (ast.Attribute, ast.Subscript)):
                            root = _root_name(sub)
                            if root in objects or root in self.torch_names or _dotted_name(sub).startswith(
                                    ("os.environ", "sys.")):
                                return True      # model.head.weight = ..., cfg["layers"] = 2
        return False

    def _tolerant(self, stmt: ast.stmt) -> ast.stmt:
        handler = ast.ExceptHandler(
            type=ast.Name("Exception", ast.Load()), name="__fsdp_lint_exc__",
            body=[_call_stmt(_SKIP, ast.Constant(stmt.lineno), ast.Name("__fsdp_lint_exc__", ast.Load()), like=stmt)],
        )
        return ast.copy_location(ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[]), stmt)


class _DropLoops(ast.NodeTransformer):
    def __init__(self, dropped: Set[int]):
        self.dropped = dropped

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for attr in ("body", "orelse", "finalbody"):
            stmts = getattr(node, attr, None)
            if isinstance(stmts, list) and stmts and all(isinstance(x, ast.stmt) for x in stmts):
                setattr(node, attr, [ast.copy_location(ast.Pass(), x)
                                     if isinstance(x, (ast.For, ast.AsyncFor, ast.While)) and x.lineno in self.dropped
                                     else x for x in stmts])
        return node


def _plain_assignment(stmt: ast.stmt) -> bool:
    """`batch_size = 12`, `dims = (64, 128)`, `lr = base_lr * 2`: no call, nothing to load; always
    run, since settings like these are read from places the slice cannot see (``exec``, ``globals()``)."""
    return isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and not any(
        isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)) for n in ast.walk(stmt))


def _reads(node: ast.AST) -> Set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _binds(node: ast.AST) -> Set[str]:
    out = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


def _root_name(node: ast.AST) -> Optional[str]:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted_name(node.value)
    return ""


def compile_replay(facts: SourceFacts):
    tree = ast.parse(facts.text, filename=facts.path)
    # issue 8: `from __future__ import ...` must stay first, which the transform's `try` wrappers break:
    # compile with the features' flags instead
    import __future__
    flags = 0
    for stmt in [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]:
        tree.body.remove(stmt)
        flags |= sum(getattr(__future__, a.name).compiler_flag for a in stmt.names if hasattr(__future__, a.name))
    transformer = _Transformer(facts)
    tree = transformer.module(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, facts.path, "exec", flags=flags, dont_inherit=True), transformer.terminal_spans
