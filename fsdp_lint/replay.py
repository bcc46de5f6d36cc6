"""Replay a training file's setup code against a meta-device model, with FSDP replaced by recorders.

The file is compiled with its own line numbers after a small AST transform:

* training/data loops (``for batch in loader``, loops that call ``.backward()``/``.step()``, every
  ``while``) are replaced by ``pass``;
* statements that do not affect the wrap plan run inside ``try``: a data set or checkpoint that
  cannot be loaded here is skipped, not fatal;
* after the last statement that affects the plan (a wrap call, a freeze, a dtype change, an
  optimizer, or a call of a function that does one of these) a checkpoint stops the replay, so
  nothing after the wrap -- the training loop -- ever runs;
* the ``if __name__ == "__main__":`` block runs only up to that checkpoint.

While it runs, tensors are created on the meta device, ``torch.distributed``/``torch.cuda`` calls are
simulated for rank 0 of ``world_size`` ranks, ``fully_shard``/``FullyShardedDataParallel`` record
their calls instead of sharding, and optimizers record which parameters they hold.

The same replay runs with the real FSDP APIs (``real=True``) for ``--run`` and for the tests that
compare the static plan with what torch builds.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import fnmatch
import io
import itertools
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from fsdp_lint.source import SourceFacts

_counter = itertools.count()


class ReplayError(Exception):
    """The file's setup code could not be replayed (message is one line)."""


class _StopReplay(BaseException):
    """Raised at the terminal checkpoint: everything the plan needs has run."""


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------
@dataclass
class Position:
    path: str
    line: int
    col: int = 1


@dataclass
class WrapCall:
    api: str                                  # "fsdp1" | "fsdp2"
    seq: int                                  # order among all records
    modules: List[Any]                        # module objects as passed (FSDP2 list -> several)
    kwargs: Dict[str, Any]
    pos: Position
    # FSDP1: the units an auto-wrap policy made inside this call, post-order, as module objects
    auto_wrapped: List[Any] = field(default_factory=list)
    policy_desc: Optional[str] = None
    policy_classes: List[str] = field(default_factory=list)   # class names a class-based policy names
    state: Dict[int, Tuple[bool, Any]] = field(default_factory=dict)  # id(param) -> (requires_grad, dtype)


@dataclass
class OptimizerCall:
    cls: str
    seq: int
    param_ids: List[int]
    pos: Position
    obj: Any = None                           # the optimizer itself (real replays only: --run steps it)


@dataclass
class ParamEvent:
    kind: str          # "freeze" | "dtype"
    seq: int
    param_ids: List[int]
    value: Any         # requires_grad bool, or dtype name
    pos: Position


@dataclass
class ReplayResult:
    model: Any                                # the root nn.Module (meta)
    target: str                               # how it was found, e.g. "train.py:Transformer"
    wrap_calls: List[WrapCall]
    optimizers: List[OptimizerCall]
    param_events: List[ParamEvent]
    skipped: List[Tuple[int, str]]            # (line, error) of setup statements that failed harmlessly
    world_size: int
    mesh_sizes: List[Tuple[int, ...]]
    namespace: Optional[Dict[str, Any]] = None   # the replayed file's globals (--run: example_inputs())


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
    transformer = _Transformer(facts)
    tree = transformer.module(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, facts.path, "exec"), transformer.terminal_spans


# --------------------------------------------------------------------------------------------
# the simulated world
# --------------------------------------------------------------------------------------------
class FakeMesh:
    """Stands in for a DeviceMesh built by the file (``init_device_mesh("cuda", (ws,))``)."""

    def __init__(self, device_type: str, shape: Tuple[int, ...], mesh_dim_names=None):
        self.device_type = device_type
        self.mesh_shape = tuple(int(s) for s in shape)
        self.mesh_dim_names = tuple(mesh_dim_names) if mesh_dim_names else None
        self.ndim = len(self.mesh_shape)

    def size(self, mesh_dim: Optional[int] = None) -> int:
        if mesh_dim is None:
            n = 1
            for s in self.mesh_shape:
                n *= s
            return n
        return self.mesh_shape[mesh_dim]

    @property
    def shape(self):
        return self.mesh_shape

    def __getitem__(self, names):
        if isinstance(names, str):
            names = (names,)
        if not self.mesh_dim_names:
            raise KeyError(names)
        idx = [self.mesh_dim_names.index(n) for n in names]
        return FakeMesh(self.device_type, tuple(self.mesh_shape[i] for i in idx), names)

    def get_group(self, *args, **kwargs):
        return None

    def get_local_rank(self, *args, **kwargs):
        return 0

    def get_rank(self):
        return 0

    def _flatten(self, *args, **kwargs):
        return FakeMesh(self.device_type, (self.size(),), None)

    def __repr__(self):
        return f"FakeMesh({self.device_type!r}, {self.mesh_shape})"


class _Stub:
    """A permissive stand-in for a module that is not installed here (wandb, deepspeed, ...)."""

    def __init__(self, name="stub"):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Stub(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        return _Stub(self._name + "()")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)


def _parse_argparse_defaults(parser, args=None, namespace=None):
    import argparse

    ns = namespace or argparse.Namespace()
    for action in parser._actions:
        if action.dest in (argparse.SUPPRESS, "help") or action.default is argparse.SUPPRESS:
            continue
        if not hasattr(ns, action.dest):
            default = action.default
            if isinstance(default, str) and action.type is not None and action.type is not str:
                try:
                    default = action.type(default)
                except Exception:
                    pass
            setattr(ns, action.dest, default)
    return ns, []


class Recorder:
    """Collects wrap calls, optimizers and parameter events during a replay."""

    def __init__(self, path: str, world_size: int, real: bool = False):
        self.path = os.path.abspath(path)
        self.world_size = world_size
        self.real = real
        self.wrap_calls: List[WrapCall] = []
        self.optimizers: List[OptimizerCall] = []
        self.param_events: List[ParamEvent] = []
        self.skipped: List[Tuple[int, str]] = []
        self.parents: Dict[int, Any] = {}        # id(child module) -> parent module
        self.modules_seen: Dict[int, Any] = {}
        self.mesh_sizes: List[Tuple[int, ...]] = []
        self.seq = itertools.count()
        self.terminal_spans: Dict[Tuple[str, int], List[Tuple[int, int]]] = {}
        self.replay_code_names: Set[str] = set()
        # structural changes after the latest wrap call (record mode), undone at the end so the
        # tree is the model as it was wrapped: (kind, owner, name, old value, new child, its old parent)
        self.undo: List[Tuple[str, Any, str, Any, Any, Any]] = []
        self.rebind: Optional[Callable[[dict], None]] = None

    def position(self) -> Position:
        frame = sys._getframe(1)
        fallback = None
        while frame is not None:
            fname = frame.f_code.co_filename
            if os.path.abspath(fname) == self.path:
                return Position(self.path, frame.f_lineno, _column(frame))
            if fallback is None and not _is_library(fname):
                fallback = Position(fname, frame.f_lineno, _column(frame))
            frame = frame.f_back
        return fallback or Position(self.path, 0)

    def checkpoint(self) -> None:
        frame = sys._getframe(1)
        # the checkpoint's own frame is at a terminal position by construction; every replayed
        # frame above it must be inside its terminal statement too
        frame = frame.f_back
        while frame is not None and os.path.abspath(frame.f_code.co_filename) == self.path:
            key = (frame.f_code.co_name, frame.f_code.co_firstlineno)
            spans = self.terminal_spans.get(key)
            if spans is None:
                return
            if not any(a <= frame.f_lineno <= b for a, b in spans):
                return
            frame = frame.f_back
        raise _StopReplay()

    def skip(self, line: int, exc: BaseException) -> None:
        self.skipped.append((line, f"{type(exc).__name__}: {exc}".splitlines()[0][:200]))

    def snapshot(self, modules) -> Dict[int, Tuple[bool, Any]]:
        state = {}
        for m in modules:
            for p in m.parameters():
                state[id(p)] = (bool(p.requires_grad), p.dtype)
        return state


def _column(frame) -> int:
    """1-based column of the call the frame is executing (Python >= 3.11 keeps positions), else 1."""
    try:
        positions = frame.f_code.co_positions()
        for i, pos in enumerate(positions):
            if i == frame.f_lasti // 2:
                line, _, col, _ = pos
                return col + 1 if col is not None and line == frame.f_lineno else 1
    except (AttributeError, ValueError):
        pass
    return 1


def _is_library(fname: str) -> bool:
    if fname.startswith("<"):
        return True
    norm = fname.replace("\\", "/")
    return any(s in norm for s in ("/site-packages/", "/dist-packages/", "/lib/python3", "/fsdp_lint/"))


def _parse_to_args(args, kwargs):
    import torch

    try:
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    except Exception:
        return None, None
    return device, dtype


@contextlib.contextmanager
def sandbox(rec: Recorder, directory: str):
    """Patch torch and the process environment for a replay; everything is restored on exit."""
    import argparse

    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401  before any patch: its modules bind init_device_mesh on import
    import torch.nn as nn
    from torch.overrides import TorchFunctionMode

    patches: List[Tuple[Any, str, Any]] = []

    def patch(obj, name, value):
        patches.append((obj, name, obj.__dict__.get(name, _MISSING) if isinstance(obj, type) else getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    ws = rec.world_size
    saved_env = dict(os.environ)
    saved_argv = list(sys.argv)
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    # torch's process-wide defaults a script may change (torch.set_default_dtype(torch.bfloat16),
    # torch.manual_seed(0), torch.set_grad_enabled(False), torch.set_num_threads(1))
    saved_torch = (torch.get_default_dtype(), torch.random.get_rng_state(), torch.is_grad_enabled(),
                   torch.get_num_threads(), torch.get_default_device())
    os.environ.update({
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(ws), "LOCAL_WORLD_SIZE": str(ws),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "GROUP_RANK": "0", "NODE_RANK": "0",
        # nothing is downloaded or logged remotely while a file is linted (from_pretrained uses
        # what is cached, wandb.init does nothing)
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
    })
    sys.argv = [rec.path]
    sys.path.insert(0, directory)

    # -- argparse: defaults only, fsdp-lint's own argv is never seen ------------------------
    patch(argparse.ArgumentParser, "parse_known_args", _parse_argparse_defaults)
    patch(argparse.ArgumentParser, "parse_args", lambda self, args=None, namespace=None:
          _parse_argparse_defaults(self, args, namespace)[0])

    # -- module tree bookkeeping -------------------------------------------------------------
    def on_register(parent, name, child):
        if rec.wrap_calls and not rec.real:
            # e.g. apply_activation_checkpointing(model) after FSDP(model, auto_wrap_policy=...):
            # FSDP built its units from the model as it was at the wrap
            rec.undo.append(("module", parent, name, parent._modules.get(name, _MISSING), child,
                             rec.parents.get(id(child), _MISSING)))
        if child is not None:
            rec.parents[id(child)] = parent
            rec.modules_seen[id(child)] = child
            rec.modules_seen[id(parent)] = parent
        return None

    handle = nn.modules.module.register_module_module_registration_hook(on_register)

    def on_register_param(module, name, param):
        if rec.wrap_calls and not rec.real:
            rec.undo.append(("param", module, name, module._parameters.get(name, _MISSING), None, None))
        return None

    param_handle = nn.modules.module.register_module_parameter_registration_hook(on_register_param)

    def noop():
        # a new function object each time: torch._dynamo maps torch functions to trace rules and
        # rejects one object registered under two names with different rules
        return lambda *a, **k: None

    owned_pg = False
    real_init_pg, real_destroy_pg = dist.init_process_group, dist.destroy_process_group
    if rec.real:
        # real FSDP needs a process group: the launcher's (``--run`` under torchrun), or a fake one
        # of `ws` ranks (no communication) that lives as long as the replay; the file's own
        # init/destroy calls are no-ops either way
        owned_pg = not dist.is_initialized()
        for name in ("init_process_group", "destroy_process_group"):
            patch(dist, name, noop())
        patch(dist, "is_torchelastic_launched", lambda: True)
    else:
        for name, value in {
            "init_process_group": noop(), "destroy_process_group": noop(), "barrier": noop(),
            "get_rank": lambda *a, **k: 0, "get_world_size": lambda *a, **k: ws,
            "is_initialized": lambda: True, "is_available": lambda: True,
            "get_local_rank": lambda *a, **k: 0, "get_node_local_rank": lambda *a, **k: 0,
            "all_reduce": noop(), "broadcast": noop(), "all_gather": noop(), "reduce": noop(),
            "new_group": noop(), "monitored_barrier": noop(), "is_torchelastic_launched": lambda: True,
        }.items():
            if hasattr(dist, name):
                patch(dist, name, value)

    # -- cuda: simulated (rank 0's device) ---------------------------------------------------
    for name, value in {
        "set_device": noop(), "current_device": lambda: _current_cuda_index(rec), "is_available": lambda: True,
        "device_count": lambda: ws, "manual_seed": noop(), "manual_seed_all": noop(), "synchronize": noop(),
        "empty_cache": noop(), "is_bf16_supported": lambda *a, **k: True, "reset_peak_memory_stats": noop(),
        "get_device_name": lambda *a, **k: "simulated", "get_device_capability": lambda *a, **k: (9, 0),
    }.items():
        patch(torch.cuda, name, value)
    patch(torch, "save", noop())          # checkpoints are never written
    if not rec.real:
        patch(torch, "compile", lambda model=None, *a, **k: model if model is not None else (lambda f: f))

    # -- torch.multiprocessing.spawn(fn, args, nprocs): rank 0 runs in this process -----------
    import torch.multiprocessing as tmp

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        fn(0, *args)

    patch(tmp, "spawn", spawn)

    # -- init_device_mesh --------------------------------------------------------------------
    import torch.distributed.device_mesh as dm_mod

    real_init_mesh = dm_mod.init_device_mesh

    def init_device_mesh(device_type, mesh_shape, *args, mesh_dim_names=None, **kwargs):
        rec.mesh_sizes.append(tuple(mesh_shape))
        if rec.real:
            # a real CPU mesh over the (fake) process group, built outside the meta-device modes
            with torch._C.DisableTorchFunction():
                mesh_type = rec.device.type if getattr(rec, "device", None) is not None else "cpu"
                return real_init_mesh(mesh_type, tuple(mesh_shape), mesh_dim_names=mesh_dim_names)
        return FakeMesh(device_type, tuple(mesh_shape), mesh_dim_names)

    patch(dm_mod, "init_device_mesh", init_device_mesh)
    if hasattr(dist, "init_device_mesh"):
        patch(dist, "init_device_mesh", init_device_mesh)

    # -- devices: everything lives on meta; real FSDP1 needs real tensors (CPU) ----------------
    target_device = torch.device("meta")
    if rec.real and (getattr(rec, "api", None) != "fsdp2" or getattr(rec, "device", None) is not None):
        # --run passes the rank's device: the model is materialised there, FSDP2 included
        target_device = getattr(rec, "device", None) or torch.device("cpu")
    real_module_to = nn.Module.to

    # one user statement is one event: the tensor-level calls a module-level call makes inside
    # (``Module.requires_grad_`` -> ``Parameter.requires_grad_``) are not recorded again
    inner = [0]

    @contextlib.contextmanager
    def quiet():
        inner[0] += 1
        try:
            yield
        finally:
            inner[0] -= 1

    def event(kind, params, value):
        if not inner[0]:
            rec.param_events.append(ParamEvent(kind, next(rec.seq), [id(p) for p in params], value,
                                               rec.position()))

    def module_to(self, *args, **kwargs):
        device, dtype = _parse_to_args(args, kwargs)
        if dtype is not None:
            before = [p for p in self.parameters()]
            with quiet():
                out = real_module_to(self, dtype=dtype)
            event("dtype", before, str(dtype).replace("torch.", ""))
            return out
        return self

    def make_cast(name):
        real = getattr(nn.Module, name)

        def cast(self, *args, **kwargs):
            with quiet():
                out = real(self, *args, **kwargs)
            dtype = next((p.dtype for p in self.parameters() if p.is_floating_point()), None)
            if dtype is not None:
                event("dtype", list(self.parameters()), str(dtype).replace("torch.", ""))
            return out
        return cast

    patch(nn.Module, "to", module_to)
    for name in ("half", "bfloat16", "float", "double"):
        patch(nn.Module, name, make_cast(name))
    patch(nn.Module, "cuda", lambda self, *a, **k: self)
    if target_device.type == "meta":
        patch(nn.Module, "to_empty", lambda self, *a, **k: self)

    # -- freezing ------------------------------------------------------------------------------
    real_requires_grad_ = nn.Module.requires_grad_

    def module_requires_grad_(self, requires_grad=True):
        with quiet():
            out = real_requires_grad_(self, requires_grad)
        event("freeze", list(self.parameters()), bool(requires_grad))
        return out

    patch(nn.Module, "requires_grad_", module_requires_grad_)
    rg_descriptor = torch._C.TensorBase.requires_grad

    def rg_get(self):
        return rg_descriptor.__get__(self)

    def rg_set(self, value):
        with quiet():
            rg_descriptor.__set__(self, value)
        event("freeze", [self], bool(value))

    patch(nn.Parameter, "requires_grad", property(rg_get, rg_set))
    real_tensor_rg_ = torch.Tensor.requires_grad_

    def tensor_requires_grad_(self, requires_grad=True):
        with quiet():
            out = real_tensor_rg_(self, requires_grad)
        if isinstance(self, nn.Parameter):
            event("freeze", [self], bool(requires_grad))
        return out

    patch(torch.Tensor, "requires_grad_", tensor_requires_grad_)

    # -- optimizers -----------------------------------------------------------------------------
    real_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, params, *args, **kwargs):
        params = list(params)
        real_opt_init(self, params, *args, **kwargs)
        ids = [id(p) for g in self.param_groups for p in g["params"]]
        rec.optimizers.append(OptimizerCall(type(self).__name__, next(rec.seq), ids, rec.position(),
                                            obj=self if rec.real else None))

    patch(torch.optim.Optimizer, "__init__", opt_init)
    # `add_param_group` is wrapped in torch._disable_dynamo, whose first call imports torch._dynamo
    # (seconds); nothing is compiled here, so call the plain function
    add_pg = torch.optim.Optimizer.__dict__.get("add_param_group")
    if getattr(add_pg, "__wrapped__", None) is not None:
        patch(torch.optim.Optimizer, "add_param_group", add_pg.__wrapped__)

    # -- FSDP ------------------------------------------------------------------------------------
    if not rec.real:
        _install_recorders(rec, patch)
    else:
        _install_real_wrappers(rec, patch)

    class _DeviceMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "device" in kwargs and kwargs["device"] is not None:
                kwargs["device"] = target_device
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.to:
                device, dtype = _parse_to_args(args[1:], kwargs)
                if dtype is None:
                    return args[0]
                return func(args[0], dtype=dtype)
            return func(*args, **kwargs)

    sink = io.StringIO()
    if owned_pg:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        real_init_pg(backend="fake", store=FakeStore(), rank=0, world_size=ws)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), \
                torch.device(target_device), _DeviceMode(), _quiet_warnings():
            yield
    finally:
        handle.remove()
        param_handle.remove()
        if owned_pg:
            real_destroy_pg()
        for obj, name, old in reversed(patches):
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)
        torch.set_default_dtype(saved_torch[0])
        torch.random.set_rng_state(saved_torch[1])
        torch.set_grad_enabled(saved_torch[2])
        if torch.get_num_threads() != saved_torch[3]:
            torch.set_num_threads(saved_torch[3])
        if torch.get_default_device() != saved_torch[4]:
            torch.set_default_device(saved_torch[4] if saved_torch[4].type != "cpu" else None)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        sys.path[:] = saved_path
        # forget the user's own modules so the next file in this process imports its own
        for name in set(sys.modules) - saved_modules:
            mod = sys.modules.get(name)
            fname = getattr(mod, "__file__", None) or ""
            if not fname or not _is_library(fname) or name.startswith("__fsdp_lint_replay"):
                sys.modules.pop(name, None)


def _current_cuda_index(rec) -> int:
    """Simulated ranks are rank 0; a --run rank on a GPU is on its own device (FSDP asks for it)."""
    device = getattr(rec, "device", None)
    if rec.real and device is not None and device.type == "cuda" and device.index is not None:
        return device.index
    return 0


@contextlib.contextmanager
def _quiet_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_MISSING = object()


def _install_recorders(rec: Recorder, patch) -> None:
    import torch.distributed.fsdp as fsdp_mod
    from torch.distributed.fsdp import FullyShardedDataParallel as RealFSDP

    def fully_shard(module, *args, **kwargs):
        mods = list(module) if isinstance(module, (list, tuple)) else [module]
        names = ["mesh", "reshard_after_forward", "shard_placement_fn", "mp_policy", "offload_policy", "ignored_params"]
        for name, value in zip(names, args):
            kwargs[name] = value
        rec.undo.clear()
        rec.wrap_calls.append(WrapCall("fsdp2", next(rec.seq), mods, kwargs, rec.position(), state=rec.snapshot(mods)))
        return module

    class _FSDPMeta(type):
        def __getattr__(cls, item):
            return getattr(RealFSDP, item)

        def __instancecheck__(cls, instance):
            return False

    class RecordingFSDP(metaclass=_FSDPMeta):
        def __new__(cls, module, *args, **kwargs):
            from fsdp_lint.plan import resolve_fsdp1_auto_wrap

            names = ["process_group", "sharding_strategy", "cpu_offload", "auto_wrap_policy", "backward_prefetch",
                     "mixed_precision", "ignored_modules", "param_init_fn", "device_id", "sync_module_states",
                     "forward_prefetch", "limit_all_gathers", "use_orig_params", "ignored_states", "device_mesh"]
            for name, value in zip(names, args):
                kwargs[name] = value
            call = WrapCall("fsdp1", next(rec.seq), [module], kwargs, rec.position(), state=rec.snapshot([module]))
            policy = kwargs.get("auto_wrap_policy")
            if policy is not None:
                call.auto_wrapped, call.policy_desc, call.policy_classes = resolve_fsdp1_auto_wrap(
                    module, policy, kwargs.get("ignored_modules"), kwargs.get("ignored_states"))
            rec.undo.clear()
            rec.wrap_calls.append(call)
            return module

    RecordingFSDP.__name__ = "FullyShardedDataParallel"
    for mod_name in ("torch.distributed.fsdp", "torch.distributed.fsdp.fully_sharded_data_parallel",
                     "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard",
                     "torch.distributed.fsdp._fully_shard", "torch.distributed.fsdp._fully_shard._fully_shard"):
        mod = sys.modules.get(mod_name)
        if mod is None:
            try:
                __import__(mod_name)
                mod = sys.modules[mod_name]
            except Exception:
                continue
        if hasattr(mod, "fully_shard"):
            patch(mod, "fully_shard", fully_shard)
        if hasattr(mod, "FullyShardedDataParallel"):
            patch(mod, "FullyShardedDataParallel", RecordingFSDP)
    del fsdp_mod


def _install_real_wrappers(rec: Recorder, patch) -> None:
    """Real FSDP, but recorded, with devices mapped to this process' device."""
    import torch
    import torch.distributed.fsdp as fsdp_mod
    from torch.distributed.fsdp import FullyShardedDataParallel as RealFSDP
    from torch.distributed.fsdp import fully_shard as real_fully_shard

    device = getattr(rec, "device", None) or torch.device("cpu")

    def fully_shard(module, *args, **kwargs):
        mods = list(module) if isinstance(module, (list, tuple)) else [module]
        mesh = kwargs.get("mesh")
        if isinstance(mesh, FakeMesh) or mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            kwargs["mesh"] = init_device_mesh(device.type, (rec.world_size,))
        rec.wrap_calls.append(WrapCall("fsdp2", next(rec.seq), mods, dict(kwargs), rec.position(), state=rec.snapshot(mods)))
        return real_fully_shard(module, *args, **kwargs)

    def make_fsdp(module, *args, **kwargs):
        kwargs["device_id"] = device
        call = WrapCall("fsdp1", next(rec.seq), [module], dict(kwargs), rec.position(), state=rec.snapshot([module]))
        rec.wrap_calls.append(call)
        return RealFSDP(module, *args, **kwargs)

    class _FSDPMeta(type):
        def __getattr__(cls, item):
            return getattr(RealFSDP, item)

        def __instancecheck__(cls, instance):
            return isinstance(instance, RealFSDP)

    class RealRecordingFSDP(metaclass=_FSDPMeta):
        def __new__(cls, module, *args, **kwargs):
            return make_fsdp(module, *args, **kwargs)

    for mod_name in ("torch.distributed.fsdp", "torch.distributed.fsdp.fully_sharded_data_parallel",
                     "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard"):
        mod = sys.modules.get(mod_name)
        if mod is None:
            try:
                __import__(mod_name)
                mod = sys.modules[mod_name]
            except Exception:
                continue
        if hasattr(mod, "fully_shard"):
            patch(mod, "fully_shard", fully_shard)
        if hasattr(mod, "FullyShardedDataParallel"):
            patch(mod, "FullyShardedDataParallel", RealRecordingFSDP)
    del fsdp_mod


# --------------------------------------------------------------------------------------------
# model targets (--model)
# --------------------------------------------------------------------------------------------
@dataclass
class ModelTarget:
    source: Optional[str]      # "path.py" or "pkg.mod"
    name: str                  # "Transformer" / "build_model"
    kwargs: Dict[str, Any]
    text: str

    @classmethod
    def parse(cls, text: str) -> "ModelTarget":
        raw = text.strip()
        source, sep, rest = raw.rpartition(":")
        if not sep:
            source, rest = None, raw
        if source is not None and len(source) == 1 and source.isalpha():  # a Windows drive letter
            source, rest = None, raw
        name, kwargs = rest, {}
        if "(" in rest:
            if not rest.endswith(")"):
                raise ReplayError(f"invalid --model target {text!r}: expected NAME(key=literal, ...)")
            name = rest[: rest.index("(")]
            try:
                call = ast.parse(rest, mode="eval").body
                assert isinstance(call, ast.Call) and not call.args
                kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
            except Exception:
                raise ReplayError(
                    f"invalid --model target {text!r}: arguments must be literal keywords, e.g. "
                    f"Transformer(num_layers=4)") from None
        if not name.isidentifier() and not all(p.isidentifier() for p in name.split(".")):
            raise ReplayError(f"invalid --model target {text!r}: {name!r} is not a name")
        return cls(source=source or None, name=name, kwargs=kwargs, text=raw)


# --------------------------------------------------------------------------------------------
# the replay
# --------------------------------------------------------------------------------------------
def replay(facts: SourceFacts, world_size: int, target: Optional[ModelTarget] = None, real: bool = False,
           timeout: Optional[float] = None, device=None) -> ReplayResult:
    missing: List[str] = []
    try:
        return _replay(facts, world_size, target, real, timeout, device, missing)
    except ReplayError as exc:
        if not missing:
            raise
        # the file imports something that is not installed here (transformers, peft, a package
        # of the training repository): that is most likely why it failed
        names = ", ".join(dict.fromkeys(missing))
        raise ReplayError(f"{exc} (not importable here: {names}; install it to lint this file)") from exc


def _replay(facts: SourceFacts, world_size: int, target: Optional[ModelTarget], real: bool,
            timeout: Optional[float], device, missing: List[str]) -> ReplayResult:
    import torch.nn as nn

    path = os.path.abspath(facts.path)
    rec = Recorder(path, world_size, real=real)
    rec.device = device
    rec.api = facts.api
    code, spans = compile_replay(facts)
    rec.terminal_spans = spans
    mod_name = f"__fsdp_lint_replay_{next(_counter)}__"
    module = types.ModuleType(mod_name)
    module.__file__ = path
    ns = module.__dict__
    ns.update({
        "__builtins__": _guarded_builtins(),
        _CHECKPOINT: rec.checkpoint,
        _SKIP: rec.skip,
        _STUB_IMPORT: lambda names, globs, module=None: (missing.append(module or names[0]),
                                                         _stub_import(names, globs)),
        _REBIND: lambda g: None,
    })
    basename = os.path.basename(path)
    root = None
    how = None
    with sandbox(rec, os.path.dirname(path)):
        sys.modules[mod_name] = module
        override = None
        if target is not None:
            override = _load_target(target, facts, ns, rec)
            ns[_REBIND] = override.rebind
        try:
            with _alarm(timeout):
                exec(code, ns)
        except _StopReplay:
            pass
        except _ReplayTimeout:
            raise ReplayError(f"{basename}: replaying the setup code took longer than {timeout:.0f} s") from None
        except SystemExit as exc:
            raise ReplayError(f"{basename}: the setup code called sys.exit({exc.code!r})") from None
        except ReplayError:
            raise
        except Exception as exc:
            raise ReplayError(_describe_failure(basename, exc, path, rec, facts)) from exc

        if isinstance(override, _LazyOverride) and override.callable is None:
            # --model names something in the linted file itself: it must exist even when the file
            # builds and wraps its own model (an unknown --model is a usage error, exit 2)
            obj = ns.get(target.name.split(".")[0])
            for part in target.name.split(".")[1:]:
                obj = getattr(obj, part, None)
            if not callable(obj):
                raise ReplayError(f"--model {target.text}: {target.name!r} is not defined in {basename}")

        if not rec.wrap_calls:
            # library-style files: wrap helpers that the file defines but never calls; entry points
            # without required arguments (``main()`` run by ``fire``/``typer``) build their own model
            helpers = facts.uncalled_wrap_helpers()
            for helper in [h for h in helpers if h.defaults == len(h.params)]:
                fn = ns.get(helper.name)
                if callable(fn) and not rec.wrap_calls:
                    try:
                        with _alarm(timeout):
                            fn()
                    except _StopReplay:
                        pass
                    except Exception:
                        rec.wrap_calls.clear()
            if not rec.wrap_calls and (helpers or override is not None):
                root, how = _discover_model(facts, ns, rec, override)
                for helper in helpers:
                    fn = ns.get(helper.name)
                    if callable(fn) and (helper.params and helper.defaults < len(helper.params)):
                        try:
                            _call_helper(fn, helper, root, rec)
                        except _StopReplay:
                            pass
                        except Exception as exc:
                            raise ReplayError(_describe_failure(basename, exc, path, rec, facts)) from exc
        if not rec.real:
            _undo_after_last_wrap(rec)
        if rec.wrap_calls:
            root = _root_of(rec)
            how = how or _describe_root(root, ns, basename)
            if override is not None and not override.used:
                # the file wraps a model of its own: applying its wrap code (policies naming the file's
                # own block classes) to another model would report a plan nobody wrote
                raise ReplayError(
                    f"--model {target.text}: {basename} never builds {target.name}; its wrap code wraps its "
                    f"own {type(root).__name__}. Use --model {basename}:{type(root).__name__}(...) to change that "
                    f"model's arguments, or lint the file that builds {target.name}")
        elif root is None:
            root, how = _discover_model(facts, ns, rec, override)
        if override is not None and override.used:
            how = target.text
    if not isinstance(root, nn.Module):
        raise ReplayError(f"{basename}: could not find the model")
    return ReplayResult(model=root, target=how, wrap_calls=rec.wrap_calls, optimizers=rec.optimizers,
                        param_events=rec.param_events, skipped=rec.skipped, world_size=world_size,
                        mesh_sizes=rec.mesh_sizes, namespace=ns)


class _ReplayTimeout(BaseException):
    pass


def _undo_after_last_wrap(rec: Recorder) -> None:
    """Put back the sub-modules and parameters that code after the last wrap call replaced."""
    for kind, owner, name, old, child, old_parent in reversed(rec.undo):
        table = owner._modules if kind == "module" else owner._parameters
        if old is _MISSING:
            table.pop(name, None)
        else:
            table[name] = old
        if kind == "module" and child is not None:
            if old_parent is _MISSING:
                rec.parents.pop(id(child), None)
            else:
                rec.parents[id(child)] = old_parent
    rec.undo.clear()


def _guarded_open(file, mode="r", *args, **kwargs):
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        raise PermissionError(f"fsdp-lint does not let the replayed file write {file!r}")
    return builtins.open(file, mode, *args, **kwargs)


def _guarded_builtins() -> dict:
    """The replayed file's builtins: ``open`` reads but never writes (logs, checkpoints, configs
    dumped next to the script are not the linter's business)."""
    out = dict(builtins.__dict__)
    out["open"] = _guarded_open
    return out


@contextlib.contextmanager
def _alarm(seconds: Optional[float]):
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise _ReplayTimeout()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _stub_import(names, globs, module=None):
    for name in names:
        globs.setdefault(name, _Stub(name))


def _describe_failure(basename: str, exc: BaseException, path: str, rec: Optional[Recorder] = None,
                      facts: Optional[SourceFacts] = None) -> str:
    import traceback

    where_real = "with the real FSDP APIs" if rec is not None and rec.real else "on the meta device"
    cause = _skipped_cause(exc, rec, facts) if rec is not None and facts is not None else None
    if cause is not None:
        # a name is missing because the statement that binds it failed earlier (typically the
        # model's constructor): that failure is the one to report
        line, err = cause
        return f"{basename}:{line}: setup code failed {where_real}: {err[:300]}" + _download_hint(err, basename)
    line = None
    for fs in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.abspath(fs.filename) == path:
            line = fs.lineno
            break
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = f"{basename}:{line}" if line else basename
    return f"{where}: setup code failed {where_real}: {type(exc).__name__}: {msg[:300]}" + _download_hint(msg, basename)


def _download_hint(msg: str, basename: str) -> str:
    """fsdp-lint never downloads: a hub model needs its config locally, or a factory from a config."""
    if "huggingface.co" in msg or "from_pretrained" in msg or "cached files" in msg:
        return (" (fsdp-lint does not download models or configs: have the model's config.json in the local "
                "Hugging Face cache (HF_HOME), or build the model from a config in the linted code, e.g. "
                "AutoModelForCausalLM.from_config(AutoConfig.for_model(...)))")
    return ""


def _skipped_cause(exc: BaseException, rec: Recorder, facts: SourceFacts) -> Optional[Tuple[int, str]]:
    if not isinstance(exc, NameError) or not rec.skipped:
        return None
    name = getattr(exc, "name", None)
    if not name:
        m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", str(exc))
        name = m.group(1) if m else None
    if not name:
        return None
    try:
        tree = ast.parse(facts.text)
    except SyntaxError:
        return None
    binders = {node.lineno for node in ast.walk(tree)
               if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.ClassDef, ast.For, ast.While, ast.If,
                                                                      ast.With, ast.Try))
               and name in _binds(node)}
    for line, err in reversed(rec.skipped):
        if line in binders:
            return line, err
    return None


def _root_of(rec: Recorder):
    """The top ancestor of the wrapped modules (the model the file builds)."""
    def top(m):
        seen = set()
        while id(m) in rec.parents and id(m) not in seen:
            seen.add(id(m))
            m = rec.parents[id(m)]
        return m

    last = rec.wrap_calls[-1]
    candidates = []
    for call in rec.wrap_calls:
        for m in call.modules:
            candidates.append(top(m))
    # the root that contains the most wrapped modules, preferring the last call's
    best = top(last.modules[0])
    counts: Dict[int, int] = {}
    for c in candidates:
        counts[id(c)] = counts.get(id(c), 0) + 1
    if counts.get(id(best), 0) * 2 < len(candidates):
        best = max(candidates, key=lambda c: counts[id(c)])
    return best


def _describe_root(root, ns, basename: str) -> str:
    return f"{basename}:{type(root).__name__}"


class _Override:
    def __init__(self, target: ModelTarget, callable_obj, ns):
        self.target = target
        self.callable = callable_obj
        self.used = False
        self._factory = None
        self.ns = ns

    def build(self):
        obj = self.callable(**self.target.kwargs)
        self.used = True
        return obj

    def rebind(self, globs: dict) -> None:
        for key, value in list(globs.items()):
            if key.startswith("__"):
                continue
            if value is self.callable or (_same_callable(value, self.callable) and value is not self._factory):
                globs[key] = self._make_factory(value)

    def _make_factory(self, original):
        if self._factory is not None:
            return self._factory
        override = self
        if isinstance(original, type):
            # a subclass keeps isinstance checks and class-name lookups working
            def __new__(cls, *args, **kwargs):
                override.used = True
                merged = {**kwargs, **override.target.kwargs}
                obj = original.__new__(original)
                obj.__init__(*args, **merged)
                return obj
            factory = types.new_class(original.__name__, (original,), {}, lambda ns: ns.update({"__new__": __new__}))
            factory.__qualname__ = original.__qualname__
            factory.__module__ = original.__module__
        else:
            def factory(*args, **kwargs):
                override.used = True
                return original(*args, **{**kwargs, **override.target.kwargs})
        self._factory = factory
        return factory


def _same_callable(a, b) -> bool:
    return (callable(a) and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", object())
            and getattr(a, "__name__", None) == getattr(b, "__name__", None)
            and _src_stem(a) == _src_stem(b))


def _src_stem(obj) -> Optional[str]:
    mod = sys.modules.get(getattr(obj, "__module__", "") or "")
    f = getattr(mod, "__file__", None)
    return os.path.splitext(os.path.basename(f))[0] if f else None


def _load_target(target: ModelTarget, facts: SourceFacts, ns: dict, rec: Recorder) -> _Override:
    import importlib
    import importlib.util

    path = os.path.abspath(facts.path)
    src = target.source
    if src is None or (src.endswith(".py") and os.path.abspath(src) == path):
        # resolved lazily against the replayed file's own namespace
        return _LazyOverride(target, ns)
    if src.endswith(".py") or os.sep in src or "/" in src:
        if not os.path.isfile(src):
            raise ReplayError(f"--model {target.text}: no such file {src!r}")
        from fsdp_lint.source import read_source

        sub_facts = read_source(src)
        sub_code, spans = compile_replay(sub_facts)
        rec.terminal_spans.update(spans)
        stem = os.path.splitext(os.path.basename(src))[0]
        mod = types.ModuleType(stem)
        mod.__file__ = os.path.abspath(src)
        sys.modules.setdefault(stem, mod)
        mod.__dict__.update({_CHECKPOINT: lambda: None, _SKIP: rec.skip, _STUB_IMPORT: _stub_import,
                             _REBIND: lambda g: None, "__builtins__": _guarded_builtins()})
        sys.path.insert(0, os.path.dirname(os.path.abspath(src)))
        try:
            exec(sub_code, mod.__dict__)
        except _StopReplay:
            pass
        except Exception as exc:
            raise ReplayError(f"--model {target.text}: cannot load {src}: {type(exc).__name__}: {exc}") from None
        obj = mod.__dict__.get(target.name)
    else:
        try:
            mod = importlib.import_module(src)
        except Exception as exc:
            raise ReplayError(f"--model {target.text}: cannot import {src!r}: {type(exc).__name__}: {exc}") from None
        obj = mod
        for part in target.name.split("."):
            obj = getattr(obj, part, None)
    if not callable(obj):
        raise ReplayError(f"--model {target.text}: {target.name!r} not found in {src}")
    return _Override(target, obj, ns)


class _LazyOverride(_Override):
    """A target defined in the linted file itself: found once its definition has run."""

    def __init__(self, target: ModelTarget, ns):
        super().__init__(target, None, ns)

    def rebind(self, globs: dict) -> None:
        if self.callable is None:
            obj = globs.get(self.target.name.split(".")[0])
            for part in self.target.name.split(".")[1:]:
                obj = getattr(obj, part, None)
            if obj is None or not callable(obj):
                return
            self.callable = obj
        super().rebind(globs)

    def build(self):
        if self.callable is None:
            self.rebind(self.ns)
        if self.callable is None:
            raise ReplayError(f"--model {self.target.text}: {self.target.name!r} is not defined in the file")
        return super().build()


def _discover_model(facts: SourceFacts, ns: dict, rec: Recorder, override: Optional[_Override]):
    import torch.nn as nn

    basename = os.path.basename(facts.path)
    if override is not None:
        try:
            model = override.build()
        except ReplayError:
            raise
        except Exception as exc:
            raise ReplayError(f"--model {override.target.text}: cannot build it on the meta device: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        if not isinstance(model, nn.Module):
            raise ReplayError(f"--model {override.target.text}: returned {type(model).__name__}, not an nn.Module")
        return model, override.target.text
    errors = []
    for name in facts.factories():
        fn = ns.get(name)
        if callable(fn):
            try:
                model = fn()
            except Exception as exc:
                errors.append(f"{name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            if isinstance(model, nn.Module):
                return model, f"{basename}:{name}"
    for cls_name in _top_module_classes(facts, ns):
        cls = ns.get(cls_name)
        try:
            model = cls()
        except Exception as exc:
            errors.append(f"{cls_name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        return model, f"{basename}:{cls_name}"
    if errors:
        raise ReplayError(f"{basename}: cannot build the model on the meta device: {errors[0]}"
                          f" (pass --model {basename}:Class(arg=...) to choose the model and its arguments)")
    raise ReplayError(f"{basename}: no model found: define an nn.Module, a build_model() factory, "
                      f"or pass --model path.py:Class")


def _top_module_classes(facts: SourceFacts, ns: dict) -> List[str]:
    """nn.Module classes of this file that no other module class of the file uses, last first."""
    import torch.nn as nn

    classes = [(name, line) for name, line in facts.module_classes
               if isinstance(ns.get(name), type) and issubclass(ns[name], nn.Module)]
    text_lines = facts.text.splitlines()
    used = set()
    for name, line in classes:
        cls = ns[name]
        try:
            import inspect

            src = inspect.getsource(cls)
        except Exception:
            src = "\n".join(text_lines[line - 1: line + 200])
        for other, _ in classes:
            if other != name and re.search(rf"\b{re.escape(other)}\b", src.split("\n", 1)[-1]):
                used.add(other)
        # base classes are not "used" as components
    tops = [n for n, _ in classes if n not in used]
    rest = [n for n, _ in classes if n in used]
    return list(reversed(tops)) + list(reversed(rest))




def _call_helper(fn, helper, model, rec: Recorder):
    """Call a wrap helper the file never calls, with the model and simulated arguments."""
    import inspect

    sig = inspect.signature(fn)
    args = []
    kwargs = {}
    for i, (name, param) in enumerate(sig.parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        lname = name.lower()
        if i == 0 or lname in ("model", "module", "net", "network"):
            value = model
        elif "mesh" in lname:
            value = FakeMesh("cuda", (rec.world_size,))
        elif lname in ("world_size", "ws", "num_gpus", "dp_size", "dp_shard"):
            value = rec.world_size
        elif lname in ("rank", "local_rank", "global_rank"):
            value = 0
        elif param.default is not param.empty:
            continue
        elif "device" in lname:
            value = "cuda"
        else:
            value = None
        if param.kind == param.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    fn(*args, **kwargs)
