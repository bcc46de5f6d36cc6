"""The rest of ``torch.cuda``'s public functions, answered as the simulated node's GPU does.

`fsdp_lint.replay.node` answers the probes that decide a plan (availability, capability, memory,
toolkit). A CPU-only torch has no ``torch._C._cuda_*`` bindings, so every other public
``torch.cuda`` function a setup script or a library may call raises ``AttributeError: module
'torch._C' has no attribute ...`` there, where a GPU node answers. Each one answers here as that node
would (``tests/test_node.py`` checks every public function of the installed torch answers; the
ones torch implements over the answered probes, ``is_bf16_supported`` or ``memory_stats_as_nested_dict``,
stay torch's own):

* **topology**: ``can_device_access_peer(a, b)`` is the profile's ``peer_access`` for two different
  devices of the node (NVLink / Infinity Fabric boards: True; PCIe cloud cards: False), False for a
  device and itself, as CUDA answers;
* **allocator and handles**: allocations are never made (``caching_allocator_alloc`` returns a null
  pointer, ``delete`` does nothing), the backend is ``"native"``, the memory fraction 1.0, the memory
  snapshot empty and the summary torch's own text over zero counters; BLAS/solver handles are 0;
* **streams, graphs, modes**: ``set_stream``/``set_sync_debug_mode`` keep nothing, the debug mode is 0,
  no stream is capturing, ``make_graphed_callables`` returns the callables (capturing a CUDA graph
  changes no parameter, so not the plan);
* **seeds and RNG states**: one CPU-sized state per device; seeds are torch's CPU seed;
* **telemetry** (``utilization``, ``memory_usage``, ``temperature``, ``power_draw``, ``clock_rate``,
  ``device_memory_used``): live readings of NVML; the node's devices are idle before training and
  answer 0, a documented neutral value, as a tensor with no data does (`replay.data_values`).
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable


def idle_memory_stats(*args, **kwargs) -> "collections.defaultdict":
    """``torch.cuda.memory_stats()`` of an initialised device that has allocated nothing: every counter
    torch documents (``active_bytes.all.peak``, ``num_alloc_retries``, ...) reads 0 -- a GPU memory
    monitor built at setup indexes them (an empty dict, what an uninitialised device answers, made it
    fail with ``KeyError``)."""
    return collections.defaultdict(int, num_ooms=0, num_alloc_retries=0)

Patch = Callable[[Any, str, Any], None]

def device_index(device, default: int = 0) -> int:
    if device is None:
        return default
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        tail = device.rsplit(":", 1)
        return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else default
    index = getattr(device, "index", None)
    return default if index is None else index


def answer(profile, patch: Patch, world_size: int, current_index: Callable[[], int]) -> None:
    """Patch the public ``torch.cuda`` functions `node` leaves to torch (see the module's doc)."""
    import torch

    def none(*a, **k):
        return None

    def zero(*a, **k):
        return 0

    def can_device_access_peer(device, peer_device) -> bool:
        a, b = device_index(device, current_index()), device_index(peer_device, current_index())
        if not (0 <= a < world_size and 0 <= b < world_size):
            raise AssertionError("Invalid peer device id")     # torch's own check on a node
        return bool(profile.peer_access) and a != b

    def memory_summary(device=None, abbreviated=False) -> str:
        # torch's own formatter over the counters of a device that has allocated nothing
        memory = torch.cuda.memory
        real_stats = memory.memory_stats
        memory.memory_stats = idle_memory_stats
        try:
            return memory.memory_summary(device_index(device, current_index()), abbreviated)
        finally:
            memory.memory_stats = real_stats

    def get_rng_state_all():
        return [torch.get_rng_state() for _ in range(world_size)]

    def make_graphed_callables(callables, sample_args, *args, **kwargs):
        return callables

    table = {
        "can_device_access_peer": can_device_access_peer,
        "caching_allocator_alloc": zero, "caching_allocator_delete": none,
        "caching_allocator_disabled": lambda: contextlib.nullcontext(), "caching_allocator_enable": none,
        "change_current_allocator": none, "check_error": none, "cudart": lambda: _Cudart(),
        "current_blas_handle": zero, "current_solver_handle": zero,
        "get_allocator_backend": lambda: "native", "get_per_process_memory_fraction": lambda *a, **k: 1.0,
        "get_stream_from_external": lambda *a, **k: torch.cuda.current_stream(),
        "get_sync_debug_mode": zero, "set_sync_debug_mode": none, "set_stream": none,
        "graph_pool_handle": lambda: (0, 0), "is_current_stream_capturing": lambda: False,
        "make_graphed_callables": make_graphed_callables,
        "initial_seed": lambda: torch.initial_seed(), "seed": none, "seed_all": none,
        "get_rng_state_all": get_rng_state_all, "set_rng_state_all": none,
        "memory_snapshot": lambda *a, **k: [], "memory_summary": memory_summary,
        "reset_max_memory_cached": none, "reset_accumulated_host_memory_stats": none,
        "reset_peak_host_memory_stats": none, "use_mem_pool": lambda *a, **k: contextlib.nullcontext(),
        # NVML telemetry of an idle device
        "utilization": zero, "memory_usage": zero, "temperature": zero, "power_draw": zero,
        "clock_rate": zero, "device_memory_used": zero,
    }
    for name, value in table.items():
        if hasattr(torch.cuda, name):
            wrapped = getattr(getattr(torch.cuda, name), "__wrapped__", None)
            if wrapped is not None:
                # torch 2.14's torch._dynamo reads torch.cuda.use_mem_pool.__wrapped__ when imported
                value = _keeping_wrapped(value, wrapped)
            patch(torch.cuda, name, value)


def answer_private(patch: Patch, world_size: int, current_index: Callable[[], int]) -> None:
    """The ``torch._C._cuda_*`` bindings CUDA extensions bind at import (bitsandbytes'
    ``_get_raw_stream = torch._C._cuda_getCurrentRawStream``), missing from a CPU-only torch: the current
    stream's raw handle is the default stream's, NULL (0) as on a device where no stream was set; the
    device and the count are the node's."""
    import torch

    table = {"_cuda_getCurrentRawStream": lambda *a, **k: 0, "_cuda_getDevice": lambda: current_index(),
             "_cuda_getDeviceCount": lambda: world_size}
    for name, value in table.items():
        if not hasattr(torch._C, name):
            patch(torch._C, name, value)


def _keeping_wrapped(value, wrapped):
    def stand_in(*args, **kwargs):
        return value(*args, **kwargs)

    stand_in.__wrapped__ = wrapped
    return stand_in


class _Cudart:
    """``torch.cuda.cudart()``: the runtime's profiler switches and error codes (all succeed)."""
    class cudaError:  # noqa: N801  torch's name
        success = 0

    def __getattr__(self, item):
        if item.startswith("_"):
            raise AttributeError(item)
        return lambda *a, **k: 0
