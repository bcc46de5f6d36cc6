"""`fsdp-lint scripts/run.sh`: the launch lines of a shell script (torchrun / accelerate launch / python,
`\\` continuations, `VAR=...` assignments) are linted as the launched file with those arguments and that
world size, and a finding about a flag points at the script line that sets it. The oracle is the real
HF Trainer (transformers + accelerate under the fake process group, tests/test_frameworks.py)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from fsdp_lint.config import Settings
from fsdp_lint.entry.shell import shell_launches
from test_frameworks import CFG, F, assert_framework_plan_matches

REPO_FIXTURE = os.path.join(F, "hf_launch")


def test_launch_lines_are_read_as_the_shell_would(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pretrain.py").write_text("")
    (tmp_path / "finetune.py").write_text("")
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "launch.sh"
    script.write_text('''#!/bin/bash
export NNODES=2
GPUS=${GPUS_PER_NODE:-4}
CFG="configs/fsdp.yaml"   # accelerate's
# torchrun --nproc_per_node 1 finetune.py  (a comment, not a launch)
CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nnodes=$NNODES --nproc-per-node ${GPUS} \\
    --rdzv_backend c10d src/pretrain.py \\
    --lr 3e-4 \\
    --name "run one"
accelerate launch --config_file $CFG --num_processes 16 finetune.py --epochs 1
python -m torch.distributed.run --standalone --nproc_per_node=2 finetune.py
python finetune.py --debug
''')
    monkeypatch.chdir(tmp_path)
    first, acc, dist_run, plain = shell_launches(str(script))
    assert (first.path, first.args, first.world_size, first.line) == (
        str(tmp_path / "src" / "pretrain.py"), ["--lr", "3e-4", "--name", "run one"], 8, 6)
    assert first.arg_lines == [8, 8, 9, 9] and first.cwd == str(tmp_path)
    assert (acc.world_size, acc.accelerate_config, acc.args) == (16, str(tmp_path / "configs" / "fsdp.yaml"),
                                                                ["--epochs", "1"])
    assert (dist_run.world_size, dist_run.path) == (2, str(tmp_path / "finetune.py"))
    assert (plain.world_size, plain.args) == (None, ["--debug"])


def test_an_argument_block_over_several_lines_gives_its_words_as_bash_does(tmp_path, monkeypatch):
    """``MODEL_ARGS="\\`` then one flag per line and a closing ``"`` (a quoted word over several lines),
    used unquoted after the launched file: bash splits the value into one word per flag; quoted
    (``"$NAME"``) it stays one word, and ``"$@"`` of a script run without arguments gives none. The
    block's own ``#`` is a flag's text, not a comment. It was "No closing quotation"."""
    (tmp_path / "main_training_llama.py").write_text("")
    script = tmp_path / "train.sh"
    script.write_text('''#!/bin/bash
NAME="llama 7b"
MODEL_ARGS="\\
--use_dummy_dataset=True
--data_path=/lustre/tokens
--tag=run#2
--sharding_strategy=hsdp
"

torchrun \\
    --nnodes=2 \\
    --nproc_per_node=8 \\
    main_training_llama.py \\
    ${MODEL_ARGS} --name "$NAME" "$@"
''')
    monkeypatch.chdir(tmp_path)
    (launch,) = shell_launches(str(script))
    assert launch.args == ["--use_dummy_dataset=True", "--data_path=/lustre/tokens", "--tag=run#2",
                           "--sharding_strategy=hsdp", "--name", "llama 7b"]
    assert launch.world_size == 16 and launch.line == 10
    (again,) = shell_launches(str(script), ["--batch_size=4"])
    assert again.args[-1] == "--batch_size=4"
    # bash itself, with torchrun printing the words it is given
    import subprocess

    shown = tmp_path / "shown.sh"
    shown.write_text("torchrun() { printf '%s\\n' \"$@\"; }\n" + script.read_text())
    words = subprocess.run(["bash", str(shown)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[words.index("main_training_llama.py") + 1:] == launch.args


def test_a_launch_in_an_environment_runner_or_handed_to_a_job_submitter_is_the_launch(tmp_path, monkeypatch):
    """``uv run --extra gpu torchrun ...`` runs torchrun in the project's environment (``srun OPTIONS
    torchrun ...`` on the cluster's nodes), and a submission
    tool given the command after ``--`` (``uv run python submit.py --gpus 8 -- torchrun ... train.py``)
    runs that command on the node: both are the launch (neither was one: "no launch of a Python file")."""
    (tmp_path / "open_trainer").mkdir()
    (tmp_path / "open_trainer" / "dpo.py").write_text("")
    (tmp_path / "submit.py").write_text("")
    script = tmp_path / "multi_node.sh"
    script.write_text('''#!/bin/bash
EXP=dpo-debug
uv run --extra gpu --python 3.11 torchrun --nproc_per_node=4 open_trainer/dpo.py --exp_name "$EXP"
uv run python submit.py \\
    --cluster ai2/big \\
    --env 'TORCH_LOGS=recompiles' \\
    --gpus 8 -- torchrun \\
    --nnodes=2 \\
    --node_rank=\\$REPLICA_RANK \\
    --nproc_per_node=8 \\
    open_trainer/dpo.py \\
    --exp_name "$EXP" --seed 123
conda run -n train python open_trainer/dpo.py --debug
srun --nodes 2 --ntasks-per-node=1 -c 32 torchrun --nnodes 2 --nproc_per_node 8 open_trainer/dpo.py --multi
''')
    monkeypatch.chdir(tmp_path)
    runner, submitted, conda, slurm = shell_launches(str(script))
    dpo = str(tmp_path / "open_trainer" / "dpo.py")
    assert (runner.path, runner.args, runner.world_size) == (dpo, ["--exp_name", "dpo-debug"], 4)
    assert (submitted.path, submitted.args, submitted.world_size) == (dpo, ["--exp_name", "dpo-debug", "--seed", "123"], 16)
    assert submitted.arg_lines == [12, 12, 12, 12]
    assert (conda.path, conda.args) == (dpo, ["--debug"])
    assert (slurm.path, slurm.args, slurm.world_size) == (dpo, ["--multi"], 16)     # srun's options are its own


def test_a_script_without_a_launch_is_one_line_and_exit_2(cli, tmp_path):
    script = tmp_path / "setup.sh"
    script.write_text("pip install -r requirements.txt\n")
    res = cli(str(script))
    assert res.code == 2 and "no launch of a Python file in it" in res.err and len(res.err.splitlines()) == 1
    script.write_text("torchrun --nproc_per_node 8 missing_train.py --lr 1\n")
    res = cli(str(script))
    assert res.code == 2 and "line 1 launches missing_train.py, which is not there" in res.err
    assert " has " not in res.err                   # nothing of a close name to point at
    # a script left behind by a rename: the files of a close name are named
    (tmp_path / "main_training_llama.py").write_text("")
    (tmp_path / "main_training_mamba.py").write_text("")
    script.write_text("torchrun --nproc_per_node 8 main_training.py --lr 1\n")
    res = cli(str(script), cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert res.err.splitlines()[0].endswith("; the current folder has main_training_llama.py, main_training_mamba.py")


def _copy(tmp_path):
    repo = tmp_path / "hf_launch"
    shutil.copytree(REPO_FIXTURE, repo)
    shutil.copytree(CFG, tmp_path / "configs")
    return repo


def test_fsd103_for_a_flag_in_the_launch_script_points_at_its_line_and_the_fix_edits_it(cli, tmp_path, monkeypatch):
    """torchrun on 8 ranks with `--fsdp_config` naming `${LAYER_CLS}`: FSD103 is at the script's
    `LAYER_CLS=...` line, in the script's words, on 8 ranks; `--fix --unsafe-fixes` edits that line, and the
    real Trainer launched with the fixed script's arguments wraps every LlamaDecoderLayer."""
    repo = _copy(tmp_path)
    script = repo / "scripts" / "run.sh"
    before = script.read_text()
    res = cli("scripts/run.sh", "--output-format", "json", cwd=str(repo))
    assert res.code == 1, res.err
    (doc,) = json.loads(res.out)["files"]
    assert doc["plan"]["world_size"] == 8 and os.path.basename(doc["path"]) == "train.py"
    (f,) = [f for f in doc["findings"] if f["code"] == "FSD103"]
    assert f["path"] == "scripts/run.sh" and f["line"] == before.splitlines().index("LAYER_CLS=LLaMADecoderLayer") + 1
    assert f["message"].startswith("`--fsdp_config` in run.sh names `LLaMADecoderLayer`")
    assert f["fix"] == "write `LlamaDecoderLayer` instead of `LLaMADecoderLayer` in `--fsdp_config` in run.sh"
    res = cli("scripts/run.sh", "--fix", "--unsafe-fixes", cwd=str(repo))
    assert script.read_text() == before.replace("LAYER_CLS=LLaMADecoderLayer", "LAYER_CLS=LlamaDecoderLayer")
    monkeypatch.chdir(repo)
    (launch,) = shell_launches("scripts/run.sh")
    res = assert_framework_plan_matches(launch.path, Settings(world_size=launch.world_size), launch.args)
    assert "FSD103" not in {x.code for x in res.findings}
    assert [u.cls for u in res.plan.units].count("LlamaDecoderLayer") == 4


def test_fsd101_text_for_flags_in_the_launch_script_names_its_line_and_the_trainer_accepts_it(cli, tmp_path,
                                                                                              monkeypatch):
    """A size policy in the script's `--fsdp_config` that wraps nothing (FSDP1): FSD101's fix says which flags to
    pass in place of the one at which line of run.sh; the real Trainer launched with them makes one unit
    per LlamaDecoderLayer."""
    from hf_flags import apply_flags

    repo = _copy(tmp_path)
    script = repo / "scripts" / "run.sh"
    text = script.read_text()
    start = text.index('    --fsdp_config "')
    size = '{"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100000000, "version": 1}'
    text = text[:start] + f"    --fsdp_config '{size}'\n"
    script.write_text(text)
    res = cli("scripts/run.sh", "--output-format", "json", cwd=str(repo))
    assert res.code in (0, 1), res.err
    (f,) = [f for f in json.loads(res.out)["files"][0]["findings"] if f["code"] == "FSD101"]
    line = text.splitlines().index(text.splitlines()[-1]) + 1
    assert f["fix"].endswith(f"in place of the `--fsdp_config` given (transformers 5) in run.sh, line {line}"), f["fix"]
    monkeypatch.chdir(repo)
    (launch,) = shell_launches("scripts/run.sh")
    fixed = apply_flags(launch.args, f["fix"].split(": ", 1)[1])
    res = assert_framework_plan_matches(launch.path, Settings(world_size=8), fixed)
    assert "FSD101" not in {x.code for x in res.findings} and res.plan.api == "fsdp1"     # the user's version kept
    assert [u.cls for u in res.plan.units].count("LlamaDecoderLayer") == 4


def _transformers_major() -> int:
    from importlib.metadata import version

    return int(version("transformers").split(".")[0])


@pytest.mark.skipif(_transformers_major() != 4, reason="transformers 4 is not what is installed (CI has 5, which "
                    "refuses --fsdp_transformer_layer_cls_to_wrap; the 5.x flags are tested above)")
def test_fsd103_for_the_transformers_4_class_flag_in_the_launch_script(cli, tmp_path, monkeypatch):
    """The Alpaca-era launch line, `--fsdp_transformer_layer_cls_to_wrap ${LAYER_CLS}` on transformers 4:
    FSD103 at the `LAYER_CLS=` line of run.sh, and the real 4.x Trainer launched with the fixed script
    wraps every LlamaDecoderLayer."""
    repo = _copy(tmp_path)
    script = repo / "scripts" / "run.sh"
    text = script.read_text()
    text = text[:text.index('    --fsdp_config "')] + "    --fsdp_transformer_layer_cls_to_wrap ${LAYER_CLS}\n"
    script.write_text(text)
    res = cli("scripts/run.sh", "--output-format", "json", cwd=str(repo))
    (f,) = [f for f in json.loads(res.out)["files"][0]["findings"] if f["code"] == "FSD103"]
    assert f["path"] == "scripts/run.sh" and f["line"] == text.splitlines().index("LAYER_CLS=LLaMADecoderLayer") + 1
    assert f["message"].startswith("`--fsdp_transformer_layer_cls_to_wrap` in run.sh names `LLaMADecoderLayer`")
    cli("scripts/run.sh", "--fix", "--unsafe-fixes", cwd=str(repo))
    monkeypatch.chdir(repo)
    (launch,) = shell_launches("scripts/run.sh")
    assert launch.args[-1] == "LlamaDecoderLayer"
    res = assert_framework_plan_matches(launch.path, Settings(world_size=8), launch.args)
    assert [u.cls for u in res.plan.units].count("LlamaDecoderLayer") == 4


POSITIONAL_SCRIPT = '''#!/usr/bin/env bash
# bash scripts/pretrain.sh [CONFIG] [GPUS] [overrides...]
set -euo pipefail
CONFIG=${1:-configs/base.yaml}
NGPU=${2:-8}
shift 2 || true
torchrun --standalone --nproc_per_node=$NGPU train.py --config "$CONFIG" "$@"
'''

TINY_FSDP2 = '''import torch.nn as nn
from torch.distributed.fsdp import fully_shard

model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
for block in model:
    fully_shard(block)
fully_shard(model)
'''


def test_a_scripts_own_arguments_are_read_as_bash_gives_them(cli, tmp_path, monkeypatch):
    """`${1:-default}`, `$NGPU` from `${2:-8}`, `shift 2` and `"$@"`: run without arguments the defaults
    stand; `fsdp-lint SCRIPT -- ARGS` reads it as `bash SCRIPT ARGS` does."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "pretrain.sh"
    script.write_text(POSITIONAL_SCRIPT)
    (tmp_path / "train.py").write_text(TINY_FSDP2)
    monkeypatch.chdir(tmp_path)
    (bare,) = shell_launches(str(script))
    assert (bare.world_size, bare.args) == (8, ["--config", "configs/base.yaml"])
    (given,) = shell_launches(str(script), ["configs/big.yaml", "2", "--lr", "1e-4", "--name", "run one"])
    assert (given.world_size, given.args) == (2, ["--config", "configs/big.yaml", "--lr", "1e-4", "--name", "run one"])
    assert given.arg_lines == [7] * 6
    res = cli(str(script), "--format", "json", "--", "configs/big.yaml", "2", cwd=str(tmp_path))
    assert res.code == 0, res.err
    (f,) = json.loads(res.out)["files"]
    assert f["args"] == ["--config", "configs/big.yaml"]
    assert (f["plan"]["world_size"], f["plan"]["world_size_source"]) == (2, "launch script")


MODULE_APP = '''import argparse

import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=2)
    args, _ = parser.parse_known_args(argv)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(args.depth)])
    for block in model:
        fully_shard(block)
    fully_shard(model)


if __name__ == "__main__":
    main()
'''


def test_a_module_launch_runs_the_modules_file(cli, tmp_path, monkeypatch):
    """``torchrun ... -m apps.main.train``, ``python -m pkg`` (its ``__main__.py``) and accelerate's
    ``--module`` under ``src/``: the module's file is launched, with the arguments after it."""
    for rel in ("apps/main/train.py", "tool/__main__.py", "src/srcpkg/run.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(MODULE_APP)
    for pkg in ("apps", "apps/main", "tool", "src/srcpkg"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "launch.sh").write_text(
        "python -m pip install -e .\n"          # installed modules are not launches of the project's
        "torchrun --nproc-per-node 4 -m apps.main.train --depth 3\n"
        "python -m tool --depth 5\n"
        "accelerate launch --num_processes 2 --module srcpkg.run --depth 1\n")
    monkeypatch.chdir(tmp_path)
    launches = shell_launches("launch.sh")
    assert [(os.path.relpath(x.path, tmp_path), x.world_size, x.args) for x in launches] == [
        ("apps/main/train.py", 4, ["--depth", "3"]), ("tool/__main__.py", None, ["--depth", "5"]),
        ("src/srcpkg/run.py", 2, ["--depth", "1"])]
    res = cli("launch.sh", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    plans = [f["plan"] for f in json.loads(res.out)["files"]]
    assert [(p["world_size"], len(p["units"])) for p in plans[:1]] == [(4, 4)]


CONSOLE_MAIN = '''import sys

from tinylm.pretrain import setup


def main():
    command, *rest = sys.argv[1:]
    if command == "pretrain":
        setup(rest)


if __name__ == "__main__":
    main()
'''


def test_the_projects_console_script_in_a_launch_script_runs_its_module(cli, tmp_path):
    """``tinylm pretrain --depth 3`` where ``tinylm`` is the project's console script
    (``[project.scripts]``, ``tinylm.__main__:main``): the script line launches that module's file with the
    command's arguments, as the installed command does; a module with no ``__main__`` guard has its function
    called after it runs, as pip's wrapper calls it (corenet's ``corenet-train``, SimpleTuner's command)."""
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'tinylm'\nversion = '0'\n\n[project.scripts]\ntinylm = 'tinylm.__main__:main'\n"
        "tinylm-eval = 'tinylm.evaluate:main'\n")
    pkg = tmp_path / "src" / "tinylm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(CONSOLE_MAIN)
    (pkg / "pretrain.py").write_text(MODULE_APP.replace("def main(argv=None):", "def setup(argv=None):")
                                     .replace("\n\nif __name__ == \"__main__\":\n    main()\n", "\n"))
    # a module with no `if __name__ == "__main__"`: the installed command imports it and calls main()
    (pkg / "evaluate.py").write_text(MODULE_APP.replace("\n\nif __name__ == \"__main__\":\n    main()\n", "\n"))
    (pkg / "guarded.py").write_text(MODULE_APP)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "pretrain.sh").write_text("#!/bin/bash\ntinylm pretrain --depth 3\n")
    res = cli("scripts/pretrain.sh", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    (f,) = json.loads(res.out)["files"]
    assert f["args"] == ["pretrain", "--depth", "3"] and len(f["plan"]["units"]) == 4
    (tmp_path / "scripts" / "eval.sh").write_text("tinylm-eval --depth 3\n")
    res = cli("scripts/eval.sh", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    (called,) = json.loads(res.out)["files"]
    assert called["path"].endswith("evaluate.py") and called["args"] == ["--depth", "3"]
    # the same code run by its own `__main__` guard builds the same plan
    res = cli("src/tinylm/guarded.py", "--format", "json", "--", "--depth", "3", cwd=str(tmp_path))
    assert res.code == 0, res.err
    (guarded,) = json.loads(res.out)["files"]
    def units(f):
        return [(u["module"], u["class"], u["numel"], u["shard_numel"]) for u in f["plan"]["units"]]

    assert len(units(called)) == 4 and units(called) == units(guarded)
    # a command whose module lacks its function fails on a node too: said so
    (tmp_path / "pyproject.toml").write_text(
        (tmp_path / "pyproject.toml").read_text() + "tinylm-export = 'tinylm.evaluate:export'\n")
    (tmp_path / "scripts" / "export.sh").write_text("tinylm-export --depth 3\n")
    res = cli("scripts/export.sh", cwd=str(tmp_path))
    assert res.code == 2 and "defines no `export`" in res.err, res.err


RECIPE_CLI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "repos", "recipe_cli")


def test_a_cli_that_runs_the_recipe_its_config_names_is_replayed_as_a_torchrun_worker(cli, monkeypatch):
    """``trainkit examples/sft.yaml --nproc-per-node 8``: the CLI imports the recipe its config names
    (``recipe._target_``) at run time, so the syntax of the launched file reaches no model; launched, it is
    replayed anyway. It runs the recipe in-process only under torchrun (``LOCAL_RANK`` and
    ``TORCHELASTIC_RUN_ID``: the replay's node gives a worker's whole environment), else it would start
    torchrun on itself. The plan's units are those real FSDP2 builds."""
    from test_idioms import torch_units

    res = cli("scripts/run_sft.sh", "--format", "json", cwd=RECIPE_CLI)
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    monkeypatch.chdir(RECIPE_CLI)
    real, _ = torch_units(os.path.join(RECIPE_CLI, "trainkit", "cli", "app.py"), 8, ["examples/sft.yaml"])
    assert [u["modules"] for u in f["plan"]["units"]] == [r["modules"] for r in real] == [
        ["layers.0"], ["layers.1"], ["layers.2"], [""]]
    named = cli("trainkit/cli/app.py", "--format", "json", "--", "examples/sft.yaml", cwd=RECIPE_CLI)
    assert named.code in (0, 1) and len(json.loads(named.out)["files"][0]["plan"]["units"]) == 4
    bare = cli("trainkit/cli/app.py", cwd=RECIPE_CLI)      # named without a launch: screened as before
    assert bare.code == 0 and "1 skipped (no model or FSDP use)" in bare.out
