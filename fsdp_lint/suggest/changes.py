"""The change that turns the file's plan into a candidate, in the front-end the file uses."""
from __future__ import annotations

from typing import List


def describe(kinds: List[str], plan, tree) -> str:
    """`kinds`: "ac" (every block checkpointed), "root-reshard" (FSDP2: the root resharded after
    forward), "offload" (parameters, gradients and optimizer state on the CPU)."""
    if not kinds:
        return "keep the plan as it is"
    blocks = sorted({u.cls for u in plan.units if not u.is_root}) or sorted(tree.repeated_blocks())
    block = ", ".join(blocks[:2]) or "Block"
    framework = getattr(plan, "framework", None)
    return "; ".join(_one(k, framework, plan.api, block) for k in kinds)


def _one(kind: str, framework, api: str, block: str) -> str:
    if framework == "accelerate":
        return {"ac": "accelerate config: `fsdp_config: {fsdp_activation_checkpointing: true}`",
                "root-reshard": "accelerate config: `fsdp_config: {fsdp_reshard_after_forward: true}`",
                "offload": "accelerate config: `fsdp_config: {fsdp_offload_params: true}`"}[kind]
    if framework == "transformers":
        return {"ac": "`TrainingArguments(gradient_checkpointing=True)` (or `fsdp_config={\"activation_checkpointing\": "
                      "true}`)",
                "root-reshard": "`fsdp_config={\"reshard_after_forward\": true}`",
                "offload": "`TrainingArguments(fsdp=\"full_shard offload auto_wrap\")`"}[kind]
    if framework == "lightning":
        return {"ac": f"`FSDPStrategy(activation_checkpointing_policy={{{block}}})`",
                "root-reshard": "`ModelParallelStrategy`/`fully_shard(model, reshard_after_forward=True)` in "
                                "`configure_model`",
                "offload": "`FSDPStrategy(cpu_offload=True)`"}[kind]
    if kind == "ac":
        return (f"`apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: "
                f"isinstance(m, {block}))` before the wrap calls")
    if kind == "root-reshard":
        return "`fully_shard(model, reshard_after_forward=True)` for the root"
    if api == "fsdp1":
        return "`FSDP(..., cpu_offload=CPUOffload(offload_params=True))`"
    return "`offload_policy=CPUOffloadPolicy()` on every `fully_shard` call"
