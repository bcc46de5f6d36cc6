"""The simulated world a replay runs in: rank 0 of `world_size`, meta device, argv, env, cuda."""
from __future__ import annotations

import builtins
import contextlib
import io
import os
import sys
from typing import Any, List, Tuple

from fsdp_lint.replay.recorders import (
    FakeMesh,
    Recorder,
    _install_real_wrappers,
    _install_recorders,
    _is_library,
)
from fsdp_lint.replay.records import _MISSING, OptimizerCall, ParamEvent


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

    def __len__(self):  # issue 8: a data set from a package not installed here sizes a DataLoader
        return 1

    def __getitem__(self, item):  # issue 8
        return _Stub(f"{self._name}[]")

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
    real_parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        if args is not None:  # issue 8: an argument list the code passes itself (HfArgumentParser(args=[...]))
            return real_parse_known_args(self, args, namespace)
        return _parse_argparse_defaults(self, args, namespace)

    patch(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    patch(argparse.ArgumentParser, "parse_args", lambda self, args=None, namespace=None:
          parse_known_args(self, args, namespace)[0])

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
    # issue 8: the framework drivers (Lightning, accelerate, HF Trainer): fsdp_lint/frameworks/
    from fsdp_lint.frameworks import install as _install_frameworks  # issue 8
    _install_frameworks(rec, patch)  # issue 8

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



def _stub_import(names, globs, module=None):
    for name in names:
        globs.setdefault(name, _Stub(name))
