"""`budget`: the plan's peak memory per rank against the device it runs on.

The device is ``--gpu-memory`` (``[tool.fsdp-lint] gpu-memory``, IEC units: ``80GiB``) or the memory
of the ``--gpu`` profile (an H100 by default). A real process cannot use all of it; the usable memory
leaves out, each configurable:

* the CUDA context (``cuda-context-memory``, default 1 GiB): the driver's per-process state and the
  kernels of torch, cuBLAS and cuDNN loaded into it. With lazy module loading (CUDA >= 11.7, the
  default of torch's wheels) it is about 0.5-1 GiB on A100/H100-class GPUs; ``nvidia-smi`` shows it as
  the memory a process holds before its first tensor (PyTorch "CUDA semantics: memory management":
  the caching allocator's figures do not include it);
* NCCL's buffers (``nccl-memory``, default 1 GiB): per communicator, ``NCCL_BUFFSIZE`` (4 MiB by
  default, NCCL's environment-variable documentation) per channel and peer for each protocol, plus
  its work FIFOs: a few hundred MiB to about 1 GiB on an 8-GPU node;
* allocator fragmentation (``memory-fragmentation``, default 0.05 of what is left): the caching
  allocator rounds and splits blocks, so reserved memory exceeds the peak of allocated tensors
  (``torch.cuda.memory_reserved`` vs ``max_memory_allocated``); ``expandable_segments:True`` in
  ``PYTORCH_CUDA_ALLOC_CONF`` lowers it.

The figure compared is the best one known: the simulated peak (``--simulate``), the static estimate
with activations (an input shape is known), or the lower bound without them -- which can only prove
that a plan does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fsdp_lint.config import parse_bytes

GiB = 1 << 30
DEFAULT_CUDA_CONTEXT = "1GiB"
DEFAULT_NCCL = "1GiB"
DEFAULT_FRAGMENTATION = 0.05
DEFAULT_INFO_SHARE = 0.05     # FSD104/FSD202: a cost below this share of the usable memory is info

SIMULATED, WITH_ACTIVATIONS, LOWER_BOUND = "simulated peak", "static estimate with activations", \
    "lower bound without inputs"


@dataclass
class Budget:
    device: str                 # what the device is: "NVIDIA H100 80GB HBM3 (80 GiB)", "--gpu-memory 40GiB"
    device_bytes: int
    usable_bytes: int
    cuda_context_bytes: int
    nccl_bytes: int
    fragmentation: float
    peak_bytes: int
    source: str                 # SIMULATED | WITH_ACTIVATIONS | LOWER_BOUND
    phase: str                  # where in the step the compared peak is

    @property
    def fits(self) -> Optional[bool]:
        """True/False; None when only a lower bound below the budget is known (it cannot prove a fit)."""
        if self.peak_bytes > self.usable_bytes:
            return False
        return None if self.source == LOWER_BOUND else True

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.peak_bytes

    def share(self, nbytes: int) -> float:
        """`nbytes` as a share of the usable memory."""
        return nbytes / max(1, self.usable_bytes)

    def to_json(self) -> dict:
        return {"device": self.device, "device_bytes": self.device_bytes, "usable_bytes": self.usable_bytes,
                "peak_bytes": self.peak_bytes, "fits": self.fits, "headroom_bytes": self.headroom_bytes,
                "source": self.source, "phase": self.phase,
                "reserved": {"cuda_context_bytes": self.cuda_context_bytes, "nccl_bytes": self.nccl_bytes,
                             "fragmentation": self.fragmentation}}


def device_of(settings):
    """(description, bytes) of the device the plan is judged against."""
    from fsdp_lint import gpus

    explicit = getattr(settings, "gpu_memory", None)
    if explicit:
        return f"{explicit} (--gpu-memory)", parse_bytes(explicit) or 0
    gpu = gpus.profile(getattr(settings, "gpu", None))
    default = "" if getattr(settings, "gpu", None) else ", the default GPU"
    return f"{gpu.device_name} ({gpu.memory_label}{default})", gpu.memory_bytes


def usable_bytes(settings, device_bytes: int) -> int:
    context = parse_bytes(getattr(settings, "cuda_context_memory", None) or DEFAULT_CUDA_CONTEXT) or 0
    nccl = parse_bytes(getattr(settings, "nccl_memory", None) or DEFAULT_NCCL) or 0
    frag = getattr(settings, "memory_fragmentation", None)
    frag = DEFAULT_FRAGMENTATION if frag is None else frag
    return max(0, int((device_bytes - context - nccl) * (1 - frag)))


def budget_for(memory, settings, simulated: Optional[dict] = None) -> Budget:
    """The budget of a plan whose static estimate is `memory` (``plan.memory.Memory``), with the
    simulated result when ``--simulate`` measured one."""
    device, device_bytes = device_of(settings)
    context = parse_bytes(getattr(settings, "cuda_context_memory", None) or DEFAULT_CUDA_CONTEXT) or 0
    nccl = parse_bytes(getattr(settings, "nccl_memory", None) or DEFAULT_NCCL) or 0
    frag = getattr(settings, "memory_fragmentation", None)
    frag = DEFAULT_FRAGMENTATION if frag is None else frag
    if simulated and "peak_bytes" in simulated:
        at = simulated.get("peak_at") or {}
        phase = f"{at.get('phase', '?')} of {at.get('module') or '(root)'} (step {at.get('step', '?')})"
        peak, source = int(simulated["peak_bytes"]), SIMULATED
    else:
        peak, phase = memory.per_rank_bytes, memory.phase
        source = WITH_ACTIVATIONS if "activations" in memory.covers else LOWER_BOUND
    return Budget(device=device, device_bytes=device_bytes, usable_bytes=usable_bytes(settings, device_bytes),
                  cuda_context_bytes=context, nccl_bytes=nccl, fragmentation=frag, peak_bytes=peak, source=source,
                  phase=phase)


_LABELS = {"sharded_params": "sharded parameters", "unsharded_params_in_flight": "unsharded parameters",
           "unsharded_params": "unsharded parameters", "all_gather_buffers": "all-gather buffers",
           "sharded_grads": "sharded gradients", "unsharded_grads": "unsharded gradients",
           "reduce_scatter_buffers": "reduce-scatter buffers", "optimizer_state": "optimizer state",
           "replicated_params_grads_state": "replicated parameters, gradients and state",
           "temporaries": "temporaries", "inputs": "inputs", "buffers": "buffers",
           "post_forward_shards": "post-forward shards"}


def contributors(memory, simulated: Optional[dict] = None, top: int = 3):
    """The largest parts of the compared peak, [(label, bytes, share)]: the categories, with the
    activations split by unit when the static estimate knows them (``activations of layers.*``)."""
    if simulated and "breakdown" in simulated:
        parts = dict(simulated["breakdown"])
        by_unit = {}
    else:
        parts = dict(memory.breakdown)
        by_unit = dict(getattr(memory, "activations_by_unit", {}) or {})
    total = max(1, sum(parts.values()))
    items = []
    acts = parts.pop("activations", 0)
    if by_unit and acts:
        known = sum(by_unit.values())
        for name, b in by_unit.items():
            if b:
                items.append((f"activations of {name}", b))
        if acts > known:
            items.append(("outputs", acts - known))
    elif acts:
        items.append(("activations", acts))
    items += [(_LABELS.get(k, k.replace("_", " ")), v) for k, v in parts.items() if v]
    items.sort(key=lambda kv: -kv[1])
    return [(label, b, b / total) for label, b in items[:top]]


def share_text(share: float) -> str:
    """``0.0123`` -> ``1.2%``; a share too small to show in one decimal -> ``under 0.1%``."""
    return f"{share:.1%}" if share >= 0.001 else "under 0.1%"
