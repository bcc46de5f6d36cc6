"""Round 15 of the real-launch survey: launch scripts read as bash runs them (argument loops, unset variables,
commands built in strings, scripts calling scripts, SLURM and accelerate worlds, the PYTHONPATH a script
exports). The oracle is real bash (the script run with the launchers replaced by echo), accelerate's own
parser, or python itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402


def _bash_echo(script, given=(), env=None, cwd=None) -> list:
    """What bash runs: the script run by bash with torchrun/accelerate/python replaced by echo."""
    shim = ('torchrun() { echo "torchrun $*"; }; accelerate() { echo "accelerate $*"; }; '
            'srun() { echo "srun $*"; }; python() { echo "python $*"; }; '
            'export -f torchrun accelerate srun python; bash "$0" "$@"')
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    full.update(env or {})
    return subprocess.run(["bash", "-c", shim, str(script), *given], capture_output=True, text=True, check=True,
                          env=full, cwd=cwd).stdout.splitlines()


ACCELERATE_TRAIN = {
    "acc_train.py": '''
        from __future__ import annotations

        import torch.nn as nn
        from accelerate import Accelerator

        from models.mlp import build

        accelerator = Accelerator()
        model = accelerator.prepare(build(4))
    ''',
    "models/__init__.py": "",
    "models/mlp.py": '''
        from __future__ import annotations

        import torch.nn as nn


        def build(n: int) -> nn.Module:
            return nn.Sequential(*[nn.Linear(64, 64) for _ in range(n)])
    ''',
    "fsdp.yaml": '''
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        fsdp_config:
          fsdp_auto_wrap_policy: SIZE_BASED_WRAP
          fsdp_min_num_params: 1000
          fsdp_version: 1
        mixed_precision: bf16
        num_machines: 1
        num_processes: 8
        machine_rank: 0
    ''',
}

SBATCH = "#!/usr/bin/env bash\n#SBATCH --nodes=1\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks-per-node=1\n"


def test_accelerates_world_wins_under_srun(cli, tmp_path):
    # `srun --ntasks=1 accelerate launch --num_processes 8`: srun starts one accelerate, which starts 8 processes;
    # the plan was for srun's 1 task. dllm's idiom counts the node's GPUs from CUDA_VISIBLE_DEVICES and its nodes
    # from SLURM_NNODES, which SLURM sets in the batch script's shell (the oracle: bash under those variables); the
    # machines' rendezvous it computes (scontrol, SLURM_JOB_ID) is the node's, not the plan's
    write_tree(tmp_path, ACCELERATE_TRAIN)
    (tmp_path / "acc4.slurm.sh").write_text(
        SBATCH + "srun --nodes=1 --ntasks=1 accelerate launch --config_file fsdp.yaml --num_machines 1 "
                 "--num_processes 4 --machine_rank 0 acc_train.py\n")
    (tmp_path / "acc.slurm.sh").write_text(SBATCH + textwrap.dedent('''\
        NUM_NODES=${SLURM_NNODES}
        GPUS_PER_NODE=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\\n' | wc -l)
        WORLD_SIZE=$((NUM_NODES * GPUS_PER_NODE))
        NODELIST=($(scontrol show hostnames "${SLURM_JOB_NODELIST}"))
        MASTER_ADDR=${NODELIST[0]}
        MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
        srun --nodes="${NUM_NODES}" --ntasks="${NUM_NODES}" \\
          accelerate launch --config_file fsdp.yaml --num_machines "${NUM_NODES}" --num_processes "${WORLD_SIZE}" \\
            --main_process_ip "${MASTER_ADDR}" --main_process_port "${MASTER_PORT}" \\
            --machine_rank "${SLURM_PROCID}" acc_train.py
    '''))
    [ran] = _bash_echo(tmp_path / "acc.slurm.sh", env={"SLURM_NNODES": "1", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7",
                                                       "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, cwd=tmp_path)
    assert "--num_processes 8 " in ran
    for script, world in (("acc4.slurm.sh", 4), ("acc.slurm.sh", 8)):
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        assert json.loads(res.out)["files"][0]["plan"]["world_size"] == world, script


TRAIN_ARGS = '''
    from __future__ import annotations

    import argparse

    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    from nets.blocks import stack

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.distributed.init_process_group("nccl")
    model = stack(args.layers)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
'''
NETS = {"nets/__init__.py": "", "nets/blocks.py": '''
    from __future__ import annotations

    import torch.nn as nn


    def stack(n: int) -> nn.Sequential:
        return nn.Sequential(*[nn.Linear(64, 64) for _ in range(n)])
'''}

ARG_LOOP = '''\
#!/usr/bin/env bash
script_path="train_a.py"
nproc=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --script_path)
      script_path="$2"; shift 2 ;;
    --nproc|-n)
      nproc="$2"; shift 2 ;;
    --help) echo "usage: run.sh [--script_path F] [--nproc N] ARGS"; exit 0 ;;
    *)
      FORWARD_ARGS=("$@"); break ;;
  esac
done
torchrun --nproc_per_node "${nproc}" "${script_path}" "${FORWARD_ARGS[@]}"
'''


def _plan(cli, tmp_path, script, *given):
    res = cli(script, "--no-cache", "--format", "json", *(("--", *given) if given else ()), cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    return json.loads(res.out)["files"][0]


def test_a_launch_scripts_argument_loop_runs_for_the_arguments_given(cli, tmp_path):
    # `while [[ $# -gt 0 ]]; do case "$1" in --script_path) ...; shift 2;; *) FWD=("$@"); break;; esac; done`:
    # the arm each argument matches runs (the oracle: bash itself, torchrun replaced by echo)
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, "train_b.py": TRAIN_ARGS, "run.sh": ARG_LOOP, **NETS})
    given = ["--script_path", "train_b.py", "-n", "4", "--layers", "5", "--lr", "1"]
    [ran] = _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node", "4", "train_b.py", "--layers", "5", "--lr", "1"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["path"].endswith("train_b.py") and f["plan"]["world_size"] == 4
    assert len(f["plan"]["units"]) == 5 + 1
    # no arguments: the loop does not run, the defaults stand and the never-set array is no word at all
    [ran] = _bash_echo(tmp_path / "run.sh", cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node", "2", "train_a.py"]
    f = _plan(cli, tmp_path, "run.sh")
    assert f["path"].endswith("train_a.py") and f["plan"]["world_size"] == 2 and len(f["plan"]["units"]) == 3
    # an arm that exits (`--help`): bash launches nothing, and the lint says so
    res = cli("run.sh", "--no-cache", "--", "--help", cwd=str(tmp_path))
    assert res.code == 2 and "exit" in res.err and "launches nothing" in res.err


def test_a_lone_case_on_the_first_argument_and_an_unset_array(tmp_path, monkeypatch):
    from fsdp_lint.entry.shell import shell_launches

    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, "train_b.py": TRAIN_ARGS, **NETS,
                     "run8.sh": 'script_path="train_a.py"\ncase "$1" in\n  --script_path) script_path="$2" ;;\n'
                                'esac\ntorchrun --nproc_per_node 2 "${script_path}" "${EXTRA[@]}" --lr 1\n'})
    monkeypatch.chdir(tmp_path)
    for given in ((), ("--script_path", "train_b.py")):
        [ran] = _bash_echo(tmp_path / "run8.sh", given, cwd=tmp_path)
        [launch] = shell_launches("run8.sh", given)
        assert [os.path.basename(launch.path), *launch.args] == ran.split()[3:]


def test_an_unset_variable_is_nothing_and_the_failure_names_it(cli, tmp_path, monkeypatch):
    # a README template: `--layers $LAYERS` of a variable the user was to set; bash passes `--layers` alone and
    # argparse refuses it -- the one line names the variable the script never sets
    write_tree(tmp_path, {"train.py": TRAIN_ARGS, **NETS,
                     "run.sh": "#!/bin/bash\ntorchrun --nproc-per-node=4 train.py --layers $LAYERS\n",
                     "ok.sh": '#!/bin/bash\ntorchrun --nproc-per-node=4 train.py $EXTRA_FLAGS --layers 3 --lr "$LR"\n'})
    [ran] = _bash_echo(tmp_path / "run.sh", cwd=tmp_path)
    assert ran.split()[2:] == ["train.py", "--layers"]
    probe = subprocess.run([sys.executable, "train.py", "--layers"], cwd=tmp_path, capture_output=True, text=True)
    assert probe.returncode == 2 and "expected one argument" in probe.stderr
    res = cli("run.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    assert "expected one argument" in res.err and "never sets $LAYERS" in res.err and "'$LAYERS'" not in res.err
    # unquoted and unset: no word; quoted: one empty word (`--lr ""`: argparse's float refuses it, as on a node)
    [ran] = _bash_echo(tmp_path / "ok.sh", cwd=tmp_path)
    from fsdp_lint.entry.shell import shell_launches

    monkeypatch.chdir(tmp_path)
    [launch] = shell_launches("ok.sh")
    assert launch.args == ["--layers", "3", "--lr", ""] and launch.unset == ("EXTRA_FLAGS", "LR")
    assert ran == "torchrun --nproc-per-node=4 train.py --layers 3 --lr "
    res = cli("ok.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and "invalid float value: ''" in res.err and "$EXTRA_FLAGS, $LR" in res.err


WRAPPED = {
    "train.py": TRAIN_ARGS.replace('parser.add_argument("--lr", type=float, default=0.1)',
                                   'parser.add_argument("--lr", type=float, default=0.1)\n'
                                   '    parser.add_argument("--steps", type=int, default=10)\n'
                                   '    parser.add_argument("--dump_folder", default="exp")'),
    **NETS,
    "tools/convert.py": '''
        """Post-training checkpoint conversion: no model, no FSDP."""
        from __future__ import annotations

        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("--path", required=True)
        p.add_argument("--step", type=int, required=True)
        args = p.parse_args()
        print(f"converting {args.path}/step-{args.step}")
    ''',
    "scripts/train.sh": '''\
        #!/usr/bin/bash
        params="$*"
        NGPU=${NGPU:-"8"}
        path=$(grep -oP '(?<=--dump_folder )[^ ]+' <<< "$params")
        steps=$(grep -oP '(?<=--steps )[^ ]+' <<< "$params")
        torchrun --nproc_per_node=${NGPU} train.py $params
        python tools/convert.py --path $path --step $steps
    ''',
    "run_readme.sh": "#!/usr/bin/bash\nNGPU=4 bash scripts/train.sh --layers 6 --steps 100 --dump_folder exp/run1\n",
    "run_exec.sh": "#!/usr/bin/bash\nexport NGPU=2\n./scripts/train.sh --layers 3 --steps 7 --dump_folder out\n",
}


def test_a_launch_script_that_runs_another_with_arguments_and_environment(cli, tmp_path, monkeypatch):
    # flame's README: `NGPU=4 bash train.sh ARGS`; train.sh reads flags back with `grep -oP ... <<< "$params"` and
    # converts the checkpoint after training (the oracle: bash and grep themselves)
    from fsdp_lint.entry.shell import shell_launches

    write_tree(tmp_path, WRAPPED)
    (tmp_path / "scripts" / "train.sh").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for script, world in (("run_readme.sh", 4), ("run_exec.sh", 2)):
        ran = _bash_echo(tmp_path / script, cwd=tmp_path)
        launches = shell_launches(script)
        assert [[os.path.relpath(x.path, tmp_path), *x.args] for x in launches] == [r.split()[2:] for r in ran[:1]] + \
            [r.split()[1:] for r in ran[1:]]
        assert launches[0].world_size == world and launches[1].args[1] != "" and "$" not in " ".join(launches[1].args)
        # the conversion builds no model: a note beside the training launch's plan, not the lint's failure
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        [f] = json.loads(res.out)["files"]
        assert f["plan"]["world_size"] == world and "convert.py" in res.err and "note" in res.err
    # a script whose only launch builds no model is still an error
    (tmp_path / "only.sh").write_text("python tools/convert.py --path x --step 1\n")
    assert cli("only.sh", "--no-cache", cwd=str(tmp_path)).code == 2


def test_a_launch_built_in_a_string_and_run_with_eval(tmp_path, monkeypatch):
    # `cmd="torchrun ..."; cmd+=" --flag x"; eval $cmd` (and `eval "$cmd"`, `$cmd`): the appended arguments are
    # the launch's (the oracle: bash itself)
    from fsdp_lint.entry.shell import shell_launches

    write_tree(tmp_path, {"train.py": TRAIN_ARGS, **NETS})
    monkeypatch.chdir(tmp_path)
    for run in ('eval $cmd', 'eval "$cmd"', '$cmd'):
        (tmp_path / "run.sh").write_text(
            "#!/bin/bash\nnp=4\nlayers=3\ncmd=\"torchrun --nproc_per_node=${np} train.py \"\n"
            f"cmd+=\"--layers=${{layers}}\"\ncmd+=\" --lr 0.5\"\n{run}\n")
        [ran] = _bash_echo(tmp_path / "run.sh", cwd=tmp_path)
        [launch] = shell_launches("run.sh")
        assert ran.split()[2:] == ["train.py", *launch.args] == ["train.py", "--layers=3", "--lr", "0.5"], run
        assert launch.world_size == 4


def test_an_accelerate_config_whose_num_processes_is_gpu(cli, tmp_path, monkeypatch):
    # `num_processes: gpu`: accelerate passes it to torchrun as `--nproc_per_node gpu` (every GPU of each machine);
    # the lint refused it as a config without num_processes (the oracle: accelerate's own validation)
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    files = dict(ACCELERATE_TRAIN)
    files["fsdp.yaml"] = files["fsdp.yaml"].replace("num_processes: 8", "num_processes: gpu")
    files["run.sh"] = "accelerate launch --config-file fsdp.yaml acc_train.py\n"
    write_tree(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    try:
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
            ["--config_file", "fsdp.yaml", "acc_train.py"]))
        prepare_multi_gpu_env(args)
    finally:
        os.environ.clear()
        os.environ.update(before)
    assert (args.num_processes, args.nproc_per_node, args.num_machines) == ("gpu", "gpu", 1)
    for given, world in (((), 8), (("--gpus-per-node", "4"), 4)):
        res = cli("run.sh", "--no-cache", "--format", "json", *given, cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        f = json.loads(res.out)["files"][0]
        assert f["plan"]["world_size"] == world and any("`gpu`" in n for n in f["notes"])


OWN_PACKAGE = {
    # (no pyproject.toml: a repository that is not installed, run through its launch script)
    "repo/mylib/__init__.py": "",
    "repo/mylib/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self, n: int = 4) -> None:
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(n))
    ''',
    "repo/scripts/train.py": '''
        from __future__ import annotations

        import torch
        from torch.distributed.fsdp import fully_shard

        from mylib.model import Net

        torch.distributed.init_process_group("nccl")
        model = Net()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    ''',
    "repo/run.sh": '#!/bin/bash\ncd "$(dirname "$0")"\nexport PYTHONPATH=.\ntorchrun --nproc_per_node=4 scripts/train.py\n',
    "repo/run_pwd.sh": '#!/bin/bash\ncd "$(dirname "$0")"\nexport PYTHONPATH=$PWD\ntorchrun --nproc_per_node=4 scripts/train.py\n',
    "repo/run_bare.sh": '#!/bin/bash\ncd "$(dirname "$0")"\ntorchrun --nproc_per_node=4 scripts/train.py\n',
}


def test_a_launch_scripts_pythonpath_finds_the_repositorys_package(cli, tmp_path):
    # `cd repo; export PYTHONPATH=.`: the launched script imports the repository's package through it (the oracle:
    # python itself, which finds `mylib` from scripts/train.py only with that PYTHONPATH)
    write_tree(tmp_path, OWN_PACKAGE)
    probe = [sys.executable, "-c", "import runpy, sys; sys.path[0] = 'scripts'; import mylib.model; print('ok')"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(probe, cwd=tmp_path / "repo", capture_output=True, text=True, env=dict(env, PYTHONPATH="."))
    assert found.stdout.strip() == "ok"
    missing = subprocess.run([sys.executable, "scripts/train.py"], cwd=tmp_path / "repo", capture_output=True,
                             text=True, env=env)
    assert "No module named 'mylib'" in missing.stderr
    for script in ("repo/run.sh", "repo/run_pwd.sh"):       # from outside the repository
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        assert json.loads(res.out)["files"][0]["plan"]["world_size"] == 4
    # without it, the lint never suggests `pip install mylib` for the repository's own package
    res = cli("repo/run_bare.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and "pip install mylib" not in res.err and "repository's own package" in res.err


def test_a_command_substitution_not_run_here_is_named_in_the_failure(cli, tmp_path):
    # `--layers $(jq .layers cfg.json)`: bash passes jq's output; the lint cannot run jq, and its refusal says so
    write_tree(tmp_path, {"train.py": TRAIN_ARGS, **NETS, "cfg.json": '{"layers": 3}',
                     "run.sh": "torchrun --nproc_per_node=2 train.py --layers $(jq .layers cfg.json)\n"})
    res = cli("run.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and "`$(jq .layers cfg.json)` is a command substitution fsdp-lint does not run" in res.err


def test_accelerates_refusal_of_a_launch_option_says_why(cli, tmp_path, capsys):
    # the refusal was "accelerate rejects it" alone; accelerate's parser says which option (the oracle: its parser)
    from accelerate.commands.launch import launch_command_parser

    write_tree(tmp_path, ACCELERATE_TRAIN)
    (tmp_path / "run.sh").write_text("accelerate launch --config_file fsdp.yaml --gradient_accumulation_steps x "
                                     "acc_train.py\n")
    try:
        launch_command_parser().parse_args(["--gradient_accumulation_steps", "x", "acc_train.py"])
    except SystemExit:
        said = capsys.readouterr().err.strip().splitlines()[-1]
    res = cli("run.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and said.split("error: ", 1)[1] in res.err
