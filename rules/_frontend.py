"""Fix texts in the words of the front-end that built the plan: the HF Trainer's flags, its arguments
file, `TrainingArguments(...)` in Python or the JSON file `fsdp_config` names (as the user wrote it:
`plan.hf_frontend`), accelerate's YAML keys, Lightning's strategy argument.

transformers 5 (checked with 5.24: `HfArgumentParser(TrainingArguments)`) takes `--fsdp` (bare: FSDP
on; `"full_shard auto_wrap"` still parses, with a deprecation warning) and `--fsdp_config` (a JSON file
or an inline JSON object); it refuses `--fsdp_transformer_layer_cls_to_wrap` ("Some specified arguments
are not used by the HfArgumentParser"). transformers 4 has `--fsdp "full_shard auto_wrap"` and the
deprecated `--fsdp_transformer_layer_cls_to_wrap` flag beside `fsdp_config`."""
import json
import re
import os
from typing import Optional


def _front(ctx) -> Optional[dict]:
    plan = ctx.plan
    return getattr(plan, "hf_frontend", None) if getattr(plan, "framework", None) == "transformers" else None


def hf_config_text(ctx, key: str, value) -> Optional[str]:
    """How to set `fsdp_config[key] = value` where the user configures the Trainer (None: not an HF plan)."""
    front = _front(ctx)
    if front is None:
        return None
    js, py = json.dumps(value), repr(value)
    if front.get("fsdp_config_file"):
        return f"set `\"{key}\": {js}` in {os.path.basename(front['fsdp_config_file'])} (the `fsdp_config` file)"
    if front["how"] == "flags":
        return f"pass `--fsdp_config '{{\"{key}\": {js}}}'` (or a JSON file with that key)"
    if front["how"] == "args_file":
        return f"set `\"fsdp_config\": {{\"{key}\": {js}}}` in {os.path.basename(front['args_file'])}"
    return f"pass `fsdp_config={{\"{key}\": {py}}}` to `TrainingArguments`"


def hf_wrap_blocks_text(ctx, block: str) -> Optional[str]:
    """How to make every `block` a unit with the HF Trainer, as the user writes its arguments."""
    front = _front(ctx)
    if front is None:
        return None
    major = front.get("transformers_major", 5)
    names = json.dumps([block])
    policy = '"auto_wrap_policy": "TRANSFORMER_BASED_WRAP", '
    if front.get("fsdp_config_file"):
        return (f"set `{policy}\"transformer_layer_cls_to_wrap\": {names}` in {os.path.basename(front['fsdp_config_file'])} "
                f"(the `fsdp_config` file)")
    if front["how"] == "flags":
        if major >= 5:
            return f"pass `--fsdp --fsdp_config '{{{policy}\"transformer_layer_cls_to_wrap\": {names}}}'` (transformers 5)"
        return f"pass `--fsdp \"full_shard auto_wrap\" --fsdp_transformer_layer_cls_to_wrap {block}`"
    fsdp = "true" if major >= 5 else "\"full_shard auto_wrap\""
    if front["how"] == "args_file":
        return (f"set `\"fsdp\": {fsdp}, \"fsdp_config\": {{{policy}\"transformer_layer_cls_to_wrap\": {names}}}` in "
                f"{os.path.basename(front['args_file'])}")
    fsdp = "True" if major >= 5 else "\"full_shard auto_wrap\""
    return f"`TrainingArguments(fsdp={fsdp}, fsdp_config={{{policy}\"transformer_layer_cls_to_wrap\": {names}}})`"


def lightning_policy_text(desc: str) -> str:
    """Lightning's ModuleWrapPolicy as the user wrote it: `FSDPStrategy(auto_wrap_policy={...})`."""
    m = re.search(r"\{[^{}]*\}", desc)
    return f"FSDPStrategy(auto_wrap_policy={m.group()})" if m else desc
