"""What a recorded ``FullyShardedDataParallel(model, ...)`` exposes to the statements after it.

The recorder returns the user's module itself (its tree is what the plan reads), where torch returns a
wrapper. Setup code between the wrap and the first forward reads the wrapper's own attributes:
``model.module.unfreeze_all()`` (the wrapped module), ``with model.no_sync():``,
``model.clip_grad_norm_(1.0)``, ``model.sharding_strategy``, ``FSDP.summon_full_params(model)`` and the
state-dict contexts. Each answers as torch's wrapper does, on the module itself: ``module`` is the
module under another identity (the same state; not an FSDP instance, so unwrap loops end), and
``_fsdp_wrapped_module`` the module (the one the statement means: its methods and parameters are the
ones the plan reads), the options are the call's (torch's defaults where the call leaves them),
``summon_full_params`` does nothing, ``clip_grad_norm_`` is torch's over the module's parameters. The
state-dict settings are torch's own functions (``FSDP.set_state_dict_type``, ``FSDP.state_dict_type``,
``FSDP.get_state_dict_type``) over the state torch's ``__init__`` gives each instance (full state dict,
default configs): they check the configs as torch does, and what a statement sets is read back. A name
the user's class defines itself is left alone. The entries live in the instance's ``__dict__`` (no submodule is
registered: ``model.modules()`` is unchanged).

The units the call's auto-wrap policy makes are FSDP instances in torch's model too (each replaces its
module in the parent): ``model.modules()`` yields them, so ``isinstance(m, FullyShardedDataParallel)``,
``FSDP.fsdp_modules(model)`` and a ``check_fn`` of ``apply_activation_checkpointing`` find them. Each gets
the same attributes, as a nested (not root) instance. Their names stay the user's (torch's gain
``_fsdp_wrapped_module.``): the plan reads the model as the file built it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict

from fsdp_lint.replay import device_mode


def _defaults() -> Dict[str, Any]:
    """The options a ``FullyShardedDataParallel`` keeps as attributes, at torch's defaults."""
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    return {"sharding_strategy": ShardingStrategy.FULL_SHARD, "mixed_precision": None, "cpu_offload": None,
            "backward_prefetch": BackwardPrefetch.BACKWARD_PRE, "forward_prefetch": False,
            "limit_all_gathers": True, "use_orig_params": False}


def ignored_params(kwargs: Dict[str, Any]) -> list:
    """The parameters a wrap's ``ignored_states``/``ignored_modules``/``ignored_parameters`` name."""
    import torch.nn as nn

    out: list = []
    for key in ("ignored_states", "ignored_modules", "ignored_parameters"):
        for item in kwargs.get(key) or ():
            out += list(item.parameters()) if isinstance(item, nn.Module) else [item]
    return out


def owned_params(root, units, ignored=()) -> Dict[int, list]:
    """id(instance) -> the parameters its FlatParameter would hold: those of its module that no unit
    nested in it holds (`units` post-order, children first; `root` last), each once, leaving out the
    `ignored` ones (``ignored_states``/``ignored_modules``/``ignored_parameters``, which torch leaves out)."""
    claimed: set = {id(p) for p in ignored}
    out: Dict[int, list] = {}
    for m in list(units) + [root]:
        mine = []
        for p in m.parameters():
            if id(p) not in claimed:
                claimed.add(id(p))
                mine.append(p)
        out[id(m)] = mine
    return out


def _flat_param(params):
    """A stand-in for the instance's FlatParameter, on meta for every reader (code after the wrap that reads
    ``_flat_param`` -- accelerate's fp32 upcast -- skips meta parameters; the plan applies the upcast)."""
    import torch
    import torch.nn as nn

    # a non-floating parameter can be no part of a FlatParameter: torch refuses the wrap (FSD204 says so)
    params = [p for p in params if p.is_floating_point() or p.is_complex()]
    if not params:
        return None
    with torch._C.DisableTorchFunction():
        data = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device="meta")
    flat = nn.Parameter(data, requires_grad=any(p.requires_grad for p in params))
    return device_mode.stand_in(flat)


def expose(module, kwargs: Dict[str, Any], world_size: int, root: bool = True, params=None) -> None:
    """Give `module` (the recorded wrap's result, or with ``root=False`` a unit its auto-wrap policy
    made) the attributes torch's FSDP1 wrapper has; `params`: those its FlatParameter would hold."""
    import torch
    from torch.distributed.fsdp import (CPUOffload, FullOptimStateDictConfig, FullStateDictConfig, MixedPrecision,
                                        StateDictType)
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp1_mod

    real = _real_fsdp1(fsdp1_mod)
    try:
        own = vars(module)
    except TypeError:
        return
    cls = type(module)

    def clip_grad_norm_(max_norm, norm_type=2.0):
        return torch.nn.utils.clip_grad_norm_(list(module.parameters()), max_norm, norm_type)

    options = {name: kwargs.get(name) if kwargs.get(name) is not None else default
               for name, default in _defaults().items()}
    # torch keeps its dataclass defaults where the call passes none
    options["mixed_precision"] = options["mixed_precision"] or MixedPrecision()
    options["cpu_offload"] = options["cpu_offload"] or CPUOffload()
    entries: Dict[str, Any] = {
        "module": _inner(module, own), "_fsdp_wrapped_module": module, "_fsdp_lint_self": module,
        "no_sync": lambda: contextlib.nullcontext(), "clip_grad_norm_": clip_grad_norm_,
        "check_is_root": lambda: root, "register_comm_hook": lambda *a, **k: None,
        "summon_full_params": lambda *a, **k: contextlib.nullcontext(),
        # torch's staticmethods (an instance's ``model.state_dict_type(model, ...)`` is the same function)
        "state_dict_type": real.state_dict_type, "set_state_dict_type": real.set_state_dict_type,
        "get_state_dict_type": real.get_state_dict_type,
        # what torch's _init_state_dict_state gives every instance
        "_state_dict_type": StateDictType.FULL_STATE_DICT, "_state_dict_config": FullStateDictConfig(),
        "_optim_state_dict_config": FullOptimStateDictConfig(), "_device_mesh": kwargs.get("device_mesh"),
        "_has_params": bool(params) if params is not None else True,
        "_flat_param": _flat_param(params) if params is not None else None,
        "rank": 0, "world_size": world_size,
        "compute_device": torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0),
        "_use_orig_params": options.pop("use_orig_params"), **options,
    }
    registered = set(own.get("_modules", ())) | set(own.get("_parameters", ())) | set(own.get("_buffers", ()))
    for name, value in entries.items():
        if name in own or name in registered or any(name in vars(k) for k in cls.__mro__ if k is not object):
            continue            # the user's class has its own (a child named `module` stays the child)
        own[name] = value


def _real_fsdp1(fsdp1_mod):
    """torch's FullyShardedDataParallel class (during a replay its module's name is the recorder's, which
    forwards the class's attributes to it)."""
    cls = fsdp1_mod.FullyShardedDataParallel
    return getattr(cls, "_fsdp_lint_real", cls)


def fsdp_states(real_get_fsdp_states):
    """torch's ``_traversal_utils._get_fsdp_states`` for a replay: the recorded instances of a recorded
    model (what torch's state-dict functions walk and set), torch's answer for any other module."""
    def get_fsdp_states(module):
        found = fsdp_modules(module)
        return found if found else real_get_fsdp_states(module)
    return get_fsdp_states


def _inner(module, own: Dict[str, Any]):
    """What ``wrapper.module`` is: the wrapped module, which torch's wrapper holds and which is not an FSDP
    instance itself -- so that ``while isinstance(m, FSDP): m = m.module`` (accelerate's
    ``extract_model_from_parallel``, behind every ``unwrap_model``) ends, and ``unwrap_model(model) is not
    model`` holds, as on a node. It is the module under another identity: an instance of its class
    sharing its ``__dict__`` (parameters, children, hooks, attributes: one state, read and written by both)."""
    inner = object.__new__(type(module))
    inner.__dict__ = own
    return inner


def is_recorded(module) -> bool:
    """`module` stands for an FSDP1 instance of this replay: a recorded wrap, or a unit of its policy
    (not its ``.module``, which shares its state under another identity)."""
    try:
        return vars(module).get("_fsdp_lint_self") is module
    except TypeError:
        return False


def fsdp_modules(module, root_only: bool = False):
    """``FullyShardedDataParallel.fsdp_modules`` over the recorded instances: in ``module.modules()`` order
    (torch walks depth-first in that order), each once; ``root_only``: those no recorded ancestor holds."""
    found = []

    def walk(m, inside):
        here = is_recorded(m)
        if here and not (root_only and inside):
            found.append(m)
        for child in m.children():
            walk(child, inside or here)

    walk(module, False)
    return list(dict.fromkeys(found))
