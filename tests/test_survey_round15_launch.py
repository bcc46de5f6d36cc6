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


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


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
    # from SLURM_NNODES, which SLURM sets in the batch script's shell (the oracle: bash under those variables)
    _tree(tmp_path, ACCELERATE_TRAIN)
    (tmp_path / "acc4.slurm.sh").write_text(
        SBATCH + "srun --nodes=1 --ntasks=1 accelerate launch --config_file fsdp.yaml --num_machines 1 "
                 "--num_processes 4 --machine_rank 0 acc_train.py\n")
    (tmp_path / "acc.slurm.sh").write_text(SBATCH + textwrap.dedent('''\
        NUM_NODES=${SLURM_NNODES}
        GPUS_PER_NODE=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\\n' | wc -l)
        WORLD_SIZE=$((NUM_NODES * GPUS_PER_NODE))
        srun --nodes="${NUM_NODES}" --ntasks="${NUM_NODES}" \\
          accelerate launch --config_file fsdp.yaml --num_machines "${NUM_NODES}" --num_processes "${WORLD_SIZE}" \\
            --machine_rank "${SLURM_PROCID}" acc_train.py
    '''))
    [ran] = _bash_echo(tmp_path / "acc.slurm.sh", env={"SLURM_NNODES": "1", "SLURM_PROCID": "0",
                                                       "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, cwd=tmp_path)
    assert "--num_processes 8 " in ran
    for script, world in (("acc4.slurm.sh", 4), ("acc.slurm.sh", 8)):
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        assert json.loads(res.out)["files"][0]["plan"]["world_size"] == world, script
