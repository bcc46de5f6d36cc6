"""FSD801 exceeds-device-memory."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import where

_MODEL = '''
import torch
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=1024):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(self.norm(x)).relu())

class Net(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

def example_inputs():
    return torch.randn(8, 512, 1024)
'''

_WRAP = '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''

# a small device with nothing reserved, so that the examples stay small
_DEVICE = {"cuda_context_memory": "0B", "nccl_memory": "0B", "memory_fragmentation": 0.0}


class ExceedsDeviceMemory(Rule):
    """The plan's peak memory per rank is above what the device can hold.

    ## What it does
    Compares the peak memory per rank with the usable memory of the device (`--gpu-memory`, or
    the memory of the `--gpu` profile, an H100 by default, less the CUDA context, NCCL's buffers
    and allocator fragmentation: `cuda-context-memory`, `nccl-memory`, `memory-fragmentation`).
    The peak is the best figure known: the simulated peak after `--simulate`, the static estimate
    with activations when the input shape is known, else the lower bound without activations
    (sharded parameters, gradients, optimizer state and what FSDP holds unsharded), which fires
    only when even that exceeds the device, and says so. The message gives the peak, the device,
    the three largest contributors and where in the step the peak happens.

    ## Why is this bad?
    The run fails with `torch.OutOfMemoryError` at the first step that reaches the peak -- after
    the job waited for its GPUs, loaded its checkpoint and compiled.

    ## Example
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)       # 8B parameters on 8 H100s, batch 8 x 4096, no checkpointing
    ```

    ## Fix
    Lower what the largest contributor costs: activation checkpointing for activations
    (`checkpoint_wrapper` around each block, HF `gradient_checkpointing_enable()`), more ranks or
    a coarser HSDP replica for sharded state, CPU offload (`CPUOffloadPolicy`, FSDP1 `CPUOffload`) for
    optimizer state, a smaller micro-batch. `fsdp-lint --suggest` lists the plans that fit.
    """

    code = "FSD801"
    name = "exceeds-device-memory"
    severity = "error"
    summary = "the plan's peak memory per rank is above the usable memory of the device"

    VALID = [
        Example(_MODEL + _WRAP, options=dict(_DEVICE, gpu_memory="2GiB"), note="fits in 2 GiB"),
        Example(_MODEL.replace("def example_inputs():\n    return torch.randn(8, 512, 1024)\n", "") + _WRAP,
                options=dict(_DEVICE, gpu_memory="256MiB"),
                note="no input shape: the lower bound fits, which proves nothing either way"),
    ]
    INVALID = [
        Example(_MODEL + _WRAP, options=dict(_DEVICE, gpu_memory="512MiB"), note="activations do not fit"),
        Example(_MODEL.replace("def example_inputs():\n    return torch.randn(8, 512, 1024)\n", "") + _WRAP,
                options=dict(_DEVICE, gpu_memory="64MiB"), note="even the lower bound does not fit"),
    ]

    def check(self, ctx):
        from fsdp_lint.humanize import human_bytes
        from fsdp_lint.plan.budget import LOWER_BOUND, budget_for, contributors

        if ctx.layout is None or not ctx.plan.units:
            return
        simulated = getattr(ctx, "simulated", None)
        simulated = simulated if simulated and "peak_bytes" in simulated else None
        budget = budget_for(ctx.layout.memory, ctx.settings, simulated)
        if budget.fits is not False:
            return
        parts = ", ".join(f"{label} {share:.0%}" for label, _, share in contributors(ctx.layout.memory, simulated))
        what = {"simulated peak": "simulated peak", "static estimate with activations": "estimated peak"}.get(
            budget.source, "lower bound (without activations: pass --input-shape for the peak)")
        msg = (f"{what} {human_bytes(budget.peak_bytes)}/rank exceeds the usable memory of the device by "
               f"{human_bytes(-budget.headroom_bytes)}")
        detail = (f"{budget.device}, {human_bytes(budget.usable_bytes)} usable after the CUDA context, NCCL buffers "
                  f"and fragmentation; largest: {parts}; the peak is at {budget.phase}")
        if budget.source == LOWER_BOUND:
            detail += "; activations come on top of it"
        unit = ctx.plan.root_unit or ctx.plan.units[-1]
        fix = ("lower the largest contributor: activation checkpointing for activations, more ranks (or a larger "
               "shard group) for sharded state, CPUOffloadPolicy / CPUOffload for the optimizer state, a smaller "
               "micro-batch; `fsdp-lint --suggest` lists plans that fit")
        yield self.finding(ctx, msg, **where(ctx, unit.path, unit.line, unit.col), module=unit.module, fix=fix,
                           detail=detail, peak_bytes=budget.peak_bytes, usable_bytes=budget.usable_bytes, source=budget.source)
