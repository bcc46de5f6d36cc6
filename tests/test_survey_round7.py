"""Round 7 of the real-launch survey (benchmarks/realworld.md, "Round 7"): setup code that a simulated node
answered differently from a real one, on repositories new to the project.

Oracles: real torch (FSDP1 under the fake process group, via the replay with the real APIs) and real
transformers (the tokenizer's length, the resized embeddings)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

LATENT = os.path.join(REPO, "fixtures", "repos", "latent_tokens")
# a file whose plan is two Linear units and the root
TWO_UNITS = ("import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n"
             "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\nfor layer in model:\n    fully_shard(layer)\n"
             "fully_shard(model)\n")
CONFIGS = os.path.join(REPO, "fixtures", "frameworks", "configs")


@pytest.fixture
def in_latent(monkeypatch):
    monkeypatch.chdir(LATENT)
    monkeypatch.syspath_prepend(LATENT)
    yield
    for name in [n for n in sys.modules if n == "latent" or n.startswith("latent.")]:
        sys.modules.pop(name, None)


def _gpt2_with_tokenizer(folder) -> str:
    """A local GPT-2 folder: the tiny config and a byte-level tokenizer of the config's vocabulary size."""
    os.makedirs(folder)
    shutil.copy(os.path.join(CONFIGS, "tiny-gpt2", "config.json"), folder)
    size = json.load(open(os.path.join(CONFIGS, "tiny-gpt2", "config.json")))["vocab_size"]
    vocab = {f"t{i}": i for i in range(size - 1)}
    vocab["<|endoftext|>"] = size - 1
    with open(os.path.join(folder, "vocab.json"), "w") as fh:
        json.dump(vocab, fh)
    with open(os.path.join(folder, "merges.txt"), "w") as fh:
        fh.write("#version: 0.2\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, fh)
    return str(folder)


def test_a_tokenizer_that_is_not_here_and_decides_the_wrapped_model_is_refused(cli):
    # the latent markers' ids come from the tokenizer and go into the wrapper the wrap is given: with the
    # tokenizer skipped, the replay planned the bare LM (the wrapper's statement failed on the unbound id)
    # and a vocabulary a node never trains
    res = cli("run.py", "--hf-config", os.path.join(CONFIGS, "tiny-llama"), "--world-size", "4", "--",
              "args/latent.yaml", cwd=LATENT)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert line.startswith("fsdp-lint: error: run.py:31: "), line
    assert "no tokenizer for 'org/latent-llama' here, and fsdp-lint never downloads" in line
    assert line.endswith("what it computes decides the wrap's arguments, so it is not skipped"), line
    assert "Traceback" not in res.err


def test_an_empty_tokenizer_built_from_a_config_alone_is_no_tokenizer(cli):
    # transformers 5 builds GPT-2's tokenizer class with no vocabulary when no tokenizer file is found
    # (`len()` 1): a helper's `resize_token_embeddings(len(tokenizer))` then shrank the embeddings to four
    # rows. The helper works on the model, so it is not skipped after the tokenizer is: the tokenizer is named
    res = cli("sft.py", "--hf-config", os.path.join(CONFIGS, "tiny-gpt2"), "--world-size", "4", "--",
              "--model", "org/latent-gpt2", cwd=LATENT)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "sft.py:28: setup code failed on the meta device: no tokenizer for 'org/latent-gpt2'" \
        in line, line
    assert "(no vocabulary file)" in line
    assert "what it would have set up was used later: sft.py:30: " in line, line


def test_with_the_tokenizer_here_the_resized_vocabulary_is_planned_as_torch_builds(in_latent, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from latent.vocab import LATENT_TOKENS

    folder = _gpt2_with_tokenizer(tmp_path / "gpt2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(LATENT_TOKENS)
    real = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    real.resize_token_embeddings(len(tokenizer))

    res, _ = assert_plan_matches_torch(os.path.join(LATENT, "sft.py"), 4, argv=["--model", folder])
    shapes = {name: tuple(p.shape) for name, p in res.tree.params.items()}
    assert shapes == {name: tuple(p.shape) for name, p in real.named_parameters()}
    assert shapes["transformer.wte.weight"][0] == len(tokenizer)
    assert [u.modules for u in res.plan.units] == [["transformer.h.0"], ["transformer.h.1"], [""]]


def test_with_the_tokenizer_here_the_latent_wrapper_is_the_model_torch_wraps(in_latent, tmp_path):
    config = tmp_path / "latent.yaml"
    config.write_text(f"model_id: {os.path.join(CONFIGS, 'tiny-llama-local')}\nlatent: true\nbf16: true\n")
    res, _ = assert_plan_matches_torch(os.path.join(LATENT, "run.py"), 4, argv=[str(config)])
    assert res.tree.root_class == "LatentLM"
    assert res.plan.units[-1].modules == [""] and len(res.plan.units) > 1
    assert not res.skipped_statements, res.skipped_statements


EMBED = os.path.join(REPO, "fixtures", "repos", "embed_mixture")


def test_a_loop_over_the_data_files_builds_the_mixture_the_trainer_is_given(monkeypatch):
    # `for file in data_files: ... train_ds.append(load_dataset("json", data_files=file))`, then one
    # concatenation per kind: the loop builds the data set mixture (setup), it is no loop over the data.
    # Taken for a data loop and left out, the concatenation of nothing failed and the Trainer had no data set.
    # The real Trainer under the fake process group is the oracle
    from fsdp_lint.config import Settings
    from test_frameworks import assert_framework_plan_matches

    monkeypatch.chdir(EMBED)
    monkeypatch.syspath_prepend(os.path.join(EMBED, "src"))
    argv = ["--model_name_or_path", os.path.join(CONFIGS, "tiny-llama-local"), "--train_data", "toy_data",
            "--output_dir", "out", "--fsdp", "full_shard auto_wrap", "--fsdp_config", "configs/fsdp.json",
            "--report_to", "none"]
    try:
        res = assert_framework_plan_matches(os.path.join(EMBED, "src", "embedmix", "run.py"), Settings(world_size=4),
                                            argv)
    finally:
        for name in [n for n in sys.modules if n == "embedmix" or n.startswith("embedmix.")]:
            sys.modules.pop(name, None)
    assert not res.skipped_statements, res.skipped_statements
    assert len(res.plan.units) > 1 and res.plan.units[-1].modules == [""]
    assert not os.path.exists(os.path.join(EMBED, "out"))


@pytest.mark.parametrize("loop,over_data", [
    ("for file in data_files:", False),                         # the files of a mixture: setup
    ("for name in data_args.dataset_names:", False),
    ("for path in sorted(data_paths):", False),
    ("for batch in train_loader:", True),                       # the data itself: never run
    ("for sample in dataset:", True),
    ("for row in train_data:", True),
])
def test_which_loops_before_the_wrap_are_loops_over_the_data(loop, over_data):
    from fsdp_lint.entry.source import parse_source

    text = f"import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n{loop}\n    print(1)\n" \
           "fully_shard(nn.Linear(2, 2))\n"
    assert (4 in parse_source("train.py", text).dropped_loop_lines) is over_data


FABRIC_JOINT = os.path.join(REPO, "fixtures", "repos", "fabric_joint")


def test_lightnings_launcher_in_a_launch_script_is_the_launch(tmp_path, monkeypatch):
    # `lightning run model [OPTIONS] FILE` (Lightning 2.0) and `fabric run [OPTIONS] FILE` (2.1+): the
    # world is --devices x --num-nodes, and the processes get the launcher's environment as its
    # `_set_env_variables` sets it; what the script exports reaches the process, what it only sets does not
    from fsdp_lint.entry.shell import shell_launches

    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "train_mdm.py").write_text("")
    script = tmp_path / "pretrain.sh"
    script.write_text('''#!/bin/bash
export WANDB_PROJECT=scaling
export WANDB_MODE=online HF_HUB_OFFLINE=0
RUN_NAME=debug
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
export MASTER_ADDR=$(scontrol show hostnames | head -n 1)
lightning run model \\
    --node-rank=0  \\
    --accelerator=cuda \\
    --devices=8 \\
    --num-nodes=2 \\
    pretrain/train_mdm.py --model 170 --flops 10.
MODEL_SIZE=1b fabric run --devices 4 --precision bf16-mixed pretrain/train_mdm.py --model 1028
lightning run app app.py
''')
    monkeypatch.chdir(tmp_path)
    old, new = shell_launches(str(script))
    assert (old.path, old.args, old.world_size) == (str(tmp_path / "pretrain" / "train_mdm.py"),
                                                    ["--model", "170", "--flops", "10."], 16)
    assert old.env == {"WANDB_PROJECT": "scaling", "LT_CLI_USED": "1", "LT_DEVICES": "8", "LT_NUM_NODES": "2",
                       "LT_ACCELERATOR": "cuda"}
    assert (new.world_size, new.args) == (4, ["--model", "1028"])
    assert new.env == {"WANDB_PROJECT": "scaling", "MODEL_SIZE": "1b", "LT_CLI_USED": "1", "LT_DEVICES": "4",
                       "LT_NUM_NODES": "1", "LT_PRECISION": "bf16-mixed"}


def _launch_script(tmp_path, line: str) -> str:
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/bash\ncd {FABRIC_JOINT}\n{line}\n")
    return str(script)


def test_a_fabric_script_launched_by_lightnings_cli_plans_for_the_cli_world(cli, tmp_path):
    # the script never calls `fabric.launch()`: on a node it runs only under the CLI, which the launch
    # script names; the world is the CLI's (8 devices x 2 nodes), as Lightning's own connector reads it
    script = _launch_script(tmp_path, "lightning run model --accelerator=cuda --devices=8 --num-nodes=2 "
                                      "pretrain/tinyllama_like.py --devices 8")
    res = cli(script, "--format", "json", cwd=FABRIC_JOINT)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 16 and f["plan"]["framework"] == "lightning"
    assert {u["param_dtype"] for u in f["plan"]["units"]} == {"bfloat16"}
    assert os.environ.get("LT_CLI_USED") is None


def test_a_cli_flag_that_conflicts_with_the_scripts_fabric_argument_is_refused_as_lightning_refuses_it(cli, tmp_path):
    # `fabric run --precision 16-mixed` over `Fabric(precision="bf16-mixed")`: Lightning's connector raises
    # on the node; before, the launcher's flags never reached the replay and the script's value was planned
    script = _launch_script(tmp_path, "fabric run --devices 8 --precision 16-mixed pretrain/tinyllama_like.py "
                                      "--devices 8")
    res = cli(script, cwd=FABRIC_JOINT)
    assert res.code == 2, res.out
    assert "conflicts with the value `--precision=16-mixed` set through the CLI" in res.err, res.err


SFT_ENGINE = os.path.join(REPO, "fixtures", "repos", "sft_engine")
SFT_ARGS = ["4", os.path.join(CONFIGS, "tiny-llama-local")]


def test_a_failure_in_a_wrap_helper_under_hydra_is_named_where_it_is_not_as_a_skipped_data_set(cli):
    # `_no_split_modules` is a set in transformers 5 and the helper indexes it: a node fails there too. The
    # error names the helper's line (the replay's Hydra shim on the stack is passed through, not taken for
    # the end of the user's code) and not the data set skipped before: only the frame where it failed
    # links a failure to a skipped statement, not an outer trainer that holds the data set
    res = cli("examples/run_sft.sh", "--", *SFT_ARGS, cwd=SFT_ENGINE)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "sftkit/utils/fsdp.py:14: setup code failed on the meta device: TypeError: 'set' object is not " \
           "subscriptable" in line, line
    assert "sft_dataset" not in line, line


def test_a_data_set_whose_files_are_not_here_has_a_length_and_its_loaders_are_built(cli):
    # the parquet files are not here (a node has them after preprocessing): `__len__` of the project's
    # Dataset fails on what the skipped read would have set, and a DistributedSampler, a DataLoader and the
    # schedule's `len(loader)` were all skipped after it; the length stands in, so they are built as on a node
    res = cli("examples/run_sft.sh", "--format", "json", "--", *SFT_ARGS,
              "+model.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[LlamaDecoderLayer]", cwd=SFT_ENGINE)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["modules"] for u in f["plan"]["units"]] == [[f"model.layers.{i}"] for i in range(4)] + [[""]]
    assert {u["param_dtype"] for u in f["plan"]["units"]} == {"bfloat16"}
    skipped = f["replay"]["skipped_statements"]
    assert {s["path"] for s in skipped} == {"sftkit/data/sft_dataset.py"}, skipped
    assert skipped[0]["error"].startswith("FileNotFoundError: ") and "train.parquet" in skipped[0]["error"]
    assert any("its data set's length stands in as 65536" in s["error"] for s in skipped)


def test_a_guard_that_returns_before_the_wrap_is_kept(cli, tmp_path):
    # `if cfg.get("ddp_only"): return model` before the wrap: left out of the setup slice, the replay
    # wrapped a model the script returns unwrapped
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n\n"
        "def build(cfg):\n    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\n"
        "    if cfg.get('ddp_only'):\n        return model\n    for layer in model:\n        fully_shard(layer)\n"
        "    fully_shard(model)\n    return model\n\n\nmodel = build({'ddp_only': True})\n")
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert "the wrap code in train.py did not run with these arguments" in res.out, res.out


@pytest.mark.parametrize("loop", ["for data in tqdm(self.train_dataloader, desc='epoch'):",
                                  "for step, batch in enumerate(loader):",
                                  "for epoch in range(start_epoch, cfg.total_epochs):"])
def test_a_loop_over_a_loader_or_epochs_inside_a_call_is_a_training_loop(loop):
    from fsdp_lint.entry.source import parse_source

    text = f"import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n{loop}\n    print(1)\n" \
           "fully_shard(nn.Linear(2, 2))\n"
    assert 4 in parse_source("train.py", text).dropped_loop_lines


JACOBI = os.path.join(REPO, "fixtures", "repos", "jacobi_trainer")


def test_a_trainer_on_trajectories_not_generated_here_plans_as_the_trainer_builds(monkeypatch):
    # `--data_path data/trajectories.json` names the data set a previous step generates: missing here, it is
    # missing data (skipped), not a wrong launch as a missing `--config` file is; the Trainer subclass's own
    # `get_train_dataloader` over the empty data set gets the one-sample loader the base class's gets; and
    # `--report_to wandb` without wandb installed here is a logger that does nothing (a node's logs the run)
    import importlib.util

    from fsdp_lint.config import Settings
    from test_frameworks import assert_framework_plan_matches

    monkeypatch.chdir(JACOBI)
    monkeypatch.syspath_prepend(JACOBI)
    argv = ["--target_model_path", os.path.join(CONFIGS, "tiny-llama-local"), "--data_path", "data/trajectories.json",
            "--output_dir", "out", "--bf16", "True", "--report_to", "wandb", "--do_train",
            "--per_device_train_batch_size", "1", "--fsdp", "full_shard auto_wrap",
            "--fsdp_config", '{"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}']
    try:
        res = assert_framework_plan_matches(os.path.join(JACOBI, "jacobi", "train.py"), Settings(world_size=4), argv)
    finally:
        for name in [n for n in sys.modules if n == "jacobi" or n.startswith("jacobi.")]:
            sys.modules.pop(name, None)
    assert res.plan.units[-1].modules == [""] and len(res.plan.units) > 1
    assert res.skipped_statements[0].error.startswith("FileNotFoundError") and \
        "trajectories.json" in res.skipped_statements[0].error
    if importlib.util.find_spec("wandb") is None:
        assert any("report_to: WandbCallback needs a package not installed here" in n for n in res.notes), res.notes
    assert not os.path.exists(os.path.join(JACOBI, "out"))


def test_a_config_file_named_in_the_arguments_that_is_not_here_is_still_the_launchs_error(cli, tmp_path):
    # the data flag is the exception: a config the script is pointed at decides the plan
    (tmp_path / "train.py").write_text(
        "import argparse\nimport json\nimport torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--config')\np.add_argument('--data_path')\n"
        "args = p.parse_args()\ncfg = json.load(open(args.config))\n"
        "model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(cfg['layers'])])\nfully_shard(model)\n")
    res = cli("train.py", "--", "--config", "configs/missing.json", "--data_path", "data/train.json", cwd=str(tmp_path))
    assert res.code == 2
    assert "`configs/missing.json`, named in the script's arguments, cannot be read" in res.err, res.err


def test_a_fabric_run_logged_to_wandb_without_wandb_here_plans_as_lightning_builds(monkeypatch):
    # `WandbLogger(...)` refuses to be built without wandb ("Requirement 'wandb>=0.12.10' not met") where a
    # node with the project's environment logs the run: the logger stands in as Lightning's DummyLogger
    # and the plan is the one real Lightning builds for the same launch
    import importlib.util

    from fsdp_lint.config import Settings
    from test_frameworks import assert_framework_plan_matches

    monkeypatch.chdir(FABRIC_JOINT)
    res = assert_framework_plan_matches(os.path.join(FABRIC_JOINT, "pretrain", "mdm_like.py"), Settings(world_size=8))
    assert res.plan.framework == "lightning" and res.plan.world_size == 8
    if importlib.util.find_spec("wandb") is None:
        assert any(n.startswith("WandbLogger needs a package not installed here") for n in res.notes), res.notes
    assert not os.path.exists(os.path.join(FABRIC_JOINT, "workdir"))


RUN_FOLDER_SCRIPT = '''
import argparse
import logging
import os

import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def setup_run(args):
    log_path = os.path.join(args.logs, args.name, "out.log")
    if os.path.exists(log_path):
        raise ValueError(f"Experiment {log_path} already exists. Use --name to specify a new experiment.")
    os.makedirs(os.path.join(args.logs, args.name, "checkpoints"), exist_ok=True)
    logging.getLogger().addHandler(logging.FileHandler(log_path))
    with open(os.path.join(args.logs, args.name, "params.txt"), "w") as f:
        f.write(repr(vars(args)))
    with open("latest_run.txt", "w") as f:
        f.write(args.name)
    return args


parser = argparse.ArgumentParser()
parser.add_argument("--name", default="tiny")
parser.add_argument("--logs", default="logs")
parser.add_argument("--width", type=int, default=8)
args = setup_run(parser.parse_args())
model = nn.Sequential(nn.Linear(args.width, args.width), nn.Linear(args.width, args.width))
for layer in model:
    fully_shard(layer)
fully_shard(model)
'''


def test_what_the_setup_writes_is_gone_when_the_lint_ends_and_the_next_lint_plans_the_same(cli, tmp_path):
    # a run folder with its log and arguments (open_lm's `logs/<name>/out.log`, `params.txt`): left behind,
    # the second lint stopped on the script's own "Experiment ... already exists"; a file the setup rewrites
    # gets its content back
    (tmp_path / "train.py").write_text(RUN_FOLDER_SCRIPT)
    (tmp_path / "latest_run.txt").write_text("the user's last run\n")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    first = cli("train.py", "--world-size", "2", "--no-cache", "--format", "json", "--", "--name", "tiny",
                cwd=str(tmp_path))
    assert first.code in (0, 1), first.err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "latest_run.txt").read_text() == "the user's last run\n"
    second = cli("train.py", "--world-size", "2", "--no-cache", "--format", "json", "--", "--name", "tiny",
                 cwd=str(tmp_path))
    assert second.code == first.code, second.err
    units = [[u["modules"] for u in json.loads(r.out)["files"][0]["plan"]["units"]] for r in (first, second)]
    assert units[0] == units[1] == [["0"], ["1"], [""]]


PROBE_HELPERS = os.path.join(REPO, "fixtures", "repos", "probe_helpers")


def test_a_missing_package_that_decides_a_wrap_in_another_module_is_refused(cli):
    # `cfg.param_dtype = torch.bfloat16 if gpu_supports_bf16() else torch.float32` in the entry, the wrap in
    # trainer/parallel.py's `setup_fsdp(model, cfg)` reading `cfg.param_dtype`: the probe fails on the
    # stand-in for the package it needs, and skipping it planned float32 where a node with the package runs
    # bf16 (noted as "not used by the model"). The imported helper's wrap sites make its arguments deciding
    res = cli("trainer/train.py", "--world-size", "4", cwd=PROBE_HELPERS)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "trainer/env.py:9: " in line and "`nvversions` is not installed here: pip install nvversions" in line, line
    assert "decides the wrap's arguments (train.py:24)" in line, line


def test_with_the_package_the_helper_wraps_in_bf16_as_torch_builds(tmp_path, monkeypatch):
    from test_causes import install_fake_nvversions

    install_fake_nvversions(tmp_path, monkeypatch)
    monkeypatch.syspath_prepend(PROBE_HELPERS)
    monkeypatch.chdir(PROBE_HELPERS)
    try:
        res, _ = assert_plan_matches_torch(os.path.join(PROBE_HELPERS, "trainer", "train.py"), 4)
    finally:
        for name in [n for n in sys.modules if n in ("trainer", "nvversions") or n.startswith(("trainer.", "nvversions."))]:
            sys.modules.pop(name, None)
    assert {u.param_dtype for u in res.plan.units} == {"bfloat16"}
    assert [u.modules for u in res.plan.units] == [[f"blocks.{i}"] for i in range(4)] + [[""]]


def test_run_on_a_launch_of_many_nodes_is_refused_before_it_starts_them(cli, tmp_path):
    # `--run` runs as many ranks as the launch it followed: 512 nodes of 8 is no session this machine runs
    # (each CPU rank is a process); one line saying so and how to ask for a smaller one, nothing started
    (tmp_path / "train.py").write_text(TWO_UNITS)
    (tmp_path / "run.sh").write_text("torchrun --nnodes 512 --nproc_per_node 8 train.py\n")
    res = cli("run.sh", "--run", "--device", "cpu", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = next(ln for ln in res.err.splitlines() if ln.startswith("fsdp-lint: error: --run:"))
    assert "4096 ranks on this machine's CPUs take about" in line and "pass --nproc N" in line, line


EMBED_PKG = os.path.join(REPO, "fixtures", "repos", "embed_pkg")


def test_a_module_launched_from_inside_a_package_runs_as_the_launch_names_it(cli, monkeypatch):
    # `cd embedkit && torchrun -m training.run`: on a node `training` is a top-level namespace package of the
    # folder the launch runs in (its `from training.arguments import ...` resolves there), and the
    # enclosing `embedkit/__init__.py` -- which needs the `_version.py` an install writes -- never runs. It
    # was replayed as `embedkit.training.run` from the repository root. The `cd` is read from where
    # `bash scripts/train.sh` runs, as bash does
    from fsdp_lint.entry.shell import shell_launches

    monkeypatch.chdir(EMBED_PKG)
    [launch] = shell_launches("scripts/train.sh")
    assert launch.module == ("training.run", os.path.join(EMBED_PKG, "embedkit"))
    res = cli("scripts/train.sh", "--format", "json", cwd=EMBED_PKG)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["modules"] for u in f["plan"]["units"]] == [[f"layers.{i}"] for i in range(6)] + [[""]]
    assert f["replay"]["skipped_statements"] == [] and f["notes"] == []


def test_a_launch_on_every_gpu_of_the_node_is_the_simulated_nodes_gpus(cli, tmp_path, monkeypatch):
    # `--nproc_per_node gpu` (torchrun's own), `$(nvidia-smi -L | wc -l)` and `torch.cuda.device_count()` in
    # the launch line count the node's GPUs: the world is --gpus-per-node of each node
    from fsdp_lint.entry.shell import shell_launches

    (tmp_path / "train.py").write_text(TWO_UNITS)
    (tmp_path / "run.sh").write_text(
        "NGPUS=$(nvidia-smi -L | wc -l)\n"
        "torchrun --standalone --nproc_per_node=$NGPUS train.py\n"
        "torchrun --nnodes 2 --nproc-per-node=gpu train.py\n"
        "torchrun --nproc-per-node $(python -c 'import torch; print(torch.cuda.device_count())') train.py\n")
    monkeypatch.chdir(tmp_path)
    assert [(s.world_size, s.every_gpu_of) for s in shell_launches("run.sh")] == [(None, 1), (None, 2), (None, 1)]
    res = cli("run.sh", "--gpus-per-node", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert [f["plan"]["world_size"] for f in json.loads(res.out)["files"]] == [4, 8, 4]


def test_a_wrap_from_a_module_the_installed_torch_does_not_have_names_it(cli, tmp_path):
    # `from torch.distributed._fsdp import FullyShardedDataParallel` (the 2021 prototype): torch is installed,
    # the module is not in it; "pip install torch" was the hint
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed._fsdp import FullyShardedDataParallel as FSDP\n\n"
        "model = FSDP(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)))\n")
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "`torch.distributed._fsdp` is not in the installed torch " in line, line
    assert "pip install" not in line, line


def _assert_two_units_noting(cli, tmp_path, package: str) -> None:
    """train.py in `tmp_path` plans its two Linear units and the root, with a note naming `package`."""
    res = cli("train.py", "--world-size", "2", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["modules"] for u in f["plan"]["units"]] == [["0"], ["1"], [""]]
    assert any(package in n for n in f["notes"]), f["notes"]


def test_a_profiler_context_from_a_package_not_installed_is_a_context_that_does_nothing(cli, tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\nfrom gpu_tracer import trace_range\n\n"
        "with trace_range('build'):\n    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\n"
        "    for layer in model:\n        fully_shard(layer)\n    fully_shard(model)\n")
    _assert_two_units_noting(cli, tmp_path, "gpu_tracer")


def test_an_import_inside_a_function_of_a_package_not_installed_gets_a_stand_in(cli, tmp_path):
    # `def setup_logger(): from loguru_x._logger import Core` (a lazy import in the project's own logging
    # helper): its ModuleNotFoundError was skipped with the statement, `logger` stayed unbound, and the
    # `with logger.contextualize(...)` block holding the model and its wrap was skipped whole (no wrap ran).
    # Inside a function the import gets a stand-in as a module-level one does, a context that does nothing
    (tmp_path / "logs.py").write_text(
        "def setup_logger(level):\n    from loguru_x._logger import Core, Logger\n\n"
        "    return Logger(core=Core(), level=level)\n")
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\nfrom logs import setup_logger\n\n"
        "def main():\n    logger = setup_logger('info')\n    with logger.contextualize(rank=0):\n"
        "        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\n"
        "        for layer in model:\n            fully_shard(layer)\n        fully_shard(model)\n"
        "    logger.info(model)\n\n\nmain()\n")
    _assert_two_units_noting(cli, tmp_path, "loguru_x")


def test_a_launch_whose_world_is_a_variable_nothing_sets_says_what_it_planned_for(cli, tmp_path):
    # `torchrun --nnodes=$nnodes --nproc_per_node=$nproc_per_node ...` in a script its README says to edit
    # first: the plan is for --world-size (8 by default), and the report says why, not silently
    (tmp_path / "train.py").write_text(TWO_UNITS)
    (tmp_path / "run.sh").write_text("set -x\ntorchrun --nnodes=$nnodes --nproc_per_node=$nproc_per_node train.py \"$@\"\n")
    res = cli("run.sh", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 8
    assert f["notes"][0] == ("the launch's world is `$nproc_per_node`, which run.sh does not set: planned for world "
                             "size 8 (pass --world-size, or set it in the script)"), f["notes"]
    res = cli("run.sh", "--world-size", "16", "--format", "json", cwd=str(tmp_path))
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 16 and not any("does not set" in n for n in f["notes"])


def test_a_trainer_subclass_loader_that_fails_over_data_that_is_here_is_reported(cli, tmp_path):
    # the loader is the project's own and its data is here (rows, not stand-ins): its failure is the
    # script's, as on a node -- not skipped to a one-sample loader as a data set that is not here is
    repo = shutil.copytree(JACOBI, tmp_path / "jacobi_trainer")
    trainer = repo / "jacobi" / "trainer.py"
    trainer.write_text(trainer.read_text().replace('"shuffle": True,', '"shuffle": True, "workers": 1 / 0,'))
    (repo / "data" / "trajectories.json").write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    res = cli("scripts/train.sh", "--", os.path.join(CONFIGS, "tiny-llama-local"), "data/trajectories.json", "out",
              cwd=str(repo))
    assert res.code == 2, res.out
    assert "jacobi/trainer.py:11: setup code failed on the meta device: ZeroDivisionError" in res.err, res.err


def test_a_missing_module_of_the_projects_package_used_by_the_model_is_not_a_pip_install(cli, tmp_path):
    # `from lm.modeling_v2 import GPT` at module level, `lm` being the project's own package: the hint was
    # "pip install lm"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "__init__.py").write_text("")
    (tmp_path / "train.py").write_text(
        "from torch.distributed.fsdp import fully_shard\nfrom lm.modeling_v2 import GPT\n\nfully_shard(GPT())\n")
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "the project has no module `lm.modeling_v2` (its package `lm` is here, that module is not)" in line, line
    assert "pip install" not in line, line


def test_a_trainer_subclass_loader_over_a_data_set_whose_files_are_not_here_gets_the_one_sample_loader(cli, tmp_path):
    # the project's Dataset reads its file in __init__ (not here: its length stands in) and the subclass's
    # loader reads a first row to size its buckets: that failure follows from the missing data, not the script
    repo = shutil.copytree(JACOBI, tmp_path / "jacobi_trainer")
    train = repo / "jacobi" / "train.py"
    train.write_text(train.read_text().replace(
        '''    train_json = json.load(open(trajectory_path, "r"))
    rows = []
    for data in train_json:
        rows.append(data)
    return dict(train_dataset=TrajectoryDataset(rows), eval_dataset=None)''',
        '''    return dict(train_dataset=TrajectoryFile(trajectory_path), eval_dataset=None)


class TrajectoryFile(TrajectoryDataset):
    def __init__(self, path):
        self.rows = json.load(open(path, "r"))'''))
    trainer = repo / "jacobi" / "trainer.py"
    trainer.write_text(trainer.read_text().replace(
        '"shuffle": True,', '"shuffle": True, "drop_last": len(self.train_dataset[0]) > 1,'))
    res = cli("scripts/train.sh", "--format", "json", "--", os.path.join(CONFIGS, "tiny-llama-local"),
              "data/trajectories.json", "out", cwd=str(repo))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert len(f["plan"]["units"]) > 1
    assert any("its data set's length stands in" in s["error"] for s in f["replay"]["skipped_statements"])
