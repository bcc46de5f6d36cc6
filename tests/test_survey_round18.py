"""Round 18 of the real-launch survey: the classes it found, each on a fixture in the idiom. The oracles are bash
itself (with the simulated node's ``nvidia-smi`` on its PATH) for what a launch script computes, and real FSDP1
under the fake process group for plans."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

TRAIN = '''
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

parser = argparse.ArgumentParser()
parser.add_argument("--global_batch_size", type=int, required=True)
args = parser.parse_args()
dist.init_process_group("nccl")
assert args.global_batch_size % dist.get_world_size() == 0
model = FSDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)), device_id=torch.cuda.current_device())
'''

# how launch scripts count the node's GPUs: the tool's query, the GPUs the script was given (or every GPU of the
# node when it was given none)
GPU_COUNTS = {
    "query.sh": '''#!/bin/bash
GPUS_PER_NODE=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
torchrun --nproc_per_node=$GPUS_PER_NODE train.py --global_batch_size $(( GPUS_PER_NODE * 32 ))
''',
    "given.sh": '''#!/bin/bash
if [ -z "$CUDA_VISIBLE_DEVICES" ]; then
    GPUS_PER_NODE=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
else
    GPUS_PER_NODE=$(echo "$CUDA_VISIBLE_DEVICES" | awk -F',' '{print NF}')
fi
torchrun --nproc_per_node=$GPUS_PER_NODE train.py --global_batch_size $(( GPUS_PER_NODE * 32 ))
''',
    "listed.sh": '''#!/bin/bash
N_GPUS=$(nvidia-smi --list-gpus | grep -c GPU)
torchrun --nproc_per_node $N_GPUS train.py --global_batch_size $((N_GPUS*4))
''',
}


def _bash_launch(script, gpus: int, env) -> str:
    """The torchrun line bash runs, on a node of `gpus` H100s (its nvidia-smi: the simulated node's program)."""
    from fsdp_lint import gpus as profiles, smi

    tools = script.parent / "node-bin"
    tools.mkdir(exist_ok=True)
    tool = tools / "nvidia-smi"
    tool.write_text(f"#!{sys.executable} -SE\n{smi.program(profiles.profile('h100'), gpus)}")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    shim = 'torchrun() { echo "torchrun $*"; }; export -f torchrun; bash "$0"'
    env = dict(env, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", shim, str(script)], capture_output=True, text=True, check=True, env=env,
                          cwd=script.parent).stdout.strip()


@pytest.mark.parametrize("gpus", [8, 4])
@pytest.mark.parametrize("visible", [None, "0,1"])
def test_a_launch_script_counts_the_nodes_gpus_as_bash_does_there(cli, tmp_path, monkeypatch, gpus, visible):
    # Search-R1-style and verl-derived launch scripts: `nvidia-smi --query-gpu=... | wc -l`, or the GPUs given in
    # CUDA_VISIBLE_DEVICES (`awk -F','`), or every GPU of the node when none were given. Before, the count was
    # left as written and the script's arithmetic on it reached the training script's parser (exit 2)
    import json

    (tmp_path / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        env["CUDA_VISIBLE_DEVICES"] = visible
    for name, text in GPU_COUNTS.items():
        (tmp_path / name).write_text(text)
        ran = _bash_launch(tmp_path / name, gpus, env)
        nproc = int(ran.split("--nproc_per_node")[1].lstrip("= ").split()[0])
        res = cli(name, "--no-cache", "--format", "json", "--gpus-per-node", str(gpus), cwd=str(tmp_path))
        assert res.code == 0, (name, res.err)
        (f,) = json.loads(res.out)["files"]
        assert f["plan"]["world_size"] == nproc, (name, ran)
        assert f["args"] == ran.split("train.py")[1].split(), name
