"""Recorders that stand in for FSDP1/FSDP2 (or wrap the real APIs) and the simulated mesh."""
from __future__ import annotations

import inspect
import itertools
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from fsdp_lint.model import modwalk  # issue 10
from fsdp_lint.entry.project import is_local
from fsdp_lint.replay.records import OptimizerCall, ParamEvent, Position, WrapCall
from fsdp_lint.replay import fsdp1_wrapper


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



class Recorder:
    """Collects wrap calls, optimizers and parameter events during a replay."""

    def __init__(self, path: str, world_size: int, real: bool = False):
        self.path = os.path.abspath(path)          # the linted (entry) file
        self.world_size = world_size
        self.real = real
        self.wrap_calls: List[WrapCall] = []
        self.optimizers: List[OptimizerCall] = []
        self.param_events: List[ParamEvent] = []
        self.parents: Dict[int, Any] = {}        # id(child module) -> parent module
        self.modules_seen: Dict[int, Any] = {}
        self.constructed: List[Tuple[Any, Position]] = []   # modules built during the replay, in order
        # ids of modules built by the import of another module than the linted file (a default argument,
        # `act=nn.PReLU()` in a `def` of an imported module): never the model the setup builds
        self.built_at_import: set = set()
        self.mesh_sizes: List[Tuple[int, ...]] = []
        self.seq = itertools.count()
        # structural changes after the latest wrap call (record mode), undone at the end so the
        # tree is the model as it was wrapped: (kind, owner, name, old value, new child, its old parent)
        self.undo: List[Tuple[str, Any, str, Any, Any, Any]] = []
        self.rebind: Optional[Callable[[dict], None]] = None
        # the training boundary: what wrapping and optimizers made "training"
        self.wrapped_ids: Set[int] = set()
        self.optimizer_param_ids: Set[int] = set()
        self.stopped: Optional[Tuple[str, Position]] = None
        self._local: Dict[str, bool] = {}
        self.skipped_elsewhere: List[Tuple[str, int, BaseException]] = []
        # called with each wrap call: raises when a stand-in for a package that is not installed is among
        # its arguments (set by the runner)
        self.on_wrap_stand_in: Optional[Callable[[WrapCall], None]] = None

    def skipped_records(self) -> list:
        from fsdp_lint.replay.records import Skipped

        return [Skipped(path=p, line=ln, error=f"{type(e).__name__}: {e}".splitlines()[0][:300],
                        exc_type=type(e).__name__) for p, ln, e in self.skipped_elsewhere]

    def record_skip(self, path: str, line: int, exc: BaseException) -> None:
        """A failure the framework drivers tolerate (a data set that cannot load here); the replay's
        runner reports it with the skipped statements."""
        self.skipped_elsewhere.append((path, line, exc))

    def is_project_file(self, fname: str) -> bool:
        known = self._local.get(fname)
        if known is None:
            known = self._local[fname] = fname == self.path or is_local(fname)
        return known

    def position(self) -> Position:
        """Where the innermost project frame is (a wrap call in a helper module, or in the linted
        file), and, when that is another file, the innermost frame of the linted file (the call site)."""
        frame = sys._getframe(1)
        primary: Optional[Position] = None
        while frame is not None:
            fname = frame.f_code.co_filename
            if primary is None and self.is_project_file(fname):
                primary = Position(os.path.abspath(fname), frame.f_lineno, _column(frame))
                if primary.path == self.path:
                    return primary
            elif primary is not None and os.path.abspath(fname) == self.path:
                primary.via = Position(self.path, frame.f_lineno, _column(frame))
                return primary
            frame = frame.f_back
        return primary or Position(self.path, 0)

    def record_wrap(self, call: WrapCall) -> None:
        self.wrap_calls.append(call)
        self.wrapped_ids.update(id(m) for m in call.modules)
        self.wrapped_ids.update(id(m) for m in call.auto_wrapped)
        if getattr(self, "parallel", None) is not None:
            self.parallel.on_wrap_call(call)  # issue 11: its mesh / process groups, DTensor params

    def snapshot(self, modules) -> Dict[int, Tuple[bool, Any]]:
        """requires_grad and dtype of the parameters a wrap call takes, as they are at the call; those
        under units wrapped before keep what their own call saw (a wrap call per level of a 1,000-deep
        model would otherwise read half a million parameters)."""
        state = {}
        for m in modules:
            # issue 10: no nested generators, attributes read outside the replay's torch-function modes
            with modwalk.plain_torch():
                for p in modwalk.parameters(m, self.wrapped_ids):
                    state[id(p)] = (bool(p.requires_grad), p.dtype)
        return state


_RECORDED_CLASSES: Dict[type, type] = {}


def _recorded_fsdp_module_base():
    """A stand-in for FSDP2's ``FSDPModule`` on a recorded module: ``isinstance(m, FSDPModule)`` holds
    as after a real ``fully_shard``, the set-up methods scripts call after wrapping
    (``set_modules_to_forward_prefetch``, ``unshard``, ``set_requires_gradient_sync``, ...) do nothing,
    and ``set_reshard_after_forward`` changes the recorded call, as it changes torch's group."""
    from torch.distributed.fsdp import FSDPModule as RealFSDPModule

    cached = _RECORDED_CLASSES.get(RealFSDPModule)
    if cached is not None:
        return cached

    def noop(name):
        def method(self, *args, **kwargs):
            return None
        method.__name__ = name
        return method

    namespace = {name: noop(name) for name in dir(RealFSDPModule)
                 if not name.startswith("_") and callable(getattr(RealFSDPModule, name))}

    def set_reshard_after_forward(self, reshard_after_forward, recurse=True):
        targets = [m for m in self.modules() if hasattr(m, "_fsdp_lint_call")] if recurse else [self]
        for m in targets:
            m._fsdp_lint_call.kwargs["reshard_after_forward"] = reshard_after_forward

    namespace["set_reshard_after_forward"] = set_reshard_after_forward
    namespace["__module__"] = __name__
    # named like torch's base, so that the tree reports the user's class (see tree.build_module_tree)
    base = type("FSDPModule", (RealFSDPModule,), namespace)
    _RECORDED_CLASSES[RealFSDPModule] = base
    return base


def _as_fsdp_module(module, call) -> None:
    base = _recorded_fsdp_module_base()
    cls = type(module)
    if isinstance(module, base) or not hasattr(module, "__dict__"):
        module.__dict__["_fsdp_lint_call"] = call
        return
    new = _RECORDED_CLASSES.get(cls)
    if new is None:
        new = type(f"FSDP{cls.__name__}", (base, cls), {"__module__": cls.__module__})
        _RECORDED_CLASSES[cls] = new
    module.__class__ = new
    module.__dict__["_fsdp_lint_call"] = call


def shard_dims(modules, placement_fn, meshes: Optional[Dict[int, Any]] = None, shard_size=None) -> Dict[int, int]:
    """FSDP2's ``shard_placement_fn``, evaluated as torch evaluates it (``resolve_shard_placement``):
    per parameter of the call's modules, the dim it shards -- ``Shard(d)``, or a
    ``ShardPlacementResult(placement, mesh_info)`` whose placement None keeps dim 0; None keeps dim 0.
    id(param) -> dim (normalised). `meshes` (when given) receives id(param) -> the mesh of a
    ``ShardPlacementResult``'s ``mesh_info`` (torchtitan's per-parameter expert mesh)."""
    if placement_fn is None:
        return {}
    out: Dict[int, int] = {}
    seen = set()
    for m in modules:
        for p in m.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            placement = placement_fn(p)
            if placement is None:
                continue
            group = shard_size(p) if shard_size is not None else None
            if hasattr(placement, "mesh_info") and hasattr(placement, "placement"):   # ShardPlacementResult
                if meshes is not None:
                    meshes[id(p)] = getattr(placement.mesh_info, "mesh", None)
                group = getattr(placement.mesh_info, "shard_mesh_size", None) or group
                placement = placement.placement
                if placement is None:
                    continue
            dim = getattr(placement, "dim", None)
            if dim is None:
                raise ValueError(f"Invalid shard_placement_fn result: {placement!r}")
            dim = dim % p.ndim if p.ndim else 0
            local = p._local_tensor.size() if hasattr(p, "_local_tensor") else p.size()
            if dim > 0 and group and local[dim] % group:
                # FSDPParam._init_sharding_spec: torch refuses uneven shards on a non-zero dim
                raise NotImplementedError(f"FSDP does not support uneven sharding on dim {dim}: {local} "
                                          f"(world size: {group})")
            out[id(p)] = dim
    return out


def shard_group_size(kwargs, world_size: int):
    """The size of the group a ``fully_shard`` call shards a parameter over (its mesh's shard dim:
    1-D, HSDP's dim 1, the ``dp_mesh_dims`` shard dims flattened; the world without a mesh), given
    as a function of the parameter (a ``ShardPlacementResult`` brings its own mesh's)."""
    mesh, dims = kwargs.get("mesh"), kwargs.get("dp_mesh_dims")

    def of_mesh(m, spmd):
        if m is None:
            return world_size
        if spmd is not None:
            names = list(getattr(m, "mesh_dim_names", None) or ())
            n = 1
            for name in getattr(spmd, "shard_names", ()):
                n *= m.size(names.index(name)) if name in names else 1
            return n
        return m.size(0) if m.ndim == 1 else m.size(1)

    default = of_mesh(mesh, dims)
    return lambda p: default


def _column(frame) -> int:
    """1-based column of the call the frame is executing (Python >= 3.11 keeps positions), else 1."""
    try:
        # issue 10: skip to the instruction in C (a Python loop over a long module's positions, once
        # per constructed module and wrap call, was quadratic on a 10,000-expert model)
        pos = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None), None)
        if pos is not None:
            line, _, col, _ = pos
            return col + 1 if col is not None and line == frame.f_lineno else 1
    except (AttributeError, ValueError):
        pass
    return 1


def _signature(fn):
    """The installed torch's signature of a wrap function (its options differ between versions:
    ``ignored_params`` is not on 2.6, ``dp_mesh_dims`` not before 2.13); None where it cannot be read."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _bind(signature, name: str, args: tuple, kwargs: dict, *, skip: int) -> dict:
    """The wrap call's options by name, bound as the installed torch binds them: an option this torch
    does not have raises torch's own TypeError, as the real call does."""
    if signature is None:
        return dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{name} {e}") from None
    params = list(signature.parameters)
    options: dict = {}
    for key, value in bound.arguments.items():
        if params.index(key) < skip:
            continue
        if signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
            options.update(value)
        else:
            options[key] = value
    return options


def _install_recorders(rec: Recorder, patch) -> None:
    import torch.distributed.fsdp as fsdp_mod
    from torch.distributed.fsdp import FullyShardedDataParallel as RealFSDP

    fully_shard_signature = _signature(fsdp_mod.fully_shard)
    fsdp1_signature = _signature(RealFSDP.__init__)

    def fully_shard(module, *args, **kwargs):
        mods = list(module) if isinstance(module, (list, tuple)) else [module]
        kwargs = _bind(fully_shard_signature, "fully_shard()", (module, *args), kwargs, skip=1)
        rec.undo.clear()
        call = WrapCall("fsdp2", next(rec.seq), mods, kwargs, rec.position(), state=rec.snapshot(mods))
        if rec.on_wrap_stand_in is not None:
            rec.on_wrap_stand_in(call)      # a stand-in among the arguments (a float8 policy): refused with its cause
        parallel = getattr(rec, "parallel", None)
        if kwargs.get("dp_mesh_dims") is not None and parallel is not None:
            error = parallel.spmd_error(mods, kwargs)      # what torch raises for this SPMD call, before any state
            if error is not None:
                raise error
        call.placement_meshes = {}
        call.shard_dims = shard_dims(mods, kwargs.get("shard_placement_fn"), call.placement_meshes,
                                     shard_group_size(kwargs, rec.world_size))
        rec.record_wrap(call)
        for m in mods:
            _as_fsdp_module(m, call)
        return module

    class _FSDPMeta(type):
        def __getattr__(cls, item):
            return getattr(RealFSDP, item)

        def __instancecheck__(cls, instance):
            # a module this replay wrapped is one, as torch's wrapper is: a framework that prepares the
            # model again (transformers 4's Trainer calls ``accelerator.prepare`` twice) skips it as
            # torch's code does, instead of wrapping it a second time
            # and so is each unit its auto-wrap policy made (torch's model holds an FSDP instance there)
            return fsdp1_wrapper.is_recorded(instance)

    class RecordingFSDP(metaclass=_FSDPMeta):
        fsdp_modules = staticmethod(fsdp1_wrapper.fsdp_modules)

        def __new__(cls, *args, **kwargs):
            if cls is not RecordingFSDP:
                # the project's subclass (``class FSDPWrapper(FSDP): def __init__(self, opts, model):
                # super().__init__(module=model, ...)``): its own ``__init__`` runs and its ``super().__init__``
                # wraps; the instance stands for the wrapped module it holds
                return object.__new__(cls)
            return RecordingFSDP._wrap(*args, **kwargs)

        def __init__(self, *args, **kwargs):
            if type(self) is not RecordingFSDP:
                object.__setattr__(self, "_fsdp_lint_module", RecordingFSDP._wrap(*args, **kwargs))

        def __getattr__(self, name):
            try:
                module = object.__getattribute__(self, "_fsdp_lint_module")
            except AttributeError:
                raise AttributeError(name) from None
            return getattr(module, name)

        def __call__(self, *args, **kwargs):
            return object.__getattribute__(self, "_fsdp_lint_module")(*args, **kwargs)

        @staticmethod
        def _wrap(module, *args, **kwargs):
            from fsdp_lint.model.policy import resolve_fsdp1_auto_wrap

            kwargs = _bind(fsdp1_signature, "FullyShardedDataParallel.__init__()", (None, module, *args), kwargs,
                           skip=2)
            call = WrapCall("fsdp1", next(rec.seq), [module], kwargs, rec.position(), state=rec.snapshot([module]))
            policy = kwargs.get("auto_wrap_policy")
            if policy is not None:
                call.auto_wrapped, call.policy_desc, call.policy_classes = resolve_fsdp1_auto_wrap(
                    module, policy, kwargs.get("ignored_modules"), kwargs.get("ignored_states"))
            rec.undo.clear()
            rec.record_wrap(call)
            # what torch's wrapper exposes (``model.module``, ``no_sync()``, ``clip_grad_norm_``)
            owned = fsdp1_wrapper.owned_params(module, call.auto_wrapped, fsdp1_wrapper.ignored_params(kwargs))
            fsdp1_wrapper.expose(module, kwargs, rec.world_size, params=owned[id(module)])
            for unit in call.auto_wrapped:
                fsdp1_wrapper.expose(unit, kwargs, rec.world_size, root=False, params=owned[id(unit)])
            return module

    RecordingFSDP.__name__ = "FullyShardedDataParallel"
    RecordingFSDP._fsdp_lint_real = RealFSDP
    from torch.distributed.fsdp import _traversal_utils

    patch(_traversal_utils, "_get_fsdp_states", fsdp1_wrapper.fsdp_states(_traversal_utils._get_fsdp_states))
    _find_torch_fully_shard()
    _patch_fsdp_entry_points(patch, fully_shard, RecordingFSDP, _FSDP_MODULES + _FSDP2_PRIVATE_MODULES)
    _intercept_bound_names(rec, patch, fully_shard, RecordingFSDP, RealFSDP)
    _refuse_rendezvous(rec, patch)
    del fsdp_mod


# --------------------------------------------------------------------------------------------
# names bound before the simulated world started (issue 18)
# --------------------------------------------------------------------------------------------
class _Active:
    """The recorders of the innermost replay / ``record()`` block; None outside one. torch's own
    ``fully_shard`` and ``FullyShardedDataParallel`` forward to them while a block runs, so that a name
    bound before it (``from torch.distributed.fsdp import fully_shard`` at the top of a module, an
    ``import ... as``, a ``functools.partial``) records instead of running torch's rendezvous."""
    fully_shard: Optional[Callable] = None
    fsdp1: Optional[Callable] = None


_TORCH_FULLY_SHARD: List[Any] = []     # torch's fully_shard function objects, found before any patch


def _forwarding_code(fn, attr: str):
    """A code object for `fn` that calls ``_Active.<attr>``: same number of free variables as `fn`'s own
    (Python only lets a function's code be swapped for one with as many), named as `fn` in tracebacks."""
    names = [f"_cell{i}" for i in range(len(fn.__code__.co_freevars))]
    body = (f"        if False:\n            print({', '.join(names)})\n" if names else "")
    src = (f"def _outer({', '.join(names)}):\n"
           f"    def forward(*args, **kwargs):\n{body}"
           f"        return __import__('sys').modules[{__name__!r}]._Active.{attr}(*args, **kwargs)\n"
           f"    return forward\n")
    namespace: Dict[str, Any] = {}
    exec(compile(src, __file__, "exec"), namespace)
    code = namespace["_outer"](*([None] * len(names))).__code__
    return code.replace(co_name=fn.__code__.co_name, co_qualname=getattr(fn.__code__, "co_qualname", fn.__name__)) \
        if sys.version_info >= (3, 11) else code.replace(co_name=fn.__code__.co_name)


def _fsdp1_new(cls, *args, **kwargs):
    record = _Active.fsdp1
    if record is None:
        return object.__new__(cls)     # what FullyShardedDataParallel(...) does without a block
    return record(*args, **kwargs)


def _find_torch_fully_shard() -> None:
    for mod_name in _FSDP_MODULES + _FSDP2_PRIVATE_MODULES:
        try:
            __import__(mod_name)
        except Exception:  # noqa: BLE001  (an older torch without the module)
            continue
        fn = getattr(sys.modules.get(mod_name), "fully_shard", None)
        if callable(fn) and hasattr(fn, "__code__") and str(getattr(fn, "__module__", "")).startswith("torch") \
                and not any(fn is known for known in _TORCH_FULLY_SHARD):
            _TORCH_FULLY_SHARD.append(fn)


def _intercept_bound_names(rec: Recorder, patch, fully_shard, recording_fsdp, real_fsdp) -> None:
    patch(_Active, "fully_shard", fully_shard)
    patch(_Active, "fsdp1", recording_fsdp)
    for fn in _TORCH_FULLY_SHARD:
        patch(fn, "__code__", _forwarding_code(fn, "fully_shard"))
    if "__new__" not in real_fsdp.__dict__:
        # installed once and kept: CPython cannot take an assigned __new__ back (after `del C.__new__`,
        # `C(args)` raises "object.__new__() takes exactly one argument"); outside a block it does what
        # object.__new__ does
        real_fsdp.__new__ = staticmethod(_fsdp1_new)


class RealRendezvousError(RuntimeError):
    """torch's own rendezvous or store was reached in the simulated world (it would wait for ranks that
    never come)."""


def _refuse_rendezvous(rec: Recorder, patch) -> None:
    """A real rendezvous in the simulated world fails at once: rank 0 of `world_size` would wait for the
    other ranks (30 minutes by default) -- a function of torch.distributed bound before the block
    started, or torch's distributed_c10d called directly, reaches torch's own."""
    import torch
    import torch.distributed as dist

    ws = rec.world_size

    def refuse(what):
        raise RealRendezvousError(
            f"{what} would wait for {ws} real ranks, and fsdp-lint simulates rank 0 of {ws} without a process "
            f"group: call torch.distributed's functions through the module (`dist.init_process_group`, "
            f"`init_device_mesh`), not through a name bound before the simulation started")

    rdzv = sys.modules.get("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if isinstance(handlers, dict):
        def guarded(scheme):
            return lambda url, *a, **k: refuse(f"the `{scheme}://` rendezvous of init_process_group")
        patch(rdzv, "_rendezvous_handlers", {scheme: guarded(scheme) for scheme in handlers})
    store = getattr(dist, "TCPStore", None)
    if isinstance(store, type) and "__init__" in store.__dict__:
        patch(store, "__init__", lambda self, *a, **k: refuse("a TCPStore"))
    nccl = getattr(torch.cuda, "nccl", None)
    if nccl is not None:
        # the simulated CUDA "has" NCCL: torch's c10d logger asks its version when a collective fails
        patch(nccl, "version", lambda: (2, 21, 5))


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
        rec.record_wrap(WrapCall("fsdp2", next(rec.seq), mods, dict(kwargs), rec.position(), state=rec.snapshot(mods)))
        if getattr(rec, "defer_wrap", False):
            return module         # another plan is applied to the model afterwards
        return real_fully_shard(module, *args, **kwargs)

    def make_fsdp(module, *args, **kwargs):
        kwargs["device_id"] = device
        if device.type == "cpu" and kwargs.get("sync_module_states"):
            # rank 0's broadcast needs GPU tensors (torch raises on CPU); it changes no unit, and the
            # ranks of a CPU --run start from the same seed (accelerate's cpu_ram_efficient_loading sets it)
            kwargs["sync_module_states"] = False
        call = WrapCall("fsdp1", next(rec.seq), [module], dict(kwargs), rec.position(), state=rec.snapshot([module]))
        rec.record_wrap(call)
        if getattr(rec, "defer_wrap", False):
            return module
        return RealFSDP(module, *args, **kwargs)

    class _FSDPMeta(type):
        def __getattr__(cls, item):
            return getattr(RealFSDP, item)

        def __instancecheck__(cls, instance):
            return isinstance(instance, RealFSDP)

    class RealRecordingFSDP(metaclass=_FSDPMeta):
        def __new__(cls, module, *args, **kwargs):
            return make_fsdp(module, *args, **kwargs)

    _patch_fsdp_entry_points(patch, fully_shard, RealRecordingFSDP, _FSDP_MODULES)
    del fsdp_mod


# where code finds the FSDP APIs: the public modules, and (recording) FSDP2's own implementation modules
_FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed.fsdp.fully_sharded_data_parallel",
                 "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard")
_FSDP2_PRIVATE_MODULES = ("torch.distributed.fsdp._fully_shard", "torch.distributed.fsdp._fully_shard._fully_shard")


def _patch_fsdp_entry_points(patch, fully_shard, fsdp_cls, module_names) -> None:
    """Put `fully_shard`/`fsdp_cls` wherever a file can import ``fully_shard``/``FullyShardedDataParallel``."""
    for mod_name in module_names:
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
            patch(mod, "FullyShardedDataParallel", fsdp_cls)
