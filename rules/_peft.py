"""Fixes that speak PEFT: for units that mix a PEFT model's frozen base weights with its adapters.

PEFT (``get_peft_model``) freezes the base model and adds trainable adapters (LoRA ``lora_A``/``lora_B``,
``modules_to_save`` copies) inside the same modules; a per-block wrap then mixes frozen and trainable
parameters, and PEFT keeps adapters in float32 on a bf16/fp16 base (``autocast_adapter_dtype=True``). The
fixes PEFT users apply are PEFT's: its ``fsdp_auto_wrap_policy(model)`` (adapters in units of their own,
blocks from ``_no_split_modules``), adapters in the base dtype, or ``use_orig_params=True`` with its cost.
"""
from typing import List, Optional

_ADAPTER_MARKERS = ("lora_", "modules_to_save", "lokr_", "loha_", "ia3_", "adaption_")
_PEFT_CLASSES = ("PeftModel", "BaseTunerLayer", "LoraModel")


def is_peft_model(tree) -> bool:
    return any(c in _PEFT_CLASSES for info in tree.modules.values() for c in info.mro)


def adapter_params(tree, fqns: List[str]) -> List[str]:
    return [f for f in fqns if any(m in f for m in _ADAPTER_MARKERS)]


def policy_fix(ctx) -> str:
    """How to give the adapters units of their own, for the front-end that built the plan."""
    framework = getattr(ctx.plan, "framework", None)
    peft = ("PEFT's `fsdp_auto_wrap_policy(model)` (`from peft.utils.other import fsdp_auto_wrap_policy`) wraps "
            "every adapter layer in a unit of its own and the blocks named by `_no_split_modules`")
    if framework == "lightning":
        return f"{peft}: `FSDPStrategy(auto_wrap_policy=fsdp_auto_wrap_policy(peft_model))`"
    if framework == "accelerate":
        return (f"{peft}: set `accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)` "
                f"before `accelerator.prepare(...)` (the HF Trainer does this for PEFT models)")
    if framework == "transformers":
        return f"{peft}; the Trainer applies it to PEFT models with `fsdp=\"... auto_wrap\"`"
    return f"{peft}: `FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), ...)`"


def requires_grad_fix(ctx, unit_params: List[str]) -> Optional[str]:
    """FSD201/FSD202: the PEFT way to stop a unit mixing frozen base weights and trainable adapters."""
    tree = ctx.tree
    if not is_peft_model(tree) or not adapter_params(tree, [p for p in unit_params if tree.params[p].requires_grad]):
        return None
    return policy_fix(ctx)


def dtype_fix(ctx, unit_params: List[str]) -> Optional[str]:
    """FSD203: adapters in float32 on a low-precision base (PEFT's default autocast)."""
    tree = ctx.tree
    if not is_peft_model(tree):
        return None
    adapters = adapter_params(tree, unit_params)
    base = [p for p in unit_params if p not in adapters]
    if not adapters or not base:
        return None
    adapter_dtypes = {tree.params[p].dtype for p in adapters}
    base_dtypes = {tree.params[p].dtype for p in base}
    if adapter_dtypes == base_dtypes or len(base_dtypes) != 1:
        return None
    base_dtype = next(iter(base_dtypes))
    return (f"keep the adapters in the base dtype: `get_peft_model(model, peft_config, autocast_adapter_dtype=False)` "
            f"(PEFT upcasts adapters to float32 by default) or cast the PEFT model with `model.to(torch.{base_dtype})` "
            f"before wrapping; or {policy_fix(ctx)}")
