"""What a recorded ``FullyShardedDataParallel(model, ...)`` exposes to the statements after it.

The recorder returns the user's module itself (its tree is what the plan reads), where torch returns a
wrapper. Setup code between the wrap and the first forward reads the wrapper's own attributes:
``model.module.unfreeze_all()`` (the wrapped module), ``with model.no_sync():``,
``model.clip_grad_norm_(1.0)``, ``model.sharding_strategy``, ``FSDP.summon_full_params(model)`` and the
state-dict contexts. Each answers as torch's wrapper does, on the module itself: ``module`` and
``_fsdp_wrapped_module`` are the module (the one the statement means: its methods and parameters are
the ones the plan reads), the options are the call's (torch's defaults where the call leaves them),
contexts do nothing, ``clip_grad_norm_`` is torch's over the module's parameters. A name the user's
class defines itself is left alone. The entries live in the instance's ``__dict__`` (no submodule is
registered: ``model.modules()`` is unchanged).
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict


def _defaults() -> Dict[str, Any]:
    """The options a ``FullyShardedDataParallel`` keeps as attributes, at torch's defaults."""
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    return {"sharding_strategy": ShardingStrategy.FULL_SHARD, "mixed_precision": None, "cpu_offload": None,
            "backward_prefetch": BackwardPrefetch.BACKWARD_PRE, "forward_prefetch": False,
            "limit_all_gathers": True, "use_orig_params": False}


def expose(module, kwargs: Dict[str, Any], world_size: int) -> None:
    """Give `module` (the recorded wrap's result) the attributes torch's FSDP1 wrapper has."""
    import torch
    from torch.distributed.fsdp import CPUOffload, MixedPrecision

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
        "module": module, "_fsdp_wrapped_module": module,
        "no_sync": lambda: contextlib.nullcontext(), "clip_grad_norm_": clip_grad_norm_,
        "check_is_root": lambda: True, "register_comm_hook": lambda *a, **k: None,
        "summon_full_params": lambda *a, **k: contextlib.nullcontext(),
        "state_dict_type": lambda *a, **k: contextlib.nullcontext(),
        "set_state_dict_type": lambda *a, **k: None,
        "rank": 0, "world_size": world_size,
        "compute_device": torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0),
        "_use_orig_params": options.pop("use_orig_params"), **options,
    }
    for name, value in entries.items():
        if name in own or any(name in vars(k) for k in cls.__mro__ if k is not object):
            continue            # the user's class has its own
        own[name] = value
