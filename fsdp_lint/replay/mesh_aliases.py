"""The modules a script may bind ``init_device_mesh`` from.

torch re-exports the one function under several names (``torch.distributed.init_device_mesh``,
``torch.distributed.tensor[.device_mesh]``, the deprecated ``torch.distributed._tensor[.device_mesh]`` that
composer imports): a script that binds it from any of them gets the simulated mesh, so every module that holds
the function being replaced is patched, not only ``torch.distributed.device_mesh``.
"""
from __future__ import annotations

import contextlib
import importlib
import warnings

# the public and deprecated homes of init_device_mesh; torch's internal modules (fully_shard's default mesh)
# keep what they bound
ALIAS_MODULES = (
    "torch.distributed.device_mesh",
    "torch.distributed",
    "torch.distributed.tensor.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed._tensor.device_mesh",
    "torch.distributed._tensor",
)


def patch_init_device_mesh(patch, replacement) -> None:
    """Replace ``init_device_mesh`` by `replacement` in every alias module that holds the current function."""
    modules = []
    for name in ALIAS_MODULES:
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")       # the _tensor aliases warn that they are deprecated
            modules.append(importlib.import_module(name))
    current = getattr(modules[0], "init_device_mesh", None) if modules else None
    for module in modules:
        if current is not None and getattr(module, "init_device_mesh", None) is current:
            patch(module, "init_device_mesh", replacement)
