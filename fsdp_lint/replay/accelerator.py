"""``torch.accelerator`` (torch >= 2.6) during a replay: the device-generic API says what
``torch.cuda`` says under the simulation -- a CUDA accelerator with `world_size` devices.

Scripts written for any accelerator (pytorch/examples, LinB203/FSDP-Training's 2-D script) pick
the mesh's device type with ``torch.accelerator.current_accelerator().type``; on a CPU-only build it
returns None, and the replay would stop on ``'NoneType' object has no attribute 'type'`` before any
model exists, although ``torch.cuda.is_available()`` is True in the same replay.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from fsdp_lint.replay import cuda_probes


def simulate_accelerator(patch: Callable[[Any, str, Any], None]) -> None:
    """Patch the ``torch.accelerator`` functions that exist in this torch to answer as CUDA does in
    the simulation (``torch.cuda`` is patched first, and is read at call time)."""
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return
    cuda = torch.cuda
    answers = {
        "current_accelerator": lambda *a, **k: torch.device("cuda"),
        "is_available": lambda: True,
        "device_count": lambda: cuda.device_count(),
        "current_device_index": lambda: cuda.current_device(),
        "current_device_idx": lambda: cuda.current_device(),
        "set_device_index": lambda *a, **k: None,
        "set_device_idx": lambda *a, **k: None,
        "device_index": lambda *a, **k: contextlib.nullcontext(),
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda *a, **k: None,
        "memory_allocated": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "max_memory_reserved": lambda *a, **k: 0,
        "reset_peak_memory_stats": lambda *a, **k: None,
        "reset_accumulated_memory_stats": lambda *a, **k: None,
        "memory_stats": cuda_probes.idle_memory_stats,
        # torch's own answers a dict of the supported dtypes; the simulated GPU's are what its
        # torch.cuda capability says (the `torch.cuda` patches are read at call time)
        "get_device_capability": lambda *a, **k: _capability(cuda),
    }
    for name, value in answers.items():
        if hasattr(acc, name):
            patch(acc, name, value)


def _capability(cuda) -> dict:
    """``torch.accelerator.get_device_capability()`` for the simulated CUDA device."""
    import torch

    # tensors of these can be allocated on any CUDA GPU torch supports (bf16 emulated before Ampere)
    dtypes = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.bool}
    major, minor = cuda.get_device_capability()
    return {"major": major, "minor": minor, "supported_dtypes": dtypes}
