"""Fix texts in the words of the front-end that built the plan: the HF Trainer's flags, its arguments
file, `TrainingArguments(...)` in Python or the JSON file `fsdp_config` names (as the user wrote it:
`plan.hf_frontend`), accelerate's YAML keys, Lightning's strategy argument.

transformers 5 (checked with 5.24: `HfArgumentParser(TrainingArguments)`) takes `--fsdp` (bare: FSDP
on; `"full_shard auto_wrap"` still parses, with a deprecation warning) and `--fsdp_config` (a JSON file
or an inline JSON object); it refuses `--fsdp_transformer_layer_cls_to_wrap` ("Some specified arguments
are not used by the HfArgumentParser"). transformers 4 (checked with 4.44.2) has `--fsdp "full_shard auto_wrap"`
(a bare `--fsdp` is refused), the deprecated `--fsdp_transformer_layer_cls_to_wrap` and `--fsdp_min_num_params`
flags beside `fsdp_config`, and no `auto_wrap_policy` key."""
import json
import re
import os
from typing import Optional


def _front(ctx) -> Optional[dict]:
    plan = ctx.plan
    return getattr(plan, "hf_frontend", None) if getattr(plan, "framework", None) == "transformers" else None


def _inline(front) -> Optional[dict]:
    """The `--fsdp_config '{...}'` object given on the command line (None: a file, or none)."""
    return front.get("fsdp_config_inline") if front.get("how") == "flags" else None


def _config_value(front, key: str):
    """`key` of the user's fsdp_config (transformers 4 reads `fsdp_min_num_params` in a file as `min_num_params`)."""
    values = front.get("fsdp_config_values") or {}
    return values.get(key, values.get("fsdp_" + key))


def _without_size_policy(config: dict) -> dict:
    """The config without the size-based policy's keys (transformers 4 raises on `min_num_params` beside
    `transformer_layer_cls_to_wrap`; transformers 5 ignores it once the policy is transformer-based)."""
    drop = {"min_num_params", "fsdp_min_num_params", "auto_wrap_policy", "fsdp_auto_wrap_policy",
            "transformer_layer_cls_to_wrap", "fsdp_transformer_layer_cls_to_wrap"}
    return {k: v for k, v in config.items() if k not in drop}


def _in_script(front, *flags: str) -> str:
    """` in run.sh, line 14`: where the launch script writes the first of `flags` (empty: no script)."""
    script = front.get("launch_script")
    lines = front.get("flag_lines") or {}
    line = next((lines[f] for f in flags if f in lines), None)
    if not script:
        return ""
    return f" in {os.path.basename(script)}" + (f", line {line}" if line else "")


def _fsdp4(front) -> str:
    """transformers 4's `--fsdp` value with `auto_wrap` (without it no policy is set: nothing is wrapped)."""
    given = front.get("fsdp_flag")
    words = given.split() if isinstance(given, str) and given.strip() else ["full_shard"]
    return " ".join(words + ([] if "auto_wrap" in words else ["auto_wrap"]))


def hf_config_text(ctx, key: str, value) -> Optional[str]:
    """How to set `fsdp_config[key] = value` where the user configures the Trainer (None: not an HF plan)."""
    front = _front(ctx)
    if front is None:
        return None
    js, py = json.dumps(value), repr(value)
    if front.get("fsdp_config_file"):
        return f"set `\"{key}\": {js}` in {os.path.basename(front['fsdp_config_file'])} (the `fsdp_config` file)"
    if front["how"] == "flags":
        inline = _inline(front)
        where = _in_script(front, "--fsdp_config", "--fsdp")
        if inline is not None:     # the user's own object with the key set: passing a new one replaces it
            return (f"pass `--fsdp_config '{json.dumps({**inline, key: value})}'` in place of the `--fsdp_config` "
                    f"given{where}")
        return f"pass `--fsdp_config '{{\"{key}\": {js}}}'` (or a JSON file with that key){where}"
    if front["how"] == "args_file":
        return f"set `\"fsdp_config\": {{\"{key}\": {js}}}` in {os.path.basename(front['args_file'])}"
    return f"pass `fsdp_config={{\"{key}\": {py}}}` to `TrainingArguments`"


def hf_wrap_blocks_text(ctx, block: str) -> Optional[str]:
    """How to make every `block` a unit with the HF Trainer, as the user writes its arguments.

    transformers 5 picks the policy by the `auto_wrap_policy` key; transformers 4 (read from 4.44's
    `TrainingArguments.__post_init__`) ignores that key, uses the size-based policy whenever `min_num_params`
    (the key, or `--fsdp_min_num_params`) is above 0, raises when `transformer_layer_cls_to_wrap` is set
    beside it, and sets no policy at all without `auto_wrap` in `--fsdp`; a bare `--fsdp` is refused."""
    front = _front(ctx)
    if front is None:
        return None
    major = front.get("transformers_major", 5)
    names = json.dumps([block])
    policy = '"auto_wrap_policy": "TRANSFORMER_BASED_WRAP", ' if major >= 5 else ""
    size_flag = front.get("min_num_params_flag") not in (None, True, "0")
    drop_flag = " and drop `--fsdp_min_num_params`" if major < 5 and size_flag else ""
    if front.get("fsdp_config_file"):
        size_key = major < 5 and (_config_value(front, "min_num_params") or 0) > 0
        text = (f"set `{policy}\"transformer_layer_cls_to_wrap\": {names}` in "
                f"{os.path.basename(front['fsdp_config_file'])} (the `fsdp_config` file)")
        if size_key:
            text += ", removing its `min_num_params`"
        if major < 5 and front["how"] == "flags" and "auto_wrap" not in str(front.get("fsdp_flag") or ""):
            text += f", and pass `--fsdp \"{_fsdp4(front)}\"`"
        return text + drop_flag
    if front["how"] == "flags":
        inline = _inline(front)
        drop_flag += _in_script(front, "--fsdp_config", "--fsdp", "--fsdp_min_num_params")
        if inline is not None:
            policy5 = {"auto_wrap_policy": "TRANSFORMER_BASED_WRAP"} if major >= 5 else {}
            config = {**_without_size_policy(inline), **policy5, "transformer_layer_cls_to_wrap": [block]}
            fsdp = "--fsdp" if major >= 5 else f"--fsdp \"{_fsdp4(front)}\""
            said = " (transformers 5)" if major >= 5 else ""
            return (f"pass `{fsdp} --fsdp_config '{json.dumps(config)}'` in place of the `--fsdp_config` "
                    f"given{said}{drop_flag}")
        if major >= 5:
            return (f"pass `--fsdp --fsdp_config '{{{policy}\"transformer_layer_cls_to_wrap\": {names}}}'` "
                    f"(transformers 5){drop_flag}")
        return f"pass `--fsdp \"{_fsdp4(front)}\" --fsdp_transformer_layer_cls_to_wrap {block}`{drop_flag}"
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
