"""The GPU the simulated node has: what every probe a script or library makes answers (``torch.cuda``
and ``torch.version``), and the device memory a plan is judged against.

``--gpu NAME`` / ``[tool.fsdp-lint] gpu``; the default is an H100. Each profile states what the
vendor's data sheet gives for that part (memory, compute capability, multiprocessors) and what torch
reports for it (``get_device_name()``, ``gcnArchName`` on ROCm). ``memory_bytes`` is the data sheet's
capacity; a real process can use less of it (the CUDA context, NCCL's buffers, fragmentation), which
the memory budget takes off separately.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuProfile:
    key: str                                   # the name --gpu takes: "h100"
    device_name: str                           # torch.cuda.get_device_name()
    vendor: str                                # "nvidia" (torch.version.cuda) | "amd" (torch.version.hip)
    capability: Tuple[int, int]                # torch.cuda.get_device_capability()
    memory_bytes: int                          # device memory by the data sheet
    multi_processor_count: int
    l2_cache_bytes: int
    bf16: bool                                 # torch.cuda.is_bf16_supported()
    tf32: bool                                 # TF32 matmuls (Ampere and later)
    arch_list: Tuple[str, ...]                 # torch.cuda.get_arch_list() of a build for it
    toolkit_version: str                       # torch.version.cuda / torch.version.hip
    gcn_arch_name: str = ""                    # ROCm: gcnArchName
    aliases: Tuple[str, ...] = field(default=())
    # torch.cuda.can_device_access_peer between two GPUs of the node: the NVLink / Infinity Fabric
    # boards (SXM, OAM) connect every pair; the PCIe cards of cloud nodes (T4, A10G, L4, L40S) offer no
    # peer access between them
    peer_access: bool = True

    @property
    def cuda_version(self) -> Optional[str]:
        return self.toolkit_version if self.vendor == "nvidia" else None

    @property
    def hip_version(self) -> Optional[str]:
        return self.toolkit_version if self.vendor == "amd" else None

    @property
    def memory_label(self) -> str:
        return f"{self.memory_bytes / GiB:g} GiB"


_CUDA_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
_CUDA = "12.8"       # the CUDA of torch's default wheels for the torch versions the package supports

PROFILES: Dict[str, GpuProfile] = {p.key: p for p in (
    GpuProfile("v100", "Tesla V100-SXM2-32GB", "nvidia", (7, 0), 32 * GiB, 80, 6 * MiB, False, False,
               _CUDA_ARCHS, _CUDA, aliases=("v100-32gb",)),
    GpuProfile("t4", "Tesla T4", "nvidia", (7, 5), 16 * GiB, 40, 4 * MiB, False, False, _CUDA_ARCHS, _CUDA, peer_access=False),
    GpuProfile("a10g", "NVIDIA A10G", "nvidia", (8, 6), 24 * GiB, 80, 6 * MiB, True, True, _CUDA_ARCHS, _CUDA, peer_access=False),
    GpuProfile("l4", "NVIDIA L4", "nvidia", (8, 9), 24 * GiB, 58, 48 * MiB, True, True, _CUDA_ARCHS, _CUDA, peer_access=False),
    GpuProfile("l40s", "NVIDIA L40S", "nvidia", (8, 9), 48 * GiB, 142, 96 * MiB, True, True, _CUDA_ARCHS, _CUDA, peer_access=False),
    GpuProfile("a100-40gb", "NVIDIA A100-SXM4-40GB", "nvidia", (8, 0), 40 * GiB, 108, 40 * MiB, True, True,
               _CUDA_ARCHS, _CUDA, aliases=("a100-40",)),
    GpuProfile("a100-80gb", "NVIDIA A100-SXM4-80GB", "nvidia", (8, 0), 80 * GiB, 108, 40 * MiB, True, True,
               _CUDA_ARCHS, _CUDA, aliases=("a100", "a100-80")),
    GpuProfile("h100", "NVIDIA H100 80GB HBM3", "nvidia", (9, 0), 80 * GiB, 132, 50 * MiB, True, True,
               _CUDA_ARCHS, _CUDA, aliases=("h100-80gb", "h100-sxm")),
    GpuProfile("h200", "NVIDIA H200", "nvidia", (9, 0), 141 * GiB, 132, 60 * MiB, True, True,
               _CUDA_ARCHS, _CUDA, aliases=("h200-141gb",)),
    GpuProfile("b200", "NVIDIA B200", "nvidia", (10, 0), 180 * GiB, 148, 126 * MiB, True, True,
               _CUDA_ARCHS, _CUDA),
    GpuProfile("mi300x", "AMD Instinct MI300X", "amd", (9, 4), 192 * GiB, 304, 4 * MiB, True, True,
               ("gfx90a", "gfx942"), "6.3", gcn_arch_name="gfx942:sramecc+:xnack-"),
)}
DEFAULT_GPU = "h100"
_BY_NAME = {name: p for p in PROFILES.values() for name in (p.key,) + p.aliases}


def names() -> List[str]:
    return sorted(PROFILES)


def find(name: Optional[str]) -> Optional[GpuProfile]:
    """The profile `name` names (case and ``_``/``-`` do not matter; None: the default), or None when
    there is none of that name."""
    if name is None:
        return PROFILES[DEFAULT_GPU]
    return _BY_NAME.get(str(name).strip().lower().replace("_", "-"))


def profile(name: Optional[str]) -> GpuProfile:
    """Like `find`, raising ValueError (one line naming the choices) for an unknown name."""
    found = find(name)
    if found is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(names())}")
    return found
