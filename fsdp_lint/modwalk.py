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
from typing import Dict, Iterator, Tuple

_PLAIN: Dict[type, bool] = {}


def _plain(cls) -> bool:
    known = _PLAIN.get(cls)
    if known is None:
        import torch.nn as nn

        known = _PLAIN[cls] = all(getattr(cls, name, None) is getattr(nn.Module, name)
                                  for name in ("named_parameters", "parameters", "named_modules", "_named_members"))
    return known


def named_parameters(module) -> Iterator[Tuple[str, object]]:
    """As ``module.named_parameters()``."""
    out = []
    seen_modules, seen_params = set(), set()
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        if not _plain(type(m)):
            return iter(module.named_parameters())
        if id(m) in seen_modules:
            continue
        seen_modules.add(id(m))
        for name, p in m._parameters.items():
            if p is not None and id(p) not in seen_params:
                seen_params.add(id(p))
                out.append((prefix + name, p))
        children = [(f"{prefix}{name}.", child) for name, child in m._modules.items() if child is not None]
        stack.extend(reversed(children))
    return iter(out)


def parameters(module) -> Iterator[object]:
    """As ``module.parameters()``."""
    return (p for _, p in named_parameters(module))


@contextlib.contextmanager
def plain_torch():
    """Tensor attributes read without the torch-function modes in force (the replay's device mode):
    the same values, without a Python call per attribute."""
    import torch

    with torch._C.DisableTorchFunction():
        yield
