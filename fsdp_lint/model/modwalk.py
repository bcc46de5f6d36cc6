"""``Module.named_parameters()`` without the recursion (issue 10, scale).

torch walks a module tree with nested generators (``named_modules`` recurses through ``yield from``):
every item of a subtree ``d`` levels deep passes through ``d`` generator frames, so one walk of a
1,000-deep model costs ~500,000 resumptions, and the replay walks the subtree of every wrap call
(the recorders' snapshot of ``requires_grad``/dtype, the mesh checks). These walks give the same
names, order and de-duplication (each module and each parameter once, pre-order, a module's own
parameters first) with an explicit stack. A class that overrides ``named_parameters``,
``parameters`` or ``named_modules`` is walked by torch, as FSDP would.
"""
from __future__ import annotations

import contextlib
from typing import AbstractSet, Dict, Iterator, Tuple

_PLAIN: Dict[type, bool] = {}


def _plain(cls) -> bool:
    known = _PLAIN.get(cls)
    if known is None:
        import torch.nn as nn

        known = _PLAIN[cls] = all(getattr(cls, name, None) is getattr(nn.Module, name)
                                  for name in ("named_parameters", "parameters", "named_modules", "_named_members"))
    return known


def named_parameters(module, stop_at: AbstractSet[int] = frozenset()) -> Iterator[Tuple[str, object]]:
    """As ``module.named_parameters()``; with `stop_at` (ids of modules), without the subtrees of those
    modules below `module` (units wrapped before: what a nested ``fully_shard`` already manages)."""
    out = []
    seen_modules, seen_params = set(), set()
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        if not _plain(type(m)):
            if stop_at:
                return _torch_walk_stopping(module, stop_at)
            return iter(module.named_parameters())
        if id(m) in seen_modules:
            continue
        seen_modules.add(id(m))
        if m is not module and id(m) in stop_at:
            continue
        for name, p in m._parameters.items():
            if p is not None and id(p) not in seen_params:
                seen_params.add(id(p))
                out.append((prefix + name, p))
        children = [(f"{prefix}{name}.", child) for name, child in m._modules.items() if child is not None]
        stack.extend(reversed(children))
    return iter(out)


def _torch_walk_stopping(module, stop_at: AbstractSet[int]) -> Iterator[Tuple[str, object]]:
    """torch's walk (a class overrides it), without entering the modules in `stop_at`."""
    stopped = [name + "." for name, m in module.named_modules(remove_duplicate=False)
               if m is not module and id(m) in stop_at]
    out, seen = [], set()
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in seen and not any(name.startswith(prefix) for prefix in stopped):
            seen.add(id(p))
            out.append((name, p))
    return iter(out)


def parameters(module, stop_at: AbstractSet[int] = frozenset()) -> Iterator[object]:
    """As ``module.parameters()`` (`stop_at`: as in `named_parameters`)."""
    return (p for _, p in named_parameters(module, stop_at))


@contextlib.contextmanager
def plain_torch():
    """Tensor attributes read without the torch-function modes in force (the replay's device mode):
    the same values, without a Python call per attribute."""
    import torch

    with torch._C.DisableTorchFunction():
        yield
