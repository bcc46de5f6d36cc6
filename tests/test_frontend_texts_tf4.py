"""The HF Trainer fix texts for transformers 4.x, checked without transformers 4 installed (CI has 5).

The front-end data is what `fsdp_lint.plan.frameworks.hf_frontend` records from a launch, with the
major version set to 4; the texts it gives are applied as a user would (flags added, a flag the text
replaces taken out, a config file edited) and parsed by a model of transformers 4.44.2's argument
handling. That model is data taken from the real 4.44.2 package (installed with
`pip install --no-deps --target DIR transformers==4.44.2 accelerate==0.34.2 tokenizers==0.19.1
huggingface_hub==0.24.7 datasets==2.21.0 peft==0.12.0`):

* `TF4_FSDP_FIELDS` is `[f.name for f in dataclasses.fields(TrainingArguments) if "fsdp" in f.name]`;
  `HfArgumentParser(TrainingArguments)` makes each a flag taking one value (a bare `--fsdp` exits with
  "argument --fsdp: expected one argument");
* `TF4_FSDP_OPTIONS` is `[o.value for o in transformers.trainer_utils.FSDPOption]`;
* `tf4_policy` follows `TrainingArguments.__post_init__` of 4.44.2: an inline `--fsdp_config` starting with
  `{` is parsed as JSON, else the value is a file; keys starting with `fsdp_` in the file lose the prefix;
  `min_num_params` is the larger of the key and `--fsdp_min_num_params`; `--fsdp_transformer_layer_cls_to_wrap`
  is appended to the key's list; both set raises "`min_num_params` and `transformer_layer_cls_to_wrap` are
  mutually exclusive."; with `auto_wrap` in `--fsdp` the policy is SIZE_BASED_WRAP when min_num_params > 0,
  else TRANSFORMER_BASED_WRAP with the listed classes; without `auto_wrap` no policy is set. The
  `auto_wrap_policy` key is not read.

tests/test_frontend_texts.py launches the same texts through the real 4.44 Trainer when transformers 4
is what is installed."""
from __future__ import annotations

import argparse
import ast
import json
import os
from types import SimpleNamespace

import pytest

from fsdp_lint.plan.frameworks import hf_frontend
from fsdp_lint.rules._frontend import hf_config_text, hf_wrap_blocks_text
from hf_flags import apply_flags

# from transformers 4.44.2 itself (see the module docstring)
TF4_FSDP_FIELDS = ["fsdp", "fsdp_min_num_params", "fsdp_config", "fsdp_transformer_layer_cls_to_wrap"]
TF4_FSDP_OPTIONS = ["full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload",
                    "auto_wrap"]
TF4_CONFIG_KEYS = ["backward_prefetch", "buffer_dtype", "compute_dtype", "cpu_ram_efficient_loading",
                   "forward_prefetch", "min_num_params", "sync_module_states", "transformer_layer_cls_to_wrap",
                   "use_orig_params", "xla", "xla_fsdp_grad_ckpt", "xla_fsdp_settings", "xla_fsdp_v2"]

BASE = ["--output_dir", "o", "--max_steps", "10"]
SIZE = {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100000000, "use_orig_params": False}


class Refused(Exception):
    pass


def tf4_parse(argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    for name in TF4_FSDP_FIELDS:
        parser.add_argument(f"--{name}", type=int if name == "fsdp_min_num_params" else str,
                            default=0 if name == "fsdp_min_num_params" else None)
    parser.add_argument("--output_dir")
    parser.add_argument("--max_steps")
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise Refused(str(exc)) from exc
    if unknown:     # HfArgumentParser: "Some specified arguments are not used by the HfArgumentParser"
        raise Refused(f"not used: {unknown}")
    return args


def tf4_policy(argv):
    """(policy, classes, config) transformers 4.44 sets for the launch `argv`."""
    args = tf4_parse(argv)
    words = (args.fsdp or "").split()
    assert set(words) <= set(TF4_FSDP_OPTIONS), words
    raw = args.fsdp_config
    if raw is None:
        config = {}
    elif raw.startswith("{"):
        config = json.loads(raw)
    else:
        with open(raw, encoding="utf-8") as fh:
            config = {k[5:] if k.startswith("fsdp_") else k: v for k, v in json.load(fh).items()}
    assert set(config) - {"auto_wrap_policy"} <= set(TF4_CONFIG_KEYS) | {"version"}, config
    min_num = max(config.get("min_num_params", 0), args.fsdp_min_num_params)
    classes = config.get("transformer_layer_cls_to_wrap")
    if isinstance(classes, str):
        classes = [classes]
    if args.fsdp_transformer_layer_cls_to_wrap is not None:
        classes = (classes or []) + [args.fsdp_transformer_layer_cls_to_wrap]
    if words and min_num > 0 and classes is not None:
        raise Refused("`min_num_params` and `transformer_layer_cls_to_wrap` are mutually exclusive.")
    if "auto_wrap" not in words:
        return None, None, config
    return ("SIZE_BASED_WRAP", None, config) if min_num > 0 else ("TRANSFORMER_BASED_WRAP", classes, config)


def _ctx(argv, path=None, major=4):
    front = hf_frontend(argv, path)
    front["transformers_major"] = major
    return SimpleNamespace(plan=SimpleNamespace(framework="transformers", hf_frontend=front))


LAUNCHES = {
    "size-config-inline": [*BASE, "--fsdp", "full_shard auto_wrap", "--fsdp_config", json.dumps(SIZE)],
    "size-flag": [*BASE, "--fsdp", "full_shard auto_wrap", "--fsdp_min_num_params", "20000"],
    "no-auto-wrap": [*BASE, "--fsdp", "shard_grad_op"],
    "no-config": [*BASE, "--fsdp", "full_shard auto_wrap"],
}


def test_the_launches_are_what_transformers_4_takes_before_the_fix():
    """The model of 4.44 takes the launches as given (a size policy, or none without auto_wrap), and
    refuses what 4.44 refuses: the text fsdp-lint gave before it knew transformers 4's rule."""
    assert tf4_policy(LAUNCHES["size-config-inline"])[0] == "SIZE_BASED_WRAP"
    assert tf4_policy(LAUNCHES["no-auto-wrap"])[0] is None
    with pytest.raises(Refused, match="mutually exclusive"):
        tf4_policy([*LAUNCHES["size-config-inline"], "--fsdp_transformer_layer_cls_to_wrap", "T5Block"])
    with pytest.raises(Refused, match="expected one argument"):
        tf4_policy([*BASE, "--fsdp"])


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_fsd101_flags_text_for_transformers_4_makes_every_block_a_unit(name):
    argv = LAUNCHES[name]
    fix = hf_wrap_blocks_text(_ctx(argv), "T5Block")
    assert "(transformers 5)" not in fix and "auto_wrap_policy" not in fix
    policy, classes, config = tf4_policy(apply_flags(argv, fix))
    assert (policy, classes) == ("TRANSFORMER_BASED_WRAP", ["T5Block"]), fix
    if name == "size-config-inline":      # the user's other settings are kept
        assert config["use_orig_params"] is False
    if name == "no-auto-wrap":            # the user's sharding strategy is kept
        assert tf4_parse(apply_flags(argv, fix)).fsdp == "shard_grad_op auto_wrap"


def _set_in_file(path, fix: str):
    """Edit the JSON file as the text says: set the keys in its first `...`, remove the one it names."""
    doc = json.loads(open(path).read())
    doc.update(json.loads("{" + fix.split("`")[1] + "}"))
    if "removing its `min_num_params`" in fix:
        doc.pop("min_num_params", None)
        doc.pop("fsdp_min_num_params", None)
    open(path, "w").write(json.dumps(doc))


@pytest.mark.parametrize("key", ["min_num_params", "fsdp_min_num_params"])
def test_fsd101_config_file_text_for_transformers_4_leaves_no_size_policy(tmp_path, key):
    config = tmp_path / "fsdp_config.json"
    config.write_text(json.dumps({key: 100000000, "use_orig_params": False}))
    argv = [*BASE, "--fsdp", "full_shard", "--fsdp_config", str(config)]
    fix = hf_wrap_blocks_text(_ctx(argv), "T5Block")
    _set_in_file(config, fix)
    assert tf4_policy(apply_flags(argv, fix.split("and pass ")[1]) if "and pass " in fix else argv)[:2] == \
        ("TRANSFORMER_BASED_WRAP", ["T5Block"]), fix


def test_fsd101_python_and_arguments_file_texts_for_transformers_4(tmp_path):
    fix = hf_wrap_blocks_text(_ctx([], None), "T5Block")
    call = ast.parse(fix.strip("`")).body[0].value
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert call.func.id == "TrainingArguments" and set(kwargs) <= set(TF4_FSDP_FIELDS)
    argv = [*BASE, "--fsdp", kwargs["fsdp"], "--fsdp_config", json.dumps(kwargs["fsdp_config"])]
    assert tf4_policy(argv)[:2] == ("TRANSFORMER_BASED_WRAP", ["T5Block"])

    args = tmp_path / "args.json"
    args.write_text(json.dumps({"output_dir": "o", "fsdp": "full_shard"}))
    fix = hf_wrap_blocks_text(_ctx([str(args)]), "T5Block")
    doc = json.loads("{" + fix.split("`")[1] + "}")
    assert set(doc) <= set(TF4_FSDP_FIELDS)
    argv = [*BASE, "--fsdp", doc["fsdp"], "--fsdp_config", json.dumps(doc["fsdp_config"])]
    assert tf4_policy(argv)[:2] == ("TRANSFORMER_BASED_WRAP", ["T5Block"])


@pytest.mark.parametrize("major", [4, 5])
def test_use_orig_params_text_keeps_the_inline_config_given(major):
    """FSD201's `use_orig_params` text on a launch whose `--fsdp_config '{...}'` names the blocks: the
    suggested config is the user's with the key set -- passing `{"use_orig_params": true}` alone would
    replace it and drop the wrap classes."""
    given = {"transformer_layer_cls_to_wrap": ["T5Block"], "use_orig_params": False}
    argv = [*BASE, "--fsdp", "full_shard auto_wrap", "--fsdp_config", json.dumps(given)]
    fix = hf_config_text(_ctx(argv, major=major), "use_orig_params", True)
    launched = apply_flags(argv, fix)
    assert json.loads(launched[launched.index("--fsdp_config") + 1]) == {**given, "use_orig_params": True}
    if major == 4:
        assert tf4_policy(launched)[:2] == ("TRANSFORMER_BASED_WRAP", ["T5Block"])


def test_the_recorded_front_end_is_what_the_transformers_4_texts_read(tmp_path):
    """hf_frontend records the inline config, the file's settings and the size flag that the texts need."""
    config = tmp_path / "c.json"
    config.write_text('{"fsdp_min_num_params": 5}')
    front = hf_frontend([*BASE, "--fsdp", "full_shard", "--fsdp_config", str(config), "--fsdp_min_num_params=7"],
                        None)
    assert front["fsdp_config_file"] == str(config) and front["fsdp_config_values"] == {"fsdp_min_num_params": 5}
    assert front["min_num_params_flag"] == "7" and front["fsdp_config_inline"] is None
    front = hf_frontend([*BASE, "--fsdp_config", json.dumps(SIZE)], os.devnull)
    assert front["fsdp_config_inline"] == SIZE == front["fsdp_config_values"] and front["how"] == "flags"


@pytest.mark.parametrize("major", [4, 5])
def test_flag_texts_name_the_launch_script_line_that_sets_the_flag(tmp_path, major):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n# --fsdp_config in a comment\ntorchrun --nproc_per_node 8 train.py \\\n"
                      "    --fsdp 'full_shard auto_wrap' \\\n    --fsdp_config '" + json.dumps(SIZE) + "'\n")
    argv = [*BASE, "--fsdp", "full_shard auto_wrap", "--fsdp_config", json.dumps(SIZE)]
    front = hf_frontend(argv, None, str(script))
    front["transformers_major"] = major
    ctx = SimpleNamespace(plan=SimpleNamespace(framework="transformers", hf_frontend=front))
    for fix in (hf_wrap_blocks_text(ctx, "T5Block"), hf_config_text(ctx, "use_orig_params", True)):
        assert fix.endswith(" in run.sh, line 5"), fix
        assert tf4_policy(apply_flags(argv, fix))[0] if major == 4 else True
