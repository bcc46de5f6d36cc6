"""The GPU of the simulated node: every probe a script or library makes answers as that GPU does.

The replay runs on a machine that may have no GPU and a CPU-only torch, but the setup code it runs
was written for a GPU node, and libraries decide from what the node says: ``torch.version.cuda and
torch.cuda.is_bf16_supported()`` picks bf16, ``TrainingArguments(tf32=True)`` asks
``is_torch_tf32_available()`` (capability >= 8), accelerate's ``mixed_precision="bf16"`` asks
``torch.cuda.is_bf16_supported()``. The node's GPU is a `fsdp_lint.gpus.GpuProfile` (``--gpu``,
``[tool.fsdp-lint] gpu``; an H100 by default). Patched for the replay, and restored after it:

* ``torch.version.cuda`` / ``torch.version.hip`` (the profile's toolkit; the other one None);
* ``torch.cuda``: ``is_available``, ``device_count`` (the world), ``get_device_name``,
  ``get_device_capability``, ``get_device_properties`` (name, capability, memory, multiprocessors,
  L2, ``gcnArchName`` on ROCm), ``get_arch_list``, ``mem_get_info``, memory counters (0), streams
  and events (no-ops), ``nccl.version``; every other public function (peer access from the
  profile, allocator, graphs, telemetry) in `fsdp_lint.replay.cuda_probes`. ``is_bf16_supported`` and ``is_tf32_supported`` are torch's
  own functions reading those answers, so they say what torch says on that GPU -- including the
  emulated bf16 torch reports on a V100 or T4 (``including_emulation=True``, the default);
* ``torch.backends.cudnn.is_available``/``version``, ``torch.backends.cuda.is_built``,
  ``torch.distributed.is_nccl_available`` (and, on a CPU build, ``torch.distributed.ProcessGroupNCCL``
  with its ``Options``, which scripts set for the groups they ask for); the TF32 flags (``torch.backends.cuda.matmul.allow_tf32``,
  ``torch.backends.cudnn.allow_tf32``, ``torch.set_float32_matmul_precision``) keep what the script
  sets and are put back after the replay;
* the answers libraries cache (transformers' ``is_torch_bf16_gpu_available``/``is_torch_tf32_available``,
  accelerate's checks) are cleared before and after, so they are asked again on this node.

With ``--run`` on real GPUs (the rank's device is CUDA) the real CUDA answers, not the profile.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Callable, Optional

from fsdp_lint import gpus
from fsdp_lint.replay import cuda_probes

Patch = Callable[[Any, str, Any], None]

# what the simulated node's libraries report (torch's default CUDA wheels bundle these)
CUDNN_VERSION = 91002
NCCL_VERSION = (2, 27, 3)


def _noop():
    # a new function object each time: torch._dynamo maps torch functions to trace rules and
    # rejects one object registered under two names with different rules
    return lambda *a, **k: None


class _DeviceProperties:
    """What ``torch.cuda.get_device_properties`` answers for the profile's GPU."""
    is_integrated = False
    is_multi_gpu_board = False
    warp_size = 32
    max_threads_per_multi_processor = 2048

    def __init__(self, profile: gpus.GpuProfile, index: int = 0):
        self.name = profile.device_name
        self.major, self.minor = profile.capability
        self.total_memory = profile.memory_bytes
        self.multi_processor_count = profile.multi_processor_count
        self.L2_cache_size = profile.l2_cache_bytes
        self.gcnArchName = profile.gcn_arch_name or "NVIDIA CUDA"
        self.warp_size = 64 if profile.vendor == "amd" else 32
        self.uuid = f"00000000-0000-0000-0000-{index:012d}"

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count={self.multi_processor_count})")


class _NullDevice:
    """``torch.cuda.device(i)``: a context that selects nothing, and a class, as torch's own ``isinstance(device,
    torch.cuda.device)`` checks need (``torch.load(..., map_location="cuda")`` makes one)."""

    def __init__(self, device=None):
        self.idx = device if isinstance(device, int) else getattr(device, "index", None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NullStream:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, item):
        return _noop()


def profile_of(name: Optional[str]) -> gpus.GpuProfile:
    return gpus.profile(name)


def real_cuda(rec) -> bool:
    """--run on real GPUs: the rank's device is CUDA, and the real CUDA answers."""
    device = getattr(rec, "device", None)
    return bool(rec.real and device is not None and getattr(device, "type", None) == "cuda")


def current_cuda_index(rec) -> int:
    """Simulated ranks are rank 0; a --run rank on a GPU is on its own device (FSDP asks for it)."""
    device = getattr(rec, "device", None)
    if real_cuda(rec) and device.index is not None:
        return device.index
    return 0


def target_device(rec):
    """Everything lives on meta; real FSDP1 needs real tensors (CPU); --run passes the rank's device
    (the model is materialised there, FSDP2 included)."""
    import torch

    if rec.real and (getattr(rec, "api", None) != "fsdp2" or getattr(rec, "device", None) is not None):
        return getattr(rec, "device", None) or torch.device("cpu")
    return torch.device("meta")


def _default_device_as_target(rec, patch: Patch) -> None:
    """``torch.set_default_device("cuda")`` and ``torch.set_default_tensor_type(torch.cuda.BFloat16Tensor)``
    (a model built under a process-wide default device): the node's GPU is where the replay builds, as
    ``torch.device("cuda")`` and ``device="cuda"`` are."""
    import torch

    real = torch.set_default_device

    def set_default_device(device):
        if device is not None and torch.device(device if not isinstance(device, int) else "cuda").type == "cuda":
            device = target_device(rec)
        return real(device)

    patch(torch, "set_default_device", set_default_device)
    real_tensor_type = torch.set_default_tensor_type

    def set_default_tensor_type(t):
        # `torch.cuda.BFloat16Tensor` (a name, or the class a CPU build has but refuses): its dtype, on the
        # node's GPU
        kind = getattr(torch.cuda, t.rsplit(".", 1)[-1], None) if isinstance(t, str) and t.startswith("torch.cuda.") else t
        if isinstance(kind, type) and getattr(kind, "is_cuda", False) and isinstance(getattr(kind, "dtype", None), torch.dtype):
            torch.set_default_dtype(kind.dtype)
            return set_default_device("cuda")
        return real_tensor_type(t)

    patch(torch, "set_default_tensor_type", set_default_tensor_type)


def simulate_cuda(rec, patch: Patch, profile: gpus.GpuProfile) -> None:
    """CUDA is "available" with `world_size` devices of the profile's GPU."""
    import torch

    ws = rec.world_size
    zero = lambda *a, **k: 0  # noqa: E731
    for name, value in {
        "set_device": _noop(), "current_device": lambda: current_cuda_index(rec), "is_available": lambda: True,
        "device_count": lambda: ws, "manual_seed": _noop(), "manual_seed_all": _noop(), "synchronize": _noop(),
        "empty_cache": _noop(), "reset_peak_memory_stats": _noop(),
        "reset_max_memory_allocated": _noop(), "reset_accumulated_memory_stats": _noop(),
        "memory_allocated": zero, "max_memory_allocated": zero, "memory_reserved": zero,
        "max_memory_reserved": zero, "memory_stats": cuda_probes.idle_memory_stats, "is_initialized": lambda: True,
        "init": _noop(), "ipc_collect": _noop(), "set_per_process_memory_fraction": _noop(),
        "device": _NullDevice, "stream": lambda *a, **k: contextlib.nullcontext(),
        "Stream": _NullStream, "Event": _NullStream, "current_stream": lambda *a, **k: _NullStream(),
        "default_stream": lambda *a, **k: _NullStream(), "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": _noop(), "nvtx": types.SimpleNamespace(range_push=_noop(), range_pop=_noop(),
                                                                range=lambda *a, **k: contextlib.nullcontext(),
                                                                mark=_noop()),
    }.items():
        if rec.real and name in ("Stream", "Event", "current_stream", "default_stream", "stream", "device"):
            continue          # --run on GPUs: FSDP uses the real streams
        if real_cuda(rec) and name in ("is_available", "synchronize", "empty_cache", "memory_allocated",
                                       "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                                       "memory_stats", "is_initialized", "init", "get_rng_state", "set_rng_state"):
            continue          # the real device answers for itself
        patch(torch.cuda, name, value)
    if not real_cuda(rec):
        _default_device_as_target(rec, patch)
        _answer_as(profile, patch)
        # every other public torch.cuda function (peer access, allocator, graphs, telemetry)
        cuda_probes.answer(profile, patch, ws, lambda: current_cuda_index(rec))
        cuda_probes.answer_private(patch, ws, lambda: current_cuda_index(rec))   # extensions' bindings
        patch(torch, "Generator", _generator_class(torch))


def _generator_class(torch):
    """``torch.Generator("cuda")`` (seeded weight init: ``torch.Generator(device).manual_seed(seed)``) is a
    CPU generator here: the CPU build has no CUDA generator, and initial values never change a plan."""
    real = torch._C.Generator

    class Generator(real):
        def __new__(cls, device="cpu"):
            kind = torch.device(device).type if isinstance(device, (str, torch.device)) else None
            return real.__new__(cls, "cpu" if kind in ("cuda", "meta") else device)

        def __init__(self, device="cpu"):
            pass
    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    return Generator


def _answer_as(profile: gpus.GpuProfile, patch: Patch) -> None:
    """The probes of the GPU itself: name, capability, memory, toolkit, libraries."""
    import torch

    def properties(device=None):
        return _DeviceProperties(profile, _index(device))

    for name, value in {
        "get_device_name": lambda *a, **k: profile.device_name,
        "get_device_capability": lambda *a, **k: tuple(profile.capability),
        "get_device_properties": properties,
        "get_arch_list": lambda: list(profile.arch_list),
        "mem_get_info": lambda *a, **k: (profile.memory_bytes, profile.memory_bytes),
        # torch's own is_bf16_supported() creates a bf16 tensor on the device when the GPU has no
        # native bf16 (a V100, a T4): that works there (emulated), so it answers True
        "_check_bf16_tensor_supported": lambda *a, **k: True,
    }.items():
        patch(torch.cuda, name, value)
    patch(torch.version, "cuda", profile.cuda_version)
    patch(torch.version, "hip", profile.hip_version)
    nccl = getattr(torch.cuda, "nccl", None)
    if nccl is not None:
        patch(nccl, "version", lambda: NCCL_VERSION)
        patch(nccl, "is_available", lambda *a, **k: True)
    cudnn = torch.backends.cudnn
    patch(cudnn, "is_available", lambda: True)
    patch(cudnn, "version", lambda: CUDNN_VERSION if profile.vendor == "nvidia" else 3_004_000)
    patch(torch.backends.cuda, "is_built", lambda: True)
    import torch.distributed as dist

    if hasattr(dist, "is_nccl_available"):
        patch(dist, "is_nccl_available", lambda: True)
    if not hasattr(dist, "ProcessGroupNCCL"):       # a CPU build: NCCL "is available", so its class is there
        patch(dist, "ProcessGroupNCCL", _ProcessGroupNCCL)


class _NcclOptions:
    """``ProcessGroupNCCL.Options`` of a CUDA build: what a script sets for a group it asks for
    (``_timeout``, ``is_high_priority_stream``, ``config``) and passes to ``init_process_group``,
    ``new_group`` or ``init_device_mesh(backend_override=...)``; the simulated groups do not read it."""

    def __init__(self, is_high_priority_stream: bool = False):
        import datetime

        self.is_high_priority_stream = is_high_priority_stream
        self._timeout = datetime.timedelta(minutes=10)
        self.config = types.SimpleNamespace(blocking=1, cga_cluster_size=4, min_ctas=1, max_ctas=32, net_name="")
        self.global_ranks_in_group: list = []
        self.group_name = ""
        self.split_from = None
        self.split_color = 0


class _ProcessGroupNCCL:
    """``torch.distributed.ProcessGroupNCCL`` on the simulated node (a CPU build of torch has none): its
    ``Options`` for the groups a script configures; a group of its own is never built in a replay."""
    Options = _NcclOptions

    def __init__(self, *args, **kwargs):
        raise RuntimeError("ProcessGroupNCCL(...) built directly: a replay builds no NCCL group "
                           "(init_process_group / new_group / init_device_mesh are simulated)")


def _index(device) -> int:
    # an int, "cuda" / "cuda:1" (a str's `index` is a method, not the device's), a torch.device, None
    return cuda_probes.device_index(device)


# --------------------------------------------------------------------------------------------
# what the node's state outlives: flags, and the answers libraries cache
# --------------------------------------------------------------------------------------------
class BackendFlags:
    """The TF32 / cuDNN flags a script may set (``torch.backends.cuda.matmul.allow_tf32 = True``),
    saved before a replay and put back after it."""

    def __init__(self):
        import torch

        self.values = {}
        for owner, name in self._flags(torch):
            with contextlib.suppress(Exception):
                self.values[(owner, name)] = getattr(owner, name)
        with contextlib.suppress(Exception):
            self.precision = torch.get_float32_matmul_precision()

    @staticmethod
    def _flags(torch):
        return [(torch.backends.cuda.matmul, "allow_tf32"),
                (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
                (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
                (torch.backends.cudnn, "allow_tf32"), (torch.backends.cudnn, "benchmark"),
                (torch.backends.cudnn, "deterministic"), (torch.backends.cudnn, "enabled")]

    def restore(self) -> None:
        import torch

        if getattr(self, "precision", None) is not None:
            with contextlib.suppress(Exception):
                if torch.get_float32_matmul_precision() != self.precision:
                    torch.set_float32_matmul_precision(self.precision)
        for (owner, name), value in self.values.items():
            with contextlib.suppress(Exception):
                if getattr(owner, name) != value:
                    setattr(owner, name, value)


# modules whose ``is_*`` probes are cached (functools.lru_cache): asked again on each node
_CACHED_PROBES = ("transformers.utils.import_utils", "accelerate.utils.imports", "accelerate.utils.environment",
                  "lightning_fabric.accelerators.cuda", "lightning.fabric.accelerators.cuda",
                  "torch.cuda")


def clear_cached_probes() -> None:
    """Forget what libraries cached about the node (``is_torch_bf16_gpu_available()`` is an lru_cache
    in transformers): what they answered on another node, or on the real machine, does not hold here."""
    for module_name in _CACHED_PROBES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and (name.startswith(("is_", "_is_", "num_", "_check_")) or "capab" in name):
                with contextlib.suppress(Exception):
                    clear()
