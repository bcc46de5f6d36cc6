"""Findings and fixes in the words of the front-end the plan came from (the HF Trainer, as the user
configures it): FSD103 at the line where the class name is written -- the `fsdp_config` JSON file, the
`--fsdp_config` flag of the launch command, the `fsdp_config` kwarg of `TrainingArguments` -- naming it;
FSD101's text is a command line transformers accepts. The real framework (transformers 5 + accelerate
under the fake process group, tests/test_frameworks.py's oracle) builds the plan the fixed input gives."""
from __future__ import annotations

import json
import os
import shlex
import shutil

import pytest

from fsdp_lint.config import Settings
from hf_flags import apply_flags
from test_frameworks import CFG, F, assert_framework_plan_matches

T5 = os.path.join(F, "hf_trainer", "train_t5.py")
LAUNCH = ["--output_dir", "o", "--max_steps", "10", "--report_to", "none", "--fsdp"]


def _findings(cli, *args, cwd=None):
    res = cli(*args[:1], "--output-format", "json", "--world-size", "4", *args[1:], cwd=cwd or os.getcwd())
    assert res.code in (0, 1), res.err
    return json.loads(res.out)["files"][0]["findings"]


def test_fsd103_in_the_fsdp_config_file_names_its_key_and_the_fix_edits_it(cli, tmp_path):
    config = tmp_path / "fsdp_config.json"
    before = open(os.path.join(F, "hf_trainer", "fsdp_config.json")).read().replace('"T5Block"', '"T5Blok"')
    config.write_text(before)
    argv = [*LAUNCH, "--fsdp_config", str(config)]
    (f,) = [f for f in _findings(cli, T5, "--", *argv) if f["code"] == "FSD103"]
    assert f["path"].endswith("fsdp_config.json") and f["line"] == before.splitlines().index(
        '  "transformer_layer_cls_to_wrap": ["T5Blok"],') + 1
    assert f["message"].startswith("The `transformer_layer_cls_to_wrap` key of fsdp_config.json (the `fsdp_config` "
                                   "file) names `T5Blok`")
    assert f["fix_applicability"] == "unsafe"
    cli(T5, "--fix", "--unsafe-fixes", "--world-size", "4", "--", *argv)
    assert config.read_text() == before.replace('"T5Blok"', '"T5Block"')
    res = assert_framework_plan_matches(T5, Settings(world_size=4), argv)     # the real Trainer wraps T5Block
    assert not [x for x in res.findings if x.code == "FSD103"] and "T5Block" in {u.cls for u in res.plan.units}


def test_fsd103_in_an_inline_fsdp_config_names_the_flag_at_the_launch_entry(cli, tmp_path):
    """A class misspelt in the launch command's `--fsdp_config '{...}'`: with the command in
    `[[tool.fsdp-lint.entry]]` the finding is at its `args` line; from `--`, at the line that parses argv."""
    inline = '{"transformer_layer_cls_to_wrap": ["T5Blok"], "version": 1}'
    (f,) = [f for f in _findings(cli, T5, "--", *LAUNCH, "--fsdp_config", inline) if f["code"] == "FSD103"]
    assert f["message"].startswith("`--fsdp_config` on the command line names `T5Blok`")
    assert "parse_args_into_dataclasses" in open(T5).read().splitlines()[f["line"] - 1]
    assert f["fix"] == "write `T5Block` instead of `T5Blok` in `--fsdp_config` on the command line"

    shutil.copytree(os.path.join(F, "hf_trainer"), tmp_path / "hf_trainer")
    shutil.copytree(CFG, tmp_path / "configs")
    args = shlex.join([*LAUNCH, "--fsdp_config", inline])
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.fsdp-lint]\nworld-size = 4\n\n[[tool.fsdp-lint.entry]]\npath = "hf_trainer/train_t5.py"\n'
        f"args = {json.dumps(args)}\n")
    res = cli("--output-format", "json", cwd=str(tmp_path))
    (f,) = [f for f in json.loads(res.out)["files"][0]["findings"] if f["code"] == "FSD103"]
    assert f["path"] == "pyproject.toml" and f["line"] == 6


def test_fsd103_in_training_arguments_points_at_the_kwarg_and_the_fix_edits_it(cli, tmp_path):
    path = tmp_path / "train_clm.py"
    before = open(os.path.join(F, "hf_trainer", "train_clm.py")).read().replace('["LlamaDecoderLayer"]',
                                                                                  '["LLaMADecoderLayer"]')
    path.write_text(before)
    hf = ("--hf-config", os.path.join(CFG, "tiny-llama"))
    (f,) = [f for f in _findings(cli, str(path), *hf) if f["code"] == "FSD103"]
    assert "LLaMADecoderLayer" in before.splitlines()[f["line"] - 1]
    assert f["message"].startswith('`fsdp_config={"transformer_layer_cls_to_wrap": [...]}` of `TrainingArguments` '
                                   "names `LLaMADecoderLayer`")
    cli(str(path), *hf, "--fix", "--unsafe-fixes", "--world-size", "4")
    assert path.read_text() == before.replace('["LLaMADecoderLayer"]', '["LlamaDecoderLayer"]')   # comment kept
    res = assert_framework_plan_matches(str(path), Settings(world_size=4, hf_config=hf[1]))
    assert not res.findings and [u.cls for u in res.plan.units].count("LlamaDecoderLayer") > 0


def test_fsd101_text_is_a_command_line_transformers_accepts(cli):
    """A size-based policy that wraps nothing: the fix is the `--fsdp --fsdp_config '{...}'` of transformers 5;
    launched with it, the real Trainer makes one unit per block and FSD101 is gone."""
    argv = [*LAUNCH, "--fsdp_config", '{"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100000000, '
                                      '"version": 1}']
    (f,) = [f for f in _findings(cli, T5, "--", *argv) if f["code"] == "FSD101"]
    assert f["fix"].startswith("make every T5Block a unit: pass `--fsdp --fsdp_config '") and "(transformers 5)" in f["fix"]
    suggested = shlex.split(f["fix"].split("`")[1])
    fixed = [a for a in argv[:-3]] + suggested
    res = assert_framework_plan_matches(T5, Settings(world_size=4), fixed)
    assert "FSD101" not in {x.code for x in res.findings} and "T5Block" in {u.cls for u in res.plan.units}


def test_fsd103_under_lightning_names_the_strategy_argument_and_the_fix_edits_it(cli, tmp_path):
    shutil.copytree(os.path.join(F, "lightning_gpt"), tmp_path / "lg")
    path = tmp_path / "lg" / "fabric_train.py"
    before = path.read_text().replace("import torch\n", "import torch\nimport torch.nn as nn\n", 1).replace(
        "        auto_wrap_policy={Block},\n",
        "        auto_wrap_policy={nn.TransformerDecoderLayer},   # copied from a tutorial\n")
    path.write_text(before)
    found = _findings(cli, str(path))
    (f,) = [f for f in found if f["code"] == "FSD103"]
    assert "auto_wrap_policy={nn.TransformerDecoderLayer}" in before.splitlines()[f["line"] - 1]
    assert "`FSDPStrategy(auto_wrap_policy={TransformerDecoderLayer})`" in f["detail"]
    # the whole-model unit it leaves speaks the strategy argument too, never torch's policy object
    (whole,) = [f for f in found if f["code"] == "FSD101"]
    said = " ".join(str(whole[k]) for k in ("message", "detail", "fix"))
    assert "FSDPStrategy(auto_wrap_policy={TransformerDecoderLayer})" in said and "ModuleWrapPolicy" not in said
    assert f["fix"] == "name the model's class: `FSDPStrategy(auto_wrap_policy={Block})`"
    cli(str(path), "--fix", "--unsafe-fixes", "--world-size", "4")
    assert path.read_text() == before.replace("={nn.TransformerDecoderLayer},   # copied", "={Block},   # copied")
    res = assert_framework_plan_matches(str(path), Settings(world_size=4))     # Fabric wraps every Block
    assert not {"FSD101", "FSD103"} & {x.code for x in res.findings}


def _transformers_major() -> int:
    from importlib.metadata import version

    return int(version("transformers").split(".")[0])


ON_TF4 = pytest.mark.skipif(_transformers_major() != 4, reason="transformers 4 is not what is installed (CI has 5; "
                            "the transformers-4 texts are unit-tested in test_frontend_texts_tf4.py)")
SIZE_CONFIG = '{"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100000000, "version": 1}'


@ON_TF4
@pytest.mark.parametrize("given", [
    # the size policy in an inline config: `--fsdp_transformer_layer_cls_to_wrap` beside it raises in 4.x
    ["--fsdp_config", SIZE_CONFIG],
    # the legacy size flag (Alpaca-era launch lines)
    ["--fsdp_min_num_params", "100000000"],
], ids=["inline-size-config", "min-num-params-flag"])
def test_fsd101_text_on_transformers_4_is_a_command_line_its_trainer_accepts(cli, given):
    """transformers 4.x: launched with the suggested flags (in place of the ones given) the real 4.x
    Trainer wraps every T5Block and FSD101 is gone."""
    argv = [*LAUNCH[:-1], "--fsdp", "full_shard auto_wrap", *given]
    (f,) = [f for f in _findings(cli, T5, "--", *argv) if f["code"] == "FSD101"]
    assert shlex.split(f["fix"].split("`")[1])[:2] == ["--fsdp", "full_shard auto_wrap"]
    assert "(transformers 5)" not in f["fix"]
    fixed = apply_flags(argv, f["fix"])
    res = assert_framework_plan_matches(T5, Settings(world_size=4), fixed)
    assert "FSD101" not in {x.code for x in res.findings} and "T5Block" in {u.cls for u in res.plan.units}
