"""Finding the user's modules and parameters inside a wrapped model (FSDP1 wrappers, activation
checkpointing, ``torch.compile``)."""
from __future__ import annotations


def class_name(model) -> str:
    """The user's class name (FSDP2 swaps in a `FSDP<Name>` subclass)."""
    cls = type(user_root(model))
    for c in cls.__mro__:
        if not c.__module__.startswith("torch.distributed") and not (
                c.__name__.startswith("FSDP") and c.__module__ == cls.__module__ and c is cls and len(c.__bases__) > 1):
            return c.__name__
    return cls.__name__


def user_root(model):
    """The user's root module inside an FSDP1 wrapper."""
    seen = 0
    while hasattr(model, "_fsdp_wrapped_module") and seen < 8:
        model = model._fsdp_wrapped_module
        seen += 1
    return model


_WRAPPER_ATTRS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def _unwrap(m):
    """Step through wrapper modules (FSDP1, activation checkpointing, torch.compile)."""
    for _ in range(8):
        for attr in _WRAPPER_ATTRS:
            inner = m._modules.get(attr) if hasattr(m, "_modules") else None
            if inner is not None:
                m = inner
                break
        else:
            return m
    return m


def resolve_module(model, path: str):
    """The module an FQN of the unwrapped model names in the wrapped one (None if there is none)."""
    mod = _unwrap(model)
    try:
        for part in path.split(".") if path else ():
            mod = _unwrap(getattr(mod, part))
    except AttributeError:
        return None
    return mod


def resolve(model, fqn: str):
    """The tensor a parameter FQN of the unwrapped model names in the wrapped one."""
    import torch

    path, _, name = fqn.rpartition(".")
    mod = resolve_module(model, path)
    t = getattr(mod, name, None) if mod is not None else None
    return t if isinstance(t, torch.Tensor) else None
