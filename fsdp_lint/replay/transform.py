"""The code transform applied to the entry file and to every project-local module it imports.

It never changes what valid code means beyond these points, and it keeps line numbers:

* ``from __future__`` imports stay first; any other failing top-level import binds a tracked stand-in;
* training/data loops (``for batch in loader``, loops that call ``.backward()``/``.step()``) end the
  replay where they start: reaching one means training starts (the static second line behind the
  boundaries the sandbox detects while running);
* statements of project code -- the entry's module level, functions and methods, but not the
  methods of model classes, not ``raise``/``assert``/``return`` and nothing inside the file's own
  ``try`` -- run so that a failure can be skipped: a data set, tokenizer or checkpoint that does not
  exist here does not stop the replay. The runtime decides at the failure whether it may be skipped
  (never when it comes from model construction, a wrap call, a policy, a freeze, a cast or an
  optimizer), and which skipped statement a later failure goes back to;
* in the entry file, statements before the last one that matters for the plan that nothing later needs (data
  sets, loaders, logging; not registrations, `replay.registrations`) never run, nor anything after it.
"""
from __future__ import annotations

import ast
import os
import types
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from fsdp_lint.entry.source import SourceFacts
from fsdp_lint.replay.kept_calls import changes_parts, environment_setters, root_name as _root_name, sets_library_state
from fsdp_lint.replay.registrations import registers

from fsdp_lint.replay.caught_handlers import tell_caught
from fsdp_lint.replay.deciding import data_only_sites
from fsdp_lint.replay.stub_imports import (  # noqa: F401  the helpers' names, and what the transform makes
    _EXC, CAUGHT, HELPER_NAMES, LENGTH, LOOP, REBIND, SETUP_DONE, SKIP, SKIPPABLE, STUB_IMPORT, _call_stmt, _globals_call,
    _located, length_fallback, tolerant_import, tolerant_local_import,
)

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_NEVER_WRAP = _DEFS + (ast.Return, ast.Global, ast.Nonlocal, ast.Pass, ast.Break, ast.Continue, ast.Import,
                       ast.ImportFrom, ast.Raise, ast.Assert)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_BUILTINS = frozenset(dir(__import__("builtins")))


@dataclass
class Transformed:
    code: types.CodeType
    # line of a statement that may be skipped -> the statement (see `binding`)
    tolerant: Dict[int, ast.stmt] = field(default_factory=dict)
    # lines where a failure is never skipped: statements holding a wrap/freeze/cast/optimizer/policy
    # site, and the headers of blocks holding a wrap
    fatal_lines: Set[int] = field(default_factory=set)
    # (function name, first line; "<module>", 0) -> line spans of its last relevant statement: the
    # entry's setup is done when every frame of it is there (see SETUP_DONE)
    terminal_spans: Dict[Tuple[str, int], List[Tuple[int, int]]] = field(default_factory=dict)


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


def _child_stmt_lists(stmt: ast.AST):
    """The statement lists directly inside `stmt` (bodies, else/finally blocks, handlers, cases)."""
    for attr in ("body", "orelse", "finalbody"):
        sub = getattr(stmt, attr, None)
        if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
            yield sub
    for h in getattr(stmt, "handlers", None) or ():
        yield h.body
    for case in getattr(stmt, "cases", None) or ():
        yield case.body


def iter_stmts(node: ast.AST):
    """Every statement under `node`, pre-order, without visiting expressions (fast on large files)."""
    todo = [s for lst in _child_stmt_lists(node) for s in lst][::-1]
    while todo:
        stmt = todo.pop()
        yield stmt
        for lst in reversed(list(_child_stmt_lists(stmt))):
            todo.extend(reversed(lst))


def _returns(stmt: ast.stmt) -> bool:
    """A block holding a ``return`` of its own function (``try: ... return cfg`` in a config loader):
    skipping it would make the function return None silently, so it runs as written (its other
    statements may still be skipped) and a failure in it reaches the caller (trials: OLMo's
    ``BaseConfig.load`` turning an unknown override key into ``OLMoConfigurationError``)."""
    if isinstance(stmt, _DEFS):
        return False
    for lst in _child_stmt_lists(stmt):
        for sub in lst:
            if isinstance(sub, ast.Return) or (not isinstance(sub, _DEFS) and _returns(sub)):
                return True
    return False


def _yields(stmt: ast.stmt) -> bool:
    """The statement yields (not in a nested function): what is raised at its ``yield`` is the consumer's
    failure thrown into the generator -- the body of ``with region():`` of a ``@contextmanager`` --, and
    skipping it there would swallow that failure and carry on after the ``with``."""
    todo: List[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        todo.extend(c for c in ast.iter_child_nodes(node)
                    if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)))
    return False


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


class _Transformer:
    def __init__(self, facts: SourceFacts, *, main: bool, relevant: Set[int], dropped: Set[int]):
        self.main = main
        self.relevant = relevant
        self.dropped = dropped
        self.stepping = dropped & facts.stepping_loop_lines
        self.param_writers: Set[str] = set()     # the project's functions that write into what they are given
        # a freeze site runs guarded, and so does a site given data only: one that freezes what no wrap is given (a
        # VAE loaded after the wrap, whose load was skipped) or prepares a data loader is skipped in turn
        # (Failures._is_fatal_line); any other failure there ends the replay
        self.guarded_lines = {s.line for s in facts.sites if s.kind == "freeze"}
        self.model_classes = {name for name, _ in facts.module_classes}
        self.tolerant: Dict[int, ast.stmt] = {}
        self.terminal_spans: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
        self._rel_cache: Dict[int, bool] = {}
        self.synthetic: Set[int] = set()          # ids of statements the transform inserted
        self.imported: Set[str] = set()           # names bound by imports anywhere in the file
        self.torch_names: Set[str] = set()        # ... of them, those bound from torch
        self.import_package: Dict[str, str] = {}  # ... of them, the top-level package each came from
        self._assigned_from: Dict[str, Set[str]] = {}   # in the list being sliced: name -> names its value read
        self._part_of: Dict[str, Optional[str]] = {}    # a name bound to a part of an object: name -> the object

    # -- the module ----------------------------------------------------------------------------
    def module(self, tree: ast.Module) -> ast.Module:
        for node in iter_stmts(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                base = node.module or "" if isinstance(node, ast.ImportFrom) else ""
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    local = alias.asname or alias.name.split(".")[0]
                    self.imported.add(local)
                    # a relative import comes from the file's own package ("."): project modules keep
                    # process state as libraries do (kept_calls.sets_library_state)
                    self.import_package[local] = "." if isinstance(node, ast.ImportFrom) and node.level \
                        else (base or alias.name).split(".")[0]
                    if (base or alias.name).split(".")[0] == "torch":
                        self.torch_names.add(local)
        self.trainers = {d.name for d in ast.walk(tree) if isinstance(d, _DEFS[:2]) and self.stepping & {
            n.lineno for n in ast.walk(d) if isinstance(n, _LOOPS)}}
        self.environment_setters = environment_setters(tree)
        # loops that step an optimizer or call backward() are training: the replay ends where one
        # starts; the entry's other data/epoch loops do not run (their results matter for nothing)
        _StopAtLoops(self.stepping, self.dropped if self.main else set(), self.model_classes).visit(tree)

        head: List[ast.stmt] = []
        rest = list(tree.body)
        # the docstring and `from __future__` imports must stay the first statements
        while rest and (_is_future(rest[0]) or (not head and _is_docstring(rest[0]))):
            head.append(rest.pop(0))
        body: List[ast.stmt] = []
        for stmt in rest:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                body.append(self._synthetic(tolerant_import(stmt)))
                body.append(self._synthetic(_call_stmt(REBIND, _globals_call(), like=stmt)))
            elif isinstance(stmt, _DEFS):
                body.append(stmt)
                body.append(self._synthetic(_call_stmt(REBIND, _globals_call(), like=stmt)))
            else:
                body.append(stmt)
        if self.main:
            spans: List[Tuple[int, int]] = []
            tree.body = head + self._body(body, needed_after=set(), tolerate=True, spans=spans)
            self.terminal_spans[("<module>", 0)] = spans
        else:
            # an imported module's top level is not sliced (its names are read by other modules the
            # slice cannot see), but its statements may be skipped like the entry's: a module-level
            # `torch.ops.xformers...` lookup, tokenizer or env setup that cannot run here (trials)
            tree.body = head + self._body(body, needed_after=set(), tolerate=True, slice_=False,
                                          terminal=False)
        return tree

    def _synthetic(self, node: ast.stmt) -> ast.stmt:
        self.synthetic.add(id(node))
        return node

    # -- definitions -----------------------------------------------------------------------------
    def _visit_defs_in(self, stmt: ast.stmt) -> None:
        """Transform the functions defined by `stmt` (a def, a class, or a block holding defs)."""
        if isinstance(stmt, _DEFS):
            self._visit_def(stmt)
            return
        for attr in ("body", "orelse", "finalbody"):
            for sub in getattr(stmt, attr, None) or []:
                if isinstance(sub, ast.stmt):
                    self._visit_defs_in(sub)
        for handler in getattr(stmt, "handlers", None) or []:
            for sub in handler.body:
                self._visit_defs_in(sub)

    def _visit_def(self, node: ast.stmt, in_model: bool = False) -> None:
        if isinstance(node, ast.ClassDef):
            # methods of model classes are model code: it runs as written (an error in a model's
            # __init__ is an error; its forward runs only when training starts)
            model = in_model or node.name in self.model_classes
            for item in node.body:
                if isinstance(item, _DEFS):
                    self._visit_def(item, in_model=model)
            return
        if in_model:
            return
        spans: List[Tuple[int, int]] = []
        node.body = self._body(node.body, needed_after=set(), tolerate=True, slice_=self.main, spans=spans)
        if node.name == "__len__" and isinstance(node, ast.FunctionDef):
            node.body = [length_fallback(node)]
        if self.main:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            self.terminal_spans[(node.name, first)] = spans

    # -- statement lists -----------------------------------------------------------------------
    def _body(self, stmts: List[ast.stmt], needed_after: Set[str], tolerate: bool,
              slice_: bool = True, spans: Optional[List[Tuple[int, int]]] = None,
              terminal: bool = True) -> List[ast.stmt]:
        """Transform one statement list. `tolerate`: its statements may be skipped when they fail
        (not inside the file's own ``try``); `needed_after`: names the code after it reads;
        `terminal`: its last relevant statement ends the enclosing function's relevant work (the
        entry file then marks the end of the setup after it, and records its span in `spans`)."""
        spans = [] if spans is None else spans
        mark = self.main and terminal
        last_relevant = max((i for i, s in enumerate(stmts) if self._is_rel(s)), default=None)
        if slice_ and self.main:
            skip, needed_at = self._slice(stmts, last_relevant, needed_after)
        else:
            skip, needed_at = set(), {i: set(needed_after) for i in range(len(stmts))}
        out: List[ast.stmt] = []
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, _DEFS):
                self._visit_def(stmt)
                out.append(stmt)
                continue
            if i in skip:
                out.append(ast.copy_location(ast.Pass(), stmt))
                continue
            if id(stmt) in self.synthetic or _is_stop(stmt) or _is_docstring(stmt):
                out.append(stmt)      # (a docstring stays the body's first statement: `__doc__` is read at import)
                continue
            if tolerate and isinstance(stmt, (ast.Import, ast.ImportFrom)):
                out.append(tolerant_local_import(stmt))
                continue
            if not self._is_rel(stmt) and not _returns(stmt):
                if self.main and isinstance(stmt, ast.While) and slice_ and _calls_something(stmt):
                    # a `while` of the entry's setup that matters for nothing and calls out (a wait or
                    # retry loop: `while not os.path.exists(ready): time.sleep(10)`); a loop that only
                    # computes (`while dim % 8: dim += 1`) runs
                    out.append(ast.copy_location(ast.Pass(), stmt))
                elif (isinstance(stmt, _NEVER_WRAP) and not isinstance(stmt, ast.Assert)) or not tolerate or _yields(stmt):
                    # (an `assert` is wrapped: only its failure on a name a skipped statement would have bound
                    # is skipped -- Failures.may_skip -- never the script's own check)
                    self._visit_defs_in(stmt)
                    out.append(stmt)
                else:
                    self._visit_defs_in(stmt)
                    out.append(self._tolerant(stmt))
                continue
            if tolerate and isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)) and not _yields(stmt) and any(
                    stmt.lineno <= ln <= (stmt.end_lineno or stmt.lineno) for ln in self.guarded_lines):
                out.append(self._tolerant(stmt))
                continue
            # a relevant statement runs as written; blocks inside it are transformed in turn
            is_last = mark and i == last_relevant
            inner: List[Tuple[int, int]] = []
            kw = dict(slice_=slice_, spans=inner, terminal=is_last)
            if isinstance(stmt, ast.Try) or (hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar)):
                own = bool(stmt.handlers)
                stmt.body = self._body(stmt.body, needed_at[i], tolerate=tolerate and not own, **kw)
                for handler in stmt.handlers:
                    handler.body = self._body(handler.body, needed_at[i], tolerate=tolerate, **kw)
                for attr in ("orelse", "finalbody"):
                    sub = getattr(stmt, attr)
                    if sub:
                        setattr(stmt, attr, self._body(sub, needed_at[i], tolerate=tolerate, **kw))
            elif isinstance(stmt, (ast.If, ast.With, ast.AsyncWith)):
                for attr in ("body", "orelse"):
                    sub = getattr(stmt, attr, None)
                    if sub:
                        setattr(stmt, attr, self._body(sub, needed_at[i], tolerate=tolerate, **kw))
            elif isinstance(stmt, _LOOPS):
                loop_needed = needed_at[i] | _reads(stmt)     # the next iteration reads them too
                inner = []
                for attr in ("body", "orelse"):
                    sub = getattr(stmt, attr)
                    if sub:
                        setattr(stmt, attr, self._body(sub, loop_needed, tolerate=tolerate, slice_=slice_,
                                                       terminal=False)
                                or [ast.copy_location(ast.Pass(), stmt)])
            elif hasattr(ast, "Match") and isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    case.body = self._body(case.body, needed_at[i], tolerate=tolerate, **kw)
            else:
                self._visit_defs_in(stmt)
            out.append(stmt)
            if is_last:
                spans.extend(inner or [(stmt.lineno, stmt.end_lineno or stmt.lineno)])
                out.append(self._synthetic(_call_stmt(SETUP_DONE, like=stmt)))
        if out:
            return out
        if stmts:
            return [ast.copy_location(ast.Pass(), stmts[0])]
        return [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)]

    def _is_rel(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, _DEFS):
            return False
        known = self._rel_cache.get(id(stmt))
        if known is None:
            known = stmt.lineno in self.relevant or any(
                self._is_rel(sub) for lst in _child_stmt_lists(stmt) for sub in lst)
            self._rel_cache[id(stmt)] = known
        return known

    def _slice(self, stmts: List[ast.stmt], last_relevant: Optional[int],
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
        for stmt in stmts[last_relevant + 1:]:     # a helper's `return model` runs after it (a loop binds its var)
            needed |= _reads(stmt) - (_binds(stmt.target) if isinstance(stmt, _LOOPS[:2]) else set())
        for stmt in stmts:
            if isinstance(stmt, (ast.Global, ast.Nonlocal)):
                needed |= set(stmt.names)
            elif isinstance(stmt, _DEFS):
                # a function reads the names of its enclosing scope when it is called, whenever
                # it was defined
                needed |= self._def_reads(stmt)
        # `blocks = model.layers` ... `for b in blocks:`: what a name of this list was assigned from
        self._assigned_from, self._part_of = {}, {}
        for stmt in stmts:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self._assigned_from[stmt.targets[0].id] = _reads(stmt.value)
                # `group = parser.add_argument_group(...)`, `head = model.head`: a part of the object
                if isinstance(stmt.value, (ast.Attribute, ast.Subscript)) or isinstance(stmt.value, ast.Call) \
                        and isinstance(stmt.value.func, ast.Attribute):
                    self._part_of[stmt.targets[0].id] = _root_name(stmt.value)
        skip: Set[int] = set()
        for i in range(len(stmts) - 1, -1, -1):
            stmt = stmts[i]
            needed_at[i] = set(needed)
            if i > last_relevant:
                continue
            if isinstance(stmt, _DEFS) or _is_stop(stmt):
                continue
            # a block that returns from the function (`if path is None: return 0`) decides what runs after it
            if (id(stmt) in self.synthetic or isinstance(stmt, _NEVER_WRAP) or self._is_rel(stmt)
                    or _plain_assignment(stmt) or _returns(stmt) or self._keeps(stmt, needed)):
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
            if isinstance(n, _LOOPS) and n.lineno in self.dropped:
                continue
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                out.add(n.id)
            todo.extend(ast.iter_child_nodes(n))
        return out

    def _keeps(self, stmt: ast.stmt, needed: Set[str]) -> bool:
        binds = _binds(stmt)
        if binds & needed:
            return True
        objects = needed - self.imported - _BUILTINS      # `open(...)`, `range(2)` are no object the model needs
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            over = _reads(stmt.iter)
            over |= {n for name in over for n in self._assigned_from.get(name, ())}
            if over & objects and changes_parts(stmt, objects | _binds(stmt.target)):
                return True     # `for block in model.layers: parallelize_module(block, tp_mesh, plan)`
        # a statement that only computes a value nobody needs (`loader = DataLoader(dataset, ...)`) runs only
        # for a method call on a needed object; a bare call also for torch/sys calls and passing a needed object
        bare = not binds
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                root = _root_name(node.func)
                if imports(node.func) or bare and (root in self.torch_names or root == "sys" or registers(node.func)):
                    return True                  # torch.manual_seed(0), OmegaConf.register_new_resolver(...),
                                                 # importlib.import_module("exps.big") (its registrations)
                if bare and sets_library_state(self.import_package, self.trainers, root, needed):
                    return True                  # fs_init.initialize_model_parallel(1), then fs_init.get_...()
                if bare and isinstance(node.func, ast.Name) and node.func.id in self.environment_setters:
                    return True                  # _bootstrap_env() sets os.environ the next lines read
                if isinstance(node.func, ast.Attribute) and (root in objects or self._part_of.get(root) in objects):
                    return True                  # model.apply(init), config.update(...), group.add_argument(...)
                writes = isinstance(node.func, ast.Name) and node.func.id in self.param_writers
                if (not bare and not writes) or (isinstance(node.func, ast.Name) and node.func.id in self.trainers):
                    continue                     # issue 18: train(model) holds a training loop: no set-up
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
        self.tolerant[stmt.lineno] = stmt        # what it binds is worked out if it fails
        handler = ast.ExceptHandler(
            type=ast.Name(SKIPPABLE, ast.Load()), name=_EXC,
            body=[ast.If(
                test=ast.UnaryOp(ast.Not(), ast.Call(ast.Name(SKIP, ast.Load()), [
                    ast.Constant(stmt.lineno), ast.Name(_EXC, ast.Load())], [])),
                body=[ast.Raise()], orelse=[])],
        )
        return ast.copy_location(ast.Try(body=[stmt], handlers=[_located(handler, stmt)], orelse=[], finalbody=[]),
                                 stmt)


def _is_stop(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in (LOOP, SETUP_DONE))


class _StopAtLoops:
    """Training loops (outside model classes) become a call that ends the replay there; `skipped`
    data loops become ``pass``. Walks statement lists only."""

    def __init__(self, stepping: Set[int], skipped: Set[int], model_classes: Set[str]):
        self.stepping = stepping
        self.skipped = skipped - stepping
        self.model_classes = model_classes

    def visit(self, node: ast.AST) -> None:
        if not (self.stepping or self.skipped):
            return
        todo = [node]
        while todo:
            n = todo.pop()
            if isinstance(n, ast.ClassDef) and n.name in self.model_classes:
                continue
            for attr in ("body", "orelse", "finalbody"):
                lst = getattr(n, attr, None)
                if isinstance(lst, list) and lst and isinstance(lst[0], ast.stmt):
                    lst[:] = [self._replace(x) for x in lst]
                    todo.extend(lst)
            for h in getattr(n, "handlers", None) or ():
                h.body[:] = [self._replace(x) for x in h.body]
                todo.extend(h.body)
            for case in getattr(n, "cases", None) or ():
                case.body[:] = [self._replace(x) for x in case.body]
                todo.extend(case.body)

    def _replace(self, stmt: ast.stmt) -> ast.stmt:
        if not isinstance(stmt, _LOOPS):
            return stmt
        if stmt.lineno in self.stepping:
            return _call_stmt(LOOP, ast.Constant(stmt.lineno), like=stmt)
        if stmt.lineno in self.skipped:
            return ast.copy_location(ast.Pass(), stmt)
        return stmt


def _calls_something(stmt: ast.stmt) -> bool:
    return any(isinstance(n, (ast.Call, ast.Await)) for n in ast.walk(stmt))


def imports(func: ast.AST) -> bool:
    """A call that imports or runs a module: its body registers what later code looks up."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__", "reload", "run_module", "run_path", "exec_module", "load_module")


def _plain_assignment(stmt: ast.stmt) -> bool:
    """`batch_size = 12`, `dims = (64, 128)`, `lr = base_lr * 2`: no call, nothing to load; always
    run, since settings like these are read from places the slice cannot see (``exec``, ``globals()``)."""
    return isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and not any(
        isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)) for n in ast.walk(stmt))


def _reads(node: ast.AST) -> Set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def binds(node: ast.AST) -> Set[str]:
    """Names a statement binds (assignments, definitions, imports, ``except ... as``)."""
    out = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    for n in ast.walk(node):
        if isinstance(n, _DEFS):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


_binds = binds


def binding(stmt: ast.stmt) -> Tuple[FrozenSet[str], FrozenSet[str]]:
    """(names, attribute names) a statement binds: what a later failure may miss when it is skipped."""
    return frozenset(binds(stmt)), frozenset(_assigned_attrs(stmt))


def _assigned_attrs(node: ast.AST) -> Set[str]:
    """Attribute names a statement assigns (``self.tokenizer = ...`` -> ``tokenizer``)."""
    out: Set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
    return out


def _dotted_name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted_name(node.value)
    return ""


def transform(facts: SourceFacts, *, main: bool, relevant: Optional[Set[int]] = None,
              dropped: Optional[Set[int]] = None, param_writers: Set[str] = frozenset()) -> Transformed:
    """Compile `facts`' module with the transform. `main`: the entry file (its module level is
    sliced and tolerant); `relevant`/`dropped`: relevant statement lines and training loops (default:
    the module's own facts; the replay passes them computed across the project)."""
    tree = facts.take_tree()
    fatal = fatal_lines(tree, facts)
    transformer = _Transformer(facts, main=main,
                               relevant=facts.relevant_stmt_lines if relevant is None else relevant,
                               dropped=facts.dropped_loop_lines if dropped is None else dropped)
    transformer.param_writers = set(param_writers)
    tell_caught(tree, transformer.synthetic)
    transformer.guarded_lines |= data_only_sites(tree, facts.sites)
    tree = transformer.module(tree)
    # every node the transform made has a position already (ast.fix_missing_locations walks the
    # whole tree in Python: a second on a large file)
    # an absolute file name: a setup that changes folder (Hydra's run folder) still names its lines
    code = compile(tree, os.path.abspath(facts.path), "exec", dont_inherit=True)
    return Transformed(code=code, tolerant=transformer.tolerant, fatal_lines=fatal,
                       terminal_spans=transformer.terminal_spans)


def fatal_lines(tree: ast.Module, facts: SourceFacts) -> Set[int]:
    """Lines of the statements that hold a site (all their lines), and of the headers of the blocks
    that hold a wrap call (``for block in model.layers:``)."""
    site_lines = {s.line for s in facts.sites}
    wrap_lines = {s.line for s in facts.sites if s.kind in ("fsdp1", "fsdp2", "policy")}
    out: Set[int] = set()
    if not site_lines:
        return out
    for node in iter_stmts(tree):
        if isinstance(node, _DEFS):
            continue
        end = node.end_lineno or node.lineno
        bodies = [b for b in (getattr(node, "body", None), getattr(node, "orelse", None)) if isinstance(b, list) and b]
        if not bodies:
            if any(node.lineno <= ln <= end for ln in site_lines):
                out.update(range(node.lineno, end + 1))
            continue
        header_end = max(node.lineno, bodies[0][0].lineno - 1) if isinstance(bodies[0][0], ast.stmt) else node.lineno
        if any(node.lineno <= ln <= end for ln in wrap_lines):
            out.update(range(node.lineno, header_end + 1))
    return out


def compile_replay(facts: SourceFacts):
    """The entry file's transformed code (kept for callers of the single-file API)."""
    return transform(facts, main=True).code
