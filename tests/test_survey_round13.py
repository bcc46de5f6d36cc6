"""Round 13 of the real-launch survey (benchmarks/realworld.md, "Round 13"). Each fixture is written in the
idiom the survey met; the oracle is real torch running the same code."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import REPO  # noqa: E402

META_LORA = os.path.join(REPO, "fixtures", "repos", "meta_lora")


def test_a_model_built_on_meta_is_real_after_an_assigned_checkpoint_load(cli, monkeypatch):
    # moshi-finetune's idiom: the model on meta, rank 0 loads the base weights with assign=True, the modules
    # the checkpoint lacked (all their parameters still meta) are initialised, then `assert not any(p.is_meta
    # ...)`. Everything the replay builds is meta, so every parameter answered is_meta and the assertion
    # failed; the node's answer is False for what the setup did not put on meta itself
    from oracle import fsdp1_units

    monkeypatch.syspath_prepend(META_LORA)
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=META_LORA)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["class"] == "SpeechLM"

    import torch
    from finetune.model import SpeechLM
    from finetune.wrapped_model import fsdp_policy

    def model_fn():
        model = SpeechLM(lora=True, dtype=torch.bfloat16)
        for name, p in model.named_parameters():
            p.requires_grad = "lora" in name
        return model

    real = fsdp1_units(model_fn, world_size=8, auto_wrap_policy=fsdp_policy(True), use_orig_params=False)
    units = [u for u in f["plan"]["units"] if u["numel"]]
    assert [(u["module"], u["numel"]) for u in units] == [(r["module"], r["numel"]) for r in real]
    assert f["model"]["trainable_numel"] == sum(p.numel() for p in model_fn().parameters() if p.requires_grad)


NODE_ANSWERS = '''
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from accelerate import init_empty_weights


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    on_gpu = Net().cuda()
    assert not any(p.is_meta for p in on_gpu.parameters()), "a model on the GPU is not meta"
    weight = on_gpu.blocks[0].weight
    assert weight.device == torch.device("cuda", 0) and weight.is_cuda and weight.get_device() == 0
    adapter = nn.Linear(64, 8, device=weight.device)     # as PEFT makes its adapters
    assert not adapter.weight.is_meta and adapter.weight.device.type == "cuda"
    with torch.device("meta"):
        model = Net()
    assert all(p.is_meta for p in model.parameters()), "a model built under torch.device('meta') is"
    assert all(p.device.type == "meta" and not p.is_cuda for p in model.parameters())
    model = model.to(torch.bfloat16)
    assert all(p.is_meta for p in model.parameters()), "a cast keeps it on meta"
    view = model.blocks[0].weight[:2]
    assert view.is_meta, "a view of a meta tensor is meta"
    with init_empty_weights():
        empty = Net()
    assert all(p.is_meta for p in empty.parameters()), "accelerate's init_empty_weights is meta"
    moved = on_gpu.blocks[0].weight.to("meta")
    assert moved.is_meta and not on_gpu.blocks[0].weight.is_meta, ".to('meta') is a new meta tensor"
    model.to_empty(device="cuda")
    assert not any(p.is_meta for p in model.parameters()), "to_empty(device='cuda') materialises it"
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        model(torch.randn(4, 64, device="cuda")).sum().backward()
        optim.step()


if __name__ == "__main__":
    main()
'''


def test_is_meta_answers_as_the_node_does(cli, tmp_path):
    (tmp_path / "train.py").write_text(NODE_ANSWERS)
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["module"] for u in f["plan"]["units"]] == ["blocks.0", "blocks.1", "blocks.2", ""]
    assert f["plan"]["units"][0]["dtypes"] == ["bfloat16"]


# a launch script picks its launcher, GPU count or config with an `if` chain on a variable it set above
# (finetrainers' train.sh); bash runs one branch. The oracle is bash itself, with the launchers echoing
# what they were given
BRANCH_SCRIPTS = {
    "launcher.sh": '''#!/bin/bash
BACKEND="ptd"
NUM_GPUS=4
if [ "$BACKEND" == "accelerate" ]; then
  accelerate launch --config_file multi_gpu.yaml train.py --backend accelerate
elif [ "$BACKEND" == "ptd" ]; then
  torchrun --standalone --nnodes=1 --nproc_per_node=$NUM_GPUS train.py --backend ptd
fi
''',
    "count.sh": '''#!/bin/bash
NUM_GPUS=2
if [ "$NUM_GPUS" == 1 ]; then
  NPROC=1
elif [[ $NUM_GPUS -eq 2 ]]; then
  NPROC=2
else
  NPROC=8
fi
torchrun --nproc_per_node=$NPROC train.py
''',
    "negated.sh": '''#!/bin/bash
DEBUG=""
if ! [ -z "$DEBUG" ]; then
  torchrun --nproc_per_node=1 train.py --debug
else
  torchrun --nproc_per_node 8 train.py
fi
''',
    "nested.sh": '''#!/bin/bash
MODE=full
NODES=1
if [ "$MODE" != "lora" ]; then
  if [ $NODES -gt 1 ]; then
    torchrun --nnodes=$NODES --nproc_per_node=8 train.py --full
  else
    torchrun --nproc_per_node=4 train.py --full
  fi
fi
''',
}


def _bash_runs(script) -> list:
    import subprocess

    shim = ('torchrun() { echo "torchrun $*"; }; accelerate() { echo "accelerate $*"; }; '
            'export -f torchrun accelerate; bash "$0"')
    out = subprocess.run(["bash", "-c", shim, str(script)], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_a_launch_scripts_if_runs_the_branch_bash_runs(tmp_path, monkeypatch):
    from fsdp_lint.entry.shell import shell_launches

    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "multi_gpu.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    monkeypatch.chdir(tmp_path)
    for name, text in BRANCH_SCRIPTS.items():
        (tmp_path / name).write_text(text)
        [ran] = _bash_runs(tmp_path / name)
        [launch] = shell_launches(str(tmp_path / name))
        assert ran.split()[0] == "torchrun" and launch.accelerate_config is None, name
        nproc = ran.split("--nproc_per_node")[1].lstrip("= ").split()[0]
        assert launch.world_size == int(nproc), name
        assert launch.args == ran.split("train.py")[1].split(), name


def test_an_if_on_what_the_script_cannot_know_keeps_every_branch(tmp_path, monkeypatch):
    # a file test or a variable from outside: bash's choice is not known here, each launch is linted
    from fsdp_lint.entry.shell import shell_launches

    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "run.sh").write_text('''#!/bin/bash
if [ -f /etc/cluster.conf ]; then
  torchrun --nproc_per_node=8 train.py --cluster
elif [ "$SLURM_JOB_ID" == "" ]; then
  torchrun --nproc_per_node=2 train.py --local
fi
''')
    monkeypatch.chdir(tmp_path)
    assert [(l.world_size, l.args) for l in shell_launches(str(tmp_path / "run.sh"))] == \
        [(8, ["--cluster"]), (2, ["--local"])]


def test_a_launch_line_torchrun_refuses_is_refused_with_torchruns_words(cli, tmp_path):
    # finetrainers' docs: `torchrun --standalone --nodes=1 --nproc_per_node=8 ... train.py` (the flag is
    # --nnodes): torchrun exits before it starts anything. The oracle is torchrun itself
    import subprocess

    (tmp_path / "train.py").write_text(NODE_ANSWERS)
    line = "torchrun --standalone --nodes=1 --nproc_per_node=8 --rdzv_endpoint=localhost:0 train.py --lr 1e-4"
    (tmp_path / "run.sh").write_text(f"#!/bin/bash\nNPROC=8\n{line}\n")
    real = subprocess.run([sys.executable, "-m", "torch.distributed.run"] + line.split()[1:], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert real.returncode == 2
    res = cli("run.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    [said] = [ln for ln in res.err.splitlines() if ln.startswith("fsdp-lint: error:")]
    assert "run.sh: line 3:" in said and real.stderr.strip().splitlines()[-1].split("error: ")[1] in said, said
    # the same launch with torchrun's own flag, and a count from a variable the script does not set: linted
    (tmp_path / "run.sh").write_text(f"#!/bin/bash\n{line.replace('--nodes=1', '--nnodes=1').replace('=8', '=$NPROC')}\n")
    res = cli("run.sh", "--no-cache", "-n", "4", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err


OWN_FSDP2 = '''
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Linear(128, 128)

    def forward(self, x):
        return x + self.ff(x)


def main():
    dist.init_process_group("nccl")
    model = nn.Sequential(*[Block() for _ in range(4)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        model(torch.randn(4, 128, device="cuda")).sum().backward()
        optim.step()


if __name__ == "__main__":
    main()
'''

PREPARED = '''
import torch
import torch.nn as nn
from accelerate import Accelerator


def main():
    accelerator = Accelerator()
    model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])
    optim = torch.optim.AdamW(model.parameters())
    model, optim = accelerator.prepare(model, optim)
    for _ in range(10):
        accelerator.backward(model(torch.randn(4, 128, device=accelerator.device)).sum())
        optim.step()


if __name__ == "__main__":
    main()
'''


def test_accelerate_launch_of_a_script_that_shards_itself_is_its_process_launcher(cli, tmp_path):
    # finetrainers: `accelerate launch --config_file uncompiled_8.yaml train.py` with `distributed_type:
    # MULTI_GPU`; the script calls fully_shard itself. accelerate only starts the 8 processes: the plan is the
    # one torchrun's launch of the same file gives. An Accelerator preparing the model under that config wraps
    # it in DDP: said in one line
    (tmp_path / "train.py").write_text(OWN_FSDP2)
    (tmp_path / "prepared.py").write_text(PREPARED)
    (tmp_path / "multi_gpu.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                                             "mixed_precision: bf16\nnum_machines: 1\nnum_processes: 8\n")
    (tmp_path / "accelerate.sh").write_text("accelerate launch --config_file multi_gpu.yaml train.py\n")
    (tmp_path / "torchrun.sh").write_text("torchrun --nproc_per_node 8 train.py\n")
    plans = []
    for script in ("accelerate.sh", "torchrun.sh"):
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        plans.append(json.loads(res.out)["files"][0]["plan"])
    assert plans[0]["world_size"] == plans[1]["world_size"] == 8
    assert plans[0]["units"] == plans[1]["units"]
    (tmp_path / "prepared.sh").write_text("accelerate launch --config_file multi_gpu.yaml prepared.py\n")
    res = cli("prepared.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    assert "wraps the model in DistributedDataParallel (accelerate's distributed_type is MULTI_GPU" in res.err
