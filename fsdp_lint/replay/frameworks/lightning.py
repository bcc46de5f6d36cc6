"""Lightning (Fabric and Trainer) driven through its own code.

`FSDPStrategy` calls ``FullyShardedDataParallel(module, auto_wrap_policy=..., use_orig_params=True, ...)``
and `ModelParallelStrategy` calls the user's ``parallelize_fn`` / ``configure_model()`` with its device
mesh: both reach fsdp-lint's recorders, so the plan is the one the installed Lightning builds. What is
patched, for the replay only:

* the world: ``devices``/``num_nodes`` are fitted to the simulated world size (as a launcher with that
  many processes would require: Lightning checks ``devices * num_nodes == WORLD_SIZE``);
* the training boundary: ``Trainer.fit`` stops where training starts (``on_fit_start``, after the
  strategy wrapped the model and built the optimizers), ``validate``/``test``/``predict`` before their
  loop, Fabric at the first forward of a model it set up;
* what only a real FlatParameter satisfies: FSDP1 with ``use_orig_params=False`` checks that the
  optimizer holds flat parameters (they do not exist in a recorded plan);
* Fabric's check that an optimizer holds no meta-device parameters answers as on a node: only
  parameters built under ``init_module(empty_init=True)`` are meta there (not those built under
  ``with fabric.device:``), and what Fabric set up counts as materialised;
* ``prepare_data()`` (downloads) is tolerant: a data set that cannot be fetched here does not stop the lint;
* ``fabric.rank_zero_first()`` waits on nothing (its gloo barrier group is not built).

Both the unified package (``lightning.fabric``/``lightning.pytorch``) and the standalone ones
(``lightning_fabric``/``pytorch_lightning``) are hooked.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List

from fsdp_lint.replay.frameworks.hooks import framework_note

FRAMEWORK = "lightning"
_FABRIC = ("lightning.fabric", "lightning_fabric")
_PYTORCH = ("lightning.pytorch", "pytorch_lightning")


def _fit_devices(hooks, devices, num_nodes):
    """(devices, num_nodes) whose product is the simulated world size, keeping num_nodes if it divides it."""
    ws = hooks.rec.world_size
    try:
        nodes = int(num_nodes)
    except (TypeError, ValueError):
        nodes = 1
    if nodes < 1 or ws % nodes:
        nodes = 1
    if nodes == 1 and isinstance(devices, int) and not isinstance(devices, bool) and 0 < devices < ws \
            and ws % devices == 0:
        # `devices=8` on a world of 16: a launcher starts 8 processes on each of 2 nodes
        # (`lightning run model --devices=8 --num-nodes=2`, torchrun --nnodes=2)
        nodes = ws // devices
    return ws // nodes, nodes


def _device_count(devices):
    """The processes ``devices`` asks Lightning for on each node (4, "4", [0, 1], "0,1"), or None ("auto", -1)."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, (list, tuple)):
        return len(devices) or None
    if isinstance(devices, str):
        text = devices.strip()
        if text.isdigit():
            return int(text) or None
        if "," in text:
            return len([d for d in text.split(",") if d.strip()]) or None
    return None


def _world_from_devices(hooks, cls, devices, num_nodes) -> None:
    """``python train.py`` of a script whose Fabric/Trainer asks for ``devices=4``: Lightning starts those
    processes itself, so when nothing gave the world size (the command line's default) the world is
    devices x num_nodes, and the replay starts again on it (noted)."""
    from fsdp_lint.replay.records import WorldSizeFromScript

    count = _device_count(devices)
    try:
        nodes = int(num_nodes)
    except (TypeError, ValueError):
        nodes = 1
    if not getattr(hooks.options, "script_world", False) or count is None or nodes < 1:
        return
    if count * nodes != hooks.rec.world_size:
        who = "Trainer" if "Accelerator" in cls.__name__ else "Fabric"   # _AcceleratorConnector / _Connector
        shown = f"devices={devices!r}" + (f", num_nodes={nodes}" if nodes != 1 else "")
        raise WorldSizeFromScript(count * nodes, f"{who}({shown})")


def _connector(hooks, module) -> None:
    cls = getattr(module, "_Connector", None) or getattr(module, "_AcceleratorConnector", None)
    if cls is None:
        return

    def make(init):
        def __init__(self, *args, **kwargs):
            import inspect

            bound = inspect.signature(init).bind_partial(self, *args, **kwargs)
            arguments = dict(bound.arguments)
            arguments.pop("self", None)
            accelerator = arguments.get("accelerator", "auto")
            _world_from_devices(hooks, cls, arguments.get("devices", "auto"), arguments.get("num_nodes", 1))
            if not (isinstance(accelerator, str) and accelerator in ("mps", "tpu")):
                arguments["devices"], arguments["num_nodes"] = _fit_devices(
                    hooks, arguments.get("devices", "auto"), arguments.get("num_nodes", 1))
            return init(self, **arguments)
        return __init__

    hooks.wrap(cls, "__init__", make)


def _fabric(hooks, module) -> None:
    import torch

    Fabric = module.Fabric
    set_up: set = set()  # ids of the parameters of modules Fabric has set up
    scoped = hooks.scope(FRAMEWORK)

    def make(fn):
        inner = scoped(fn)

        def setup(*args, **kwargs):
            out = inner(*args, **kwargs)
            model = out[0] if isinstance(out, tuple) else out
            if isinstance(model, torch.nn.Module):
                set_up.update(id(p) for p in model.parameters())
            return out
        return setup

    for name in ("setup", "setup_module"):
        hooks.wrap(Fabric, name, make)

    # parameters that are on the meta device on a real node too: built under
    # `fabric.init_module(empty_init=True)` (Lightning's FSDP strategies build them there); everything
    # else here is meta only because the whole replay is (`with fabric.device:` is cuda:0 on a node)
    really_meta: set = set()

    def make_init_module(fn):
        import contextlib

        @contextlib.contextmanager
        def init_module(self, empty_init=None, *args, **kwargs):
            first = len(hooks.rec.constructed)
            with fn(self, empty_init, *args, **kwargs) as value:
                try:
                    yield value
                finally:
                    if empty_init:
                        for built, _ in hooks.rec.constructed[first:]:
                            really_meta.update(id(p) for p in built.parameters(recurse=False))
        return init_module

    if hasattr(Fabric, "init_module"):
        hooks.wrap(Fabric, "init_module", make_init_module)

    real_check = getattr(module, "_has_meta_device_parameters_or_buffers", None)
    if real_check is None:
        return

    def has_meta(obj, recurse=True):
        # an optimizer holds meta parameters as on a real node: those built under
        # `init_module(empty_init=True)` that Fabric has not set up yet (a real run materialises what it
        # sets up: FSDP's param_init_fn, ModelParallelStrategy's to_empty + reset_parameters) -- an
        # optimizer over them before `setup_module`, or in a joint `setup(model, optimizer)`, is refused
        # for real; parameters built under `with fabric.device:` are on the GPU there, never refused
        if isinstance(obj, torch.optim.Optimizer):
            return any(isinstance(t, torch.nn.Parameter) and t.is_meta and id(t) in really_meta
                       and id(t) not in set_up for group in obj.param_groups for t in group["params"])
        return real_check(obj, recurse)

    hooks.patch(module, "_has_meta_device_parameters_or_buffers", has_meta)


def _cli_launch(hooks, module) -> None:
    """A multi-device Fabric used without ``fabric.launch()`` runs only under Lightning's launcher
    (``lightning run model --devices=D --num-nodes=N FILE`` / ``fabric run``): that CLI sets
    ``LT_CLI_USED=1`` (and ``LT_DEVICES``/``LT_NUM_NODES``) for the processes it starts, and Fabric then
    sets up its environment in ``__init__`` and counts as launched. Where the script reaches a set-up
    without having launched, the replay is that launch (noted), where a plain ``python FILE`` would
    stop: the script cannot run any other way."""
    Fabric = module.Fabric

    def make(validate):
        def _validate_launched(self):
            if getattr(self, "_launched", True):
                return validate(self)
            try:
                return validate(self)
            except RuntimeError as exc:
                if "launch()" not in str(exc):
                    raise
            devices, nodes = _fit_devices(hooks, None, getattr(self._strategy, "num_nodes", 1))
            os.environ.update({"LT_CLI_USED": "1", "LT_DEVICES": str(devices), "LT_NUM_NODES": str(nodes)})
            self._strategy.setup_environment()
            self._launched = True
            framework_note(hooks.rec, f"the script never calls `fabric.launch()`: linted as launched by Lightning's "
                                      f"CLI (`lightning run model --devices={devices} --num-nodes={nodes} ...`)")
        return _validate_launched

    if hasattr(Fabric, "_validate_launched"):
        hooks.wrap(Fabric, "_validate_launched", make)


def _fabric_wrappers(hooks, module) -> None:
    hooks.wrap(module._FabricModule, "forward",
               hooks.boundary("the first forward of the model set up by Fabric: training starts"))


def _flat_params_check(hooks, module) -> None:
    # FSDP1 use_orig_params=False: Lightning checks that the optimizer holds FlatParameters; recorded
    # wraps have none (real ones do)
    if not hooks.rec.real and hasattr(module, "_optimizer_has_flat_params"):
        hooks.patch(module, "_optimizer_has_flat_params", lambda optimizer: True)


def _trainer(hooks, module) -> None:
    Trainer = module.Trainer

    def make_init(init):
        def __init__(self, *args, **kwargs):
            # loggers create their directories at set-up (``setup`` hook); nothing is logged before
            # training starts, so the replay runs without them and writes nothing
            kwargs["logger"] = False
            return init(self, *args, **kwargs)
        return __init__

    hooks.wrap(Trainer, "__init__", make_init)
    for name in ("fit", "validate", "test", "predict"):
        hooks.wrap(Trainer, name, hooks.scope(FRAMEWORK))
    hooks.wrap(Trainer, "_run_stage", hooks.boundary("Trainer: the loop starts"))


def _trainer_call(hooks, module) -> None:
    from fsdp_lint.replay.records import TrainingBoundary

    def make(fn):
        def _call_callback_hooks(trainer, hook_name, *args, **kwargs):
            if hook_name == "on_fit_start":
                raise TrainingBoundary("Trainer.fit: training starts (on_fit_start)")
            return fn(trainer, hook_name, *args, **kwargs)
        return _call_callback_hooks

    hooks.wrap(module, "_call_callback_hooks", make)


def _data_connector(hooks, module) -> None:
    from fsdp_lint.replay.frameworks.hooks import tolerant

    def make(fn):
        def prepare_data(self, *args, **kwargs):
            with tolerant(hooks, "prepare_data"):
                return fn(self, *args, **kwargs)
        return prepare_data

    hooks.wrap(module._DataConnector, "prepare_data", make)


def _infinite_barrier(hooks, module) -> None:
    """``fabric.rank_zero_first()`` / ``trainer.strategy.barrier``'s ``_InfiniteBarrier`` builds a gloo group to
    wait on with ``monitored_barrier``: nothing is communicated in a replay, so it waits on nothing (was: the
    fake backend has no monitored barrier, and the statement in the block -- ``prepare_data()`` -- was skipped)."""
    barrier = getattr(module, "_InfiniteBarrier", None)
    if barrier is not None and not hooks.rec.real:
        hooks.patch(barrier, "__enter__", lambda self: self)


_QUIET: Dict[Any, Any] = {}


def _dummy_logger():
    """Lightning's ``DummyLogger``, except that it has no private or special attributes it was not given (its
    ``__getattr__`` answers any name with a no-op method: Hydra's ``instantiate(cfg, logger=[...])`` and OmegaConf
    read ``_metadata`` and the like of what they are handed, and got a function where a node's logger has none)."""
    for name in ("lightning.pytorch.loggers.logger", "pytorch_lightning.loggers.logger"):
        try:
            dummy = importlib.import_module(name).DummyLogger
        except (ImportError, AttributeError):
            continue
        if dummy not in _QUIET:
            def __getattr__(self, attr, _dummy=dummy):
                if attr.startswith("_"):
                    raise AttributeError(attr)
                return _dummy.__getattr__(self, attr)
            _QUIET[dummy] = type("DummyLogger", (dummy,), {"__getattr__": __getattr__, "__module__": dummy.__module__})
        return _QUIET[dummy]
    return None


def _loggers(hooks, module) -> None:
    """A logger whose package is not installed here (``WandbLogger`` without wandb: "Requirement
    'wandb>=0.12.10' not met") refuses to be built where a node's logs the run. A logger never changes the
    plan: the instance becomes Lightning's own ``DummyLogger``, in a note."""
    base = getattr(module, "Logger", None)
    for name in dir(module):
        cls = getattr(module, name)
        if not (isinstance(cls, type) and base is not None and issubclass(cls, base) and cls is not base
                and cls.__module__.startswith(module.__name__)):
            continue

        def make(init, cls=cls):
            def __init__(self, *args, **kwargs):
                try:
                    init(self, *args, **kwargs)
                except ModuleNotFoundError as exc:
                    DummyLogger = _dummy_logger()          # (imported late: the Fabric's loggers load with Fabric)
                    if DummyLogger is None:
                        raise
                    self.__class__ = DummyLogger
                    DummyLogger.__init__(self)
                    framework_note(hooks.rec, f"{cls.__name__} needs a package not installed here "
                                              f"({str(exc).splitlines()[0]}); Lightning's DummyLogger stood in for "
                                              f"it (a logger does not change the plan)")
            return __init__

        if "__init__" in cls.__dict__:
            hooks.wrap(cls, "__init__", make)


def hook_table() -> Dict[str, List[Any]]:
    table: Dict[str, List[Any]] = {}
    for f in _FABRIC:
        table[f"{f}.connector"] = [_connector]
        table[f"{f}.fabric"] = [_fabric, _cli_launch]
        table[f"{f}.wrappers"] = [_fabric_wrappers]
        table[f"{f}.strategies.fsdp"] = [_flat_params_check]
        table[f"{f}.utilities.distributed"] = [_infinite_barrier]
        table[f"{f}.loggers"] = [_loggers]
    for p in _PYTORCH:
        table[f"{p}.trainer.connectors.accelerator_connector"] = [_connector]
        table[f"{p}.trainer.trainer"] = [_trainer]
        table[f"{p}.trainer.call"] = [_trainer_call]
        table[f"{p}.strategies.fsdp"] = [_flat_params_check]
        table[f"{p}.trainer.connectors.data_connector"] = [_data_connector]
        table[f"{p}.loggers"] = [_loggers]
    return table
