"""The simulated world a replay runs in: rank 0 of `world_size` ranks, on the meta device.

`sandbox(rec, root, argv)` patches, for as long as the replay runs and restored afterwards:

* the process: ``sys.argv`` is the script's own command line (``[path, *argv]``), the entry's root
  first on ``sys.path``, the launcher's environment (``RANK``, ``WORLD_SIZE``, ...) and offline
  switches for hubs and loggers, the script's prints captured;
* ``torch.distributed`` and ``torch.cuda`` simulated for rank 0 (``dist`` calls are no-ops, CUDA
  "is available" with ``world_size`` devices and answers the probes libraries make at import),
  ``init_device_mesh`` a `FakeMesh`, ``torch.multiprocessing.spawn`` runs rank 0 in this process,
  ``torch.save`` writes nothing, ``torch.compile`` returns its argument;
* every tensor created on the meta device (``--run`` and the torch oracle: on the rank's device);
* recorders: module registrations and constructions, dtype casts and freezing, optimizers, and
  ``fully_shard``/``FullyShardedDataParallel`` (recorded, or the real APIs with ``real=True``);
* the training boundary hooks (``boundary``).
"""
from __future__ import annotations

import builtins
import contextlib
import os
import sys
from typing import Any, Callable, List, Optional, Tuple

from fsdp_lint.replay.accelerator import simulate_accelerator
from fsdp_lint.entry.project import is_local
from fsdp_lint.replay.boundary import install_boundaries
from fsdp_lint.replay.mesh_aliases import patch_init_device_mesh
from fsdp_lint.replay.device_mode import device_mode, materialise_module, parse_to_args
from fsdp_lint.replay.recorders import (
    FakeMesh,
    Recorder,
    _install_real_wrappers,
    _install_recorders,
)
from fsdp_lint.replay import (  # issue 11; issue 15: the node's GPU, data values, rank values, jobs, network
    checkpoints, data_values, endings, host_values, job_submission, network, node, parallel, rank_values, smi,
    subprocess_launches, writes,
)
from fsdp_lint.replay.ray_node.modules import install as simulated_ray, node_has_ray
from fsdp_lint.replay.records import _MISSING, OptimizerCall, ParamEvent
from fsdp_lint.replay.streams import NodeStream
from fsdp_lint.replay.process_group import initialised_by_the_script
from fsdp_lint.replay import targets

Patch = Callable[[Any, str, Any], None]

_LAUNCHER_ENV = {
    "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "NODE_RANK": "0",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    # the rest of what torchrun gives a worker (a CLI that re-launches itself under torchrun unless
    # TORCHELASTIC_RUN_ID says it is a worker already); the agent's store is not used
    "ROLE_RANK": "0", "ROLE_NAME": "default", "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False",
    # nothing is downloaded or logged remotely while a file is linted (from_pretrained uses what is
    # cached, wandb.init does nothing); not WANDB_DISABLED, with which transformers takes an installed
    # wandb for none and `--report_to wandb` fails where a node's runs
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}



def _noop():
    # a new function object each time: torch._dynamo maps torch functions to trace rules and
    # rejects one object registered under two names with different rules
    return lambda *a, **k: None


@contextlib.contextmanager
def sandbox(rec: Recorder, root: str, argv: Optional[List[str]] = None, launchers: Tuple[str, ...] = (),
            last_resort_path=None):
    """Patch torch and the process for a replay; everything is restored on exit. `launchers`:
    command-line frameworks the program uses that need a shim (``"hydra"``)."""
    import torch
    import torch.distributed.fsdp  # noqa: F401  before any patch: its modules bind init_device_mesh on import

    from fsdp_lint.replay.dynamo import skip_dynamo_import

    skip_dynamo_import()      # torch's meta-device code would import torch._dynamo (seconds) for nothing
    patches: List[Tuple[Any, str, Any]] = []

    def patch(obj, name, value):
        patches.append((obj, name, obj.__dict__.get(name, _MISSING) if isinstance(obj, type) else getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    saved = _ProcessState(torch)
    os.environ.update(_LAUNCHER_ENV)
    os.environ.update({"WORLD_SIZE": str(rec.world_size), "LOCAL_WORLD_SIZE": str(rec.world_size),
                       "ROLE_WORLD_SIZE": str(rec.world_size)})
    sys.argv = [rec.path, *(argv or [])]
    sys.path.insert(0, root)
    # trials: several last-resort folders (the repository root of a namespace-package layout too)
    for last in ([last_resort_path] if isinstance(last_resort_path, str) else list(last_resort_path or ())):
        if last and last not in sys.path:
            # a package module's own folder, last: siblings it imports as top-level modules (as
            # `python pkg/train.py` finds them) resolve, and never shadow an installed package
            sys.path.append(last)
    hub_was_imported = _hub_offline(patch)

    hooks = _record_module_tree(rec, patch)
    owned_pg = _simulate_dist(rec, patch)
    _simulate_cuda(rec, patch)
    simulate_accelerator(patch)       # trials: torch.accelerator answers as the simulated CUDA (after it)
    _simulate_launchers(rec, patch)
    cleanups = [_hydra_without_outputs(patch)] if "hydra" in launchers else []
    if not node.real_cuda(rec):         # the node's nvidia-smi, first on PATH (os.environ is restored after)
        cleanups.append(smi.install(_node_profile(), rec.world_size))
    _simulate_mesh(rec, patch)
    target_device = node.target_device(rec)
    _record_param_changes(rec, patch, target_device)
    _record_optimizers(rec, patch)
    if not rec.real:
        _install_recorders(rec, patch)
    else:
        _install_real_wrappers(rec, patch)
    # the framework drivers (Lightning, accelerate, HF Trainer): their own code calls the recorders
    from fsdp_lint.replay.frameworks import install as install_frameworks

    install_frameworks(rec, patch)
    hooks += install_boundaries(rec, patch)

    _print_like_open(patch)
    rec.stdout, rec.stderr = NodeStream(), NodeStream()     # files, as a node's streams are
    if owned_pg:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        saved.real_init_pg(backend="fake", store=FakeStore(), rank=0, world_size=rec.world_size)
    if node_has_ray(rec.path):      # the node's Ray, in this process (last: nothing between it and the `finally`)
        cleanups.append(simulated_ray(_node_gpus()))
    try:
        with contextlib.redirect_stdout(rec.stdout), contextlib.redirect_stderr(rec.stderr), \
                torch.device(target_device), device_mode(target_device, rec), _quiet_warnings():
            yield
    finally:
        for h in hooks:
            h.remove()
        parallel.uninstall(rec)  # issue 11: the fake process group of the meshes
        for cleanup in cleanups + rec.__dict__.pop("after_replay", []):     # network: a failed download's empty file
            cleanup()
        if owned_pg:
            saved.real_destroy_pg()
        for obj, name, old in reversed(patches):
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)
        saved.restore(torch)
        if not hub_was_imported:
            _hub_offline(None)


def _hub_offline(patch: Optional[Patch]) -> bool:
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: when it is imported already, its constant
    is patched for the replay (returns True); one imported during the replay gets the value of the
    restored environment back afterwards (`patch` None)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        return False
    if patch is not None:
        patch(constants, "HF_HUB_OFFLINE", True)
        # and its cache folders: this process may have imported it under another HF_HOME (a long-lived process
        # linting for callers whose environments differ); as huggingface_hub computes them at import
        home = os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"))
        hub = os.path.expanduser(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                                 or os.path.join(home, "hub"))
        for name, value in (("HF_HOME", home), ("HF_HUB_CACHE", hub), ("HUGGINGFACE_HUB_CACHE", hub)):
            if hasattr(constants, name) and getattr(constants, name) != value:
                patch(constants, name, value)
    else:
        constants.HF_HUB_OFFLINE = str(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
                                       or "").upper() in {"1", "ON", "YES", "TRUE"}
    return True


# the project's source files the last replay in this process imported (the user's modules are
# forgotten when it ends): the result cache checks them before it serves that replay's result
# (``engine.FileResult.imported_files``)
REPLAY_IMPORTED: List[str] = []


class _ProcessState:
    """What a replay may change in this process, saved to be put back."""

    def __init__(self, torch):
        import torch.distributed as dist

        REPLAY_IMPORTED.clear()
        self.env = dict(os.environ)
        self.argv = list(sys.argv)
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.main = sys.modules.get("__main__")
        self.cwd = os.getcwd()
        self.builtins = dict(builtins.__dict__)   # issue 10: a script may patch print/len for the process
        # torch's process-wide defaults a script may change (torch.set_default_dtype(torch.bfloat16),
        # torch.manual_seed(0), torch.set_grad_enabled(False), torch.set_num_threads(1))
        self.torch = (torch.get_default_dtype(), torch.random.get_rng_state(), torch.is_grad_enabled(),
                      torch.get_num_threads(), torch.get_default_device())
        self.real_init_pg, self.real_destroy_pg = dist.init_process_group, dist.destroy_process_group
        self.backend_flags = node.BackendFlags()     # issue 15: TF32 / cuDNN flags the script sets
        node.clear_cached_probes()

    def restore(self, torch) -> None:
        self.backend_flags.restore()
        node.clear_cached_probes()
        torch.set_default_dtype(self.torch[0])
        torch.random.set_rng_state(self.torch[1])
        torch.set_grad_enabled(self.torch[2])
        if torch.get_num_threads() != self.torch[3]:
            torch.set_num_threads(self.torch[3])
        if torch.get_default_device() != self.torch[4]:
            torch.set_default_device(self.torch[4] if self.torch[4].type != "cpu" else None)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = self.argv
        sys.path[:] = self.path
        if self.main is not None:
            sys.modules["__main__"] = self.main
        with contextlib.suppress(OSError):
            if os.getcwd() != self.cwd:
                os.chdir(self.cwd)
        _restore_dict(builtins.__dict__, self.builtins)   # issue 10
        # forget the user's own modules so the next file in this process imports its own
        for name in set(sys.modules) - self.modules:
            mod = sys.modules.get(name)
            fname = getattr(mod, "__file__", None) or ""
            if not fname or is_local(fname):
                if fname and not name.startswith("fsdp_lint") and os.path.isabs(fname):
                    REPLAY_IMPORTED.append(fname)
                sys.modules.pop(name, None)


# --------------------------------------------------------------------------------------------
# the simulated world
# --------------------------------------------------------------------------------------------
def _simulate_dist(rec: Recorder, patch: Patch) -> bool:
    """torch.distributed for rank 0; returns whether the replay owns a fake process group."""
    import torch.distributed as dist

    ws = rec.world_size
    if rec.real:
        # real FSDP needs a process group: the launcher's (``--run`` under torchrun), or a fake one
        # of `ws` ranks (no communication) that lives as long as the replay; the file's own
        # init/destroy calls are no-ops either way
        owned = not dist.is_initialized()
        for name in ("init_process_group", "destroy_process_group"):
            patch(dist, name, _noop())
        patch(dist, "is_torchelastic_launched", lambda: True)
        return owned
    init_process_group, is_initialized = initialised_by_the_script(dist, ws)
    for name, value in {
        "init_process_group": init_process_group, "destroy_process_group": _noop(), "barrier": _noop(),
        "get_rank": _of_group(dist.get_rank, 0), "get_world_size": _of_group(dist.get_world_size, ws),
        "is_initialized": is_initialized, "is_available": lambda: True,
        "get_local_rank": lambda *a, **k: 0, "get_node_local_rank": lambda *a, **k: 0,
        "all_reduce": _noop(), "broadcast": _noop(), "all_gather": _noop(), "reduce": _noop(),
        "all_gather_object": _noop(), "broadcast_object_list": _noop(),
        "new_group": _noop(), "monitored_barrier": _noop(),
        # torch's own test (TORCHELASTIC_RUN_ID): True under the simulated torchrun, False for a plain `python`
        "is_torchelastic_launched": lambda: os.environ.get("TORCHELASTIC_RUN_ID") is not None,
    }.items():
        if hasattr(dist, name):
            patch(dist, name, value)
    try:        # DDP's state checks and sync over the group (a model's own `sync_model_states`): identical ranks
        import torch.distributed.utils as dist_utils

        for name in ("_verify_param_shape_across_processes", "_sync_module_states", "_sync_params_and_buffers"):
            if hasattr(dist_utils, name):
                patch(dist_utils, name, _noop())
    except ImportError:
        pass
    host_values.install(rec, patch, dist)   # collectives leave what a world of identical ranks would
    rank_values.install(rec, patch, dist, host_values.groups_of)   # ... but each rank's own rank and host
    return False


def _of_group(real, world_answer):
    """``dist.get_rank``/``get_world_size``: rank 0 of the world, and of a group the replay's fake
    process group made (fairscale's model-parallel group of 1 rank has size 1, not the world's)."""
    def answer(group=None, *args, **kwargs):
        if group is None:
            return world_answer
        try:
            return real(group)
        except Exception:  # noqa: BLE001 - no process group behind it: the world's answer
            return world_answer
    return answer


def _simulate_cuda(rec: Recorder, patch: Patch) -> None:
    """CUDA is "available" with `world_size` devices of the node's GPU (``--gpu``; `fsdp_lint.replay.node`)."""
    node.simulate_cuda(rec, patch, _node_profile())


def _node_profile():
    from fsdp_lint.replay.frameworks import current_options

    return node.profile_of(getattr(current_options(), "gpu", None))


def _node_gpus() -> int:
    from fsdp_lint.replay.frameworks import current_options

    return current_options().node_gpus


def _simulate_launchers(rec: Recorder, patch: Patch) -> None:
    import torch
    import torch.multiprocessing as tmp

    patch(torch, "save", _noop())          # checkpoints are never written
    checkpoints.install(rec, patch)        # ... and one this machine lacks reads as the model's own
    if not rec.real:
        patch(torch, "compile", lambda model=None, *a, **k: model if model is not None else (lambda f: f))

    # torch.multiprocessing.spawn(fn, args, nprocs): rank 0 runs in this process
    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        fn(0, *args)

    patch(tmp, "spawn", spawn)
    job_submission.install(rec, patch)     # submitit's executor.submit(fn): the job runs here, as task 0
    network.install(rec, patch)            # no network: a connection fails at once, never waits
    subprocess_launches.install(rec, patch)   # a launcher's own `subprocess.run(["torchrun", ...])` is named
    writes.install(rec, patch)             # what the setup writes is removed (or restored) when the replay ends
    endings.install_exit(rec, patch)       # os._exit after failures ends the script, as sys.exit does


def _hydra_without_outputs(patch: Patch) -> Callable[[], None]:
    """``@hydra.main`` parses ``sys.argv`` (the script's overrides) when the function is called; it
    also makes a run folder with its config and a log file. The shim adds overrides that keep Hydra
    from writing anything outside a temporary folder, removed when the replay ends."""
    import functools
    import shutil
    import tempfile

    try:
        import hydra
    except Exception:  # noqa: BLE001 - not installed, or one that cannot import here (hydra 1.0 on Python
        return lambda: None        # 3.11): the script's own `import hydra` fails there, as on a node
    tmp = tempfile.mkdtemp(prefix="fsdp-lint-hydra-")
    # Hydra catches the task's exception, prints "Set the environment variable HYDRA_FULL_ERROR=1 for a
    # complete stack trace" and exits 1: with it set, the exception itself reaches the replay, which
    # names its cause and line (the environment is restored after the replay)
    os.environ["HYDRA_FULL_ERROR"] = "1"
    extra = [f"hydra.run.dir={tmp}", f"hydra.sweep.dir={tmp}", "hydra.output_subdir=null",
             "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    real_main = hydra.main

    def main(*args, **kwargs):
        decorate = real_main(*args, **kwargs)

        def wrap(fn):
            decorated = decorate(fn)

            @functools.wraps(decorated)
            def run(*a, **k):
                saved = list(sys.argv)
                given = {x.split("=", 1)[0].lstrip("+~") for x in saved[1:]}
                sys.argv = saved + [x for x in extra if x.split("=", 1)[0].lstrip("+~") not in given]
                try:
                    return decorated(*a, **k)
                finally:
                    sys.argv = saved
            return run
        return wrap

    patch(hydra, "main", main)
    return lambda: shutil.rmtree(tmp, ignore_errors=True)


def _simulate_mesh(rec: Recorder, patch: Patch) -> None:
    import torch
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

    patch_init_device_mesh(patch, init_device_mesh)      # every module a script may bind it from
    # issue 11: real meshes, process groups and parallelize_module (fsdp_lint/replay/parallel.py)
    parallel.install(rec, patch, real_init_mesh)


@contextlib.contextmanager
def _quiet_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --------------------------------------------------------------------------------------------
# recorders of what the setup code does to modules and parameters
# --------------------------------------------------------------------------------------------
def _record_module_tree(rec: Recorder, patch: Patch) -> List[Any]:
    """Parents of every registered sub-module (the root of a wrapped module is found through them),
    the modules built, and structural changes after a wrap (undone for the plan)."""
    import torch.nn as nn

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

    host = not rec.real and node.target_device(rec).type == "meta"

    def on_register_param(module, name, param):
        if rec.wrap_calls and not rec.real:
            rec.undo.append(("param", module, name, module._parameters.get(name, _MISSING), None, None))
        # a host tensor made a parameter (`model.pos = nn.Parameter(torch.zeros(...))`): model data, on meta
        return host_values.on_meta(param) if host else None

    def on_register_buffer(module, name, buffer):
        return host_values.on_meta(buffer, keep_scalar=True) if host else None

    real_module_init = nn.Module.__init__

    def module_init(self, *args, **kwargs):
        real_module_init(self, *args, **kwargs)
        if rec.stopped is None:
            rec.constructed.append((self, rec.position()))
            if targets.built_by_an_import(sys._getframe(1), rec.path):
                rec.built_at_import.add(id(self))

    patch(nn.Module, "__init__", module_init)
    hooks = [nn.modules.module.register_module_module_registration_hook(on_register),
             nn.modules.module.register_module_parameter_registration_hook(on_register_param)]
    if hasattr(nn.modules.module, "register_module_buffer_registration_hook"):
        hooks.append(nn.modules.module.register_module_buffer_registration_hook(on_register_buffer))
    return hooks


def _record_param_changes(rec: Recorder, patch: Patch, target_device) -> None:
    """Dtype casts (``.to(dtype)``, ``.bfloat16()``) and freezing (``requires_grad_``, ``p.requires_grad
    = False``) as events: one user statement is one event (the tensor-level calls a module-level
    call makes inside, ``Module.requires_grad_`` -> ``Parameter.requires_grad_``, are not recorded again)."""
    import torch
    import torch.nn as nn

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

    real_module_to = nn.Module.to

    def module_to(self, *args, **kwargs):
        device, dtype = parse_to_args(args, kwargs)
        if device is not None and device.type == "meta":
            materialise_module(rec, self, device)     # `model.to("meta")`: the setup's own meta tensors
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
        def to_empty(self, *, device, recurse=True):
            materialise_module(rec, self, device, recurse)    # real on `device` on a node
            return self
        patch(nn.Module, "to_empty", to_empty)

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


def _record_optimizers(rec: Recorder, patch: Patch) -> None:
    import torch

    real_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, params, *args, **kwargs):
        params = list(params)
        real_opt_init(self, params, *args, **kwargs)
        ids = [id(p) for g in self.param_groups for p in g["params"]]
        rec.optimizer_param_ids.update(ids)
        rec.optimizers.append(OptimizerCall(type(self).__name__, next(rec.seq), ids, rec.position(),
                                            obj=self if rec.real else None))

    patch(torch.optim.Optimizer, "__init__", opt_init)
    # `add_param_group` is wrapped in torch._disable_dynamo, whose first call imports torch._dynamo
    # (seconds); nothing is compiled here, so call the plain function
    add_pg = torch.optim.Optimizer.__dict__.get("add_param_group")
    if getattr(add_pg, "__wrapped__", None) is not None:
        patch(torch.optim.Optimizer, "add_param_group", add_pg.__wrapped__)


# --------------------------------------------------------------------------------------------
# the linted code's builtins
# --------------------------------------------------------------------------------------------
def guarded_builtins() -> dict:
    """The replayed file's builtins: Python's own (the replay's ``open`` is patched there: ``network``), so that
    the project's own replacement (``builtins.print = print_on_rank_0``, taking ``force=``) is seen by its code as
    on a node; restored after the replay (`_ProcessState`)."""
    return builtins.__dict__


def _print_like_open(patch) -> None:
    """``print`` is a Python function while the replay's ``open`` is one: the project's own check that print is
    still Python's (``if type(builtins.print) != type(open): return``, before it installs its rank-0 print)
    answers as on a node, where both are built-in functions."""
    real_print = builtins.print

    def print(*args, **kwargs):  # noqa: A001  (the name a traceback shows)
        return real_print(*args, **kwargs)

    # where it says it lives is Python's: numba (imported by librosa, whisper) finds the built-in it stands for
    # by `print.__module__` and its name, at import
    print.__module__ = "builtins"
    print.__qualname__ = "print"
    patch(builtins, "print", print)


def _restore_dict(current: dict, saved: dict) -> None:
    """Put `saved`'s entries back into `current` in place (no moment without ``len``)."""
    for key in [k for k in current if k not in saved]:
        del current[key]
    for key, value in saved.items():
        if current.get(key, _MISSING) is not value:
            current[key] = value
