"""How framework drivers attach to a replay: patches applied when (or if) a framework module is
imported, undone with the sandbox's other patches; the framework that drove each wrap call.

A driver registers ``{module name: function(hooks, module)}``. Modules already imported are hooked at
once; the others when the replayed code imports them (a post-import hook on ``sys.meta_path``), so
linting a file that never imports Lightning never imports Lightning.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import sys
from typing import Any, Callable, Dict, List, Optional

from fsdp_lint.replay.records import TrainingBoundary

Hook = Callable[["Hooks", Any], None]


class Hooks:
    """What a driver gets: the recorder, the sandbox's `patch`, the options of this lint, helpers."""

    def __init__(self, rec, patch, options):
        self.rec = rec
        self.patch = patch
        self.options = options
        self._errors: List[dict] = []      # noted by `note_error`, not yet attached to a wrap call
        self._done: set = set()

    # -- patching ----------------------------------------------------------------------------
    def wrap(self, owner, name: str, make: Callable[[Callable], Callable]) -> None:
        """Replace ``owner.name`` by ``make(original)`` for this replay."""
        original = owner.__dict__[name] if isinstance(owner, type) and name in owner.__dict__ else getattr(owner, name)
        raw = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
        new = make(raw)
        functools.update_wrapper(new, raw)
        if isinstance(original, staticmethod):
            new = staticmethod(new)
        elif isinstance(original, classmethod):
            new = classmethod(new)
        self.patch(owner, name, new)

    def scope(self, framework: str) -> Callable[[Callable], Callable]:
        """A wrapper maker: wrap calls recorded while the wrapped function runs were made by `framework`
        (the outermost framework call wins: the HF Trainer drives accelerate)."""
        rec = self.rec

        def make(fn):
            def scoped(*args, **kwargs):
                start = len(rec.wrap_calls)
                try:
                    return fn(*args, **kwargs)
                finally:
                    for call in rec.wrap_calls[start:]:
                        call.framework = framework
                    self._attach_errors()
            return scoped
        return make

    @staticmethod
    def boundary(reason: str) -> Callable[[Callable], Callable]:
        """A wrapper maker: calling the function is where training starts; the replay stops there."""
        def make(fn):
            def stop(*args, **kwargs):
                raise TrainingBoundary(reason)
            return stop
        return make

    def note_error(self, framework: str, message: str, names: List[str], missing: List[str], setting: str,
                   api: Optional[str] = None) -> None:
        """Wrap-class names the framework could not find: it raises (`message`); fsdp-lint reports each
        missing name as FSD103 and lets the framework plan with the names that exist."""
        pos = self.rec.position()
        self._errors.append({"framework": framework, "message": message, "names": list(names),
                             "missing": list(missing), "setting": setting, "api": api,
                             "path": pos.path, "line": pos.line, "col": pos.col, "index": len(self.rec.wrap_calls)})

    def _attach_errors(self) -> None:
        """Errors travel with the first wrap call made after them (``WrapCall.framework_errors``)."""
        calls = self.rec.wrap_calls
        for err in list(self._errors):
            if err["index"] < len(calls):
                call = calls[err["index"]]
                call.framework_errors = getattr(call, "framework_errors", []) + [err]
                self._errors.remove(err)


class _PostImport(importlib.abc.MetaPathFinder):
    """Runs the hooks of a module right after the replayed code imports it."""

    def __init__(self, hooks: Hooks, pending: Dict[str, List[Hook]]):
        self.hooks = hooks
        self.pending = pending
        self._busy: set = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        finder = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                finder.run(name, module)

        spec.loader = _Loader()
        return spec

    def run(self, name: str, module) -> None:
        for hook in self.pending.pop(name, []):
            hook(self.hooks, module)


class _WrapCalls(list):
    """The recorder's list of wrap calls: a framework error noted before a call travels with it."""

    def __init__(self, calls, hooks: Hooks):
        super().__init__(calls)
        self._hooks = hooks

    def append(self, call) -> None:
        super().append(call)
        self._hooks._attach_errors()

    def __reduce__(self):
        return (list, (list(self),))


def install_hooks(rec, patch, options, table: Dict[str, List[Hook]]) -> Hooks:
    hooks = Hooks(rec, patch, options)
    rec.wrap_calls = _WrapCalls(rec.wrap_calls, hooks)
    pending: Dict[str, List[Hook]] = {}
    for name, fns in table.items():
        module = sys.modules.get(name)
        if module is not None:
            for fn in fns:
                fn(hooks, module)
        else:
            pending.setdefault(name, []).extend(fns)
    if pending:
        patch(sys, "meta_path", [_PostImport(hooks, pending), *sys.meta_path])
    rec.framework_hooks = hooks
    return hooks


@contextlib.contextmanager
def tolerant(hooks: Hooks, what: str):
    """Code a framework runs that does not affect the plan (data preparation): a failure is skipped."""
    try:
        yield
    except Exception as exc:
        hooks.rec.record_skip(hooks.rec.position().path, hooks.rec.position().line, exc)


def simulate_object_collectives(rec, patch) -> None:
    """Frameworks exchange Python objects at set-up (a log directory, a seed, a port); in the simulated
    world (record mode: no process group) rank 0 keeps its own objects and every rank "sent" the same."""
    if rec.real:
        return
    import torch.distributed as dist

    def noop(*args, **kwargs):
        return None

    from fsdp_lint.replay.host_values import groups_of
    from fsdp_lint.replay.rank_values import value_at

    def ranks(group):
        return groups_of(group) or list(range(rec.world_size))

    def fill(slots, obj, group):
        # each rank's own value where the node knows it (its rank, local rank, host name: rank_values), else
        # rank 0's, which a value each rank computes from its own share would not be
        of = ranks(group)
        for i in range(len(slots)):
            slots[i] = value_at(obj, of[i]) if i < len(of) else obj
            if i and slots[i] is obj:
                rec.__dict__["approximated_by_collective"] = True

    def all_gather_object(object_list, obj, group=None):
        fill(object_list, obj, group)

    def gather_object(obj, object_gather_list=None, dst=0, group=None, **kwargs):
        if object_gather_list is not None:
            fill(object_gather_list, obj, group)

    def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=0, group=None, **kwargs):
        if scatter_object_output_list:
            scatter_object_output_list[0] = scatter_object_input_list[0] if scatter_object_input_list else None

    table = {
        "broadcast_object_list": noop, "all_gather_object": all_gather_object, "gather_object": gather_object,
        "scatter_object_list": scatter_object_list,
        "get_process_group_ranks": lambda group=None, *a, **k: ranks(group),
    }
    for name, value in table.items():
        if hasattr(dist, name):
            patch(dist, name, value)


def simulate_ddp(rec, patch) -> None:
    """A framework that chose DDP (no FSDP) wraps the model in ``DistributedDataParallel``, which needs a
    process group; in the simulated world it hands the model back, and the plan has no FSDP unit."""
    if rec.real:
        return
    import torch.nn.parallel as parallel

    real = parallel.DistributedDataParallel

    class _Meta(type):
        def __instancecheck__(cls, instance):       # nothing is ever really wrapped
            return isinstance(instance, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    class DistributedDataParallel(metaclass=_Meta):
        def __new__(cls, module, *args, **kwargs):
            return module

    patch(parallel, "DistributedDataParallel", DistributedDataParallel)


def framework_note(rec, text: str) -> None:
    """A note of the replay about what a framework did here (listed once)."""
    notes = rec.__dict__.setdefault("framework_notes", [])
    if text not in notes:
        notes.append(text)
