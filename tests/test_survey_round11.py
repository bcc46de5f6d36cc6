"""Round 11 of the real-launch survey (benchmarks/realworld.md, "Round 11"): which model a launch is about,
accelerate's process count from its config, and parameter-less containers in FSDP1 policies. Each fixture
is written in the idiom the survey met; the oracle is real torch, PEFT or accelerate running the same code."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


THREE_MODELS = '''
from functools import partial
import os
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ff = nn.Linear(d, d)

    def forward(self, x):
        return self.ff(x)


class TextEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.blocks = nn.ModuleList(Block(64) for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return x


class DiT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(128) for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def shard_model(model, device_id):
    return FSDP(model, auto_wrap_policy=partial(lambda_auto_wrap_policy, lambda_fn=lambda m: m in model.blocks),
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                device_id=device_id, sync_module_states=True)


class WanT2V:
    def __init__(self, device_id):
        shard_fn = partial(shard_model, device_id=device_id)
        self.text_encoder = shard_fn(TextEncoder().eval().requires_grad_(False))
        self.low_noise_model = shard_fn(DiT().eval().requires_grad_(False))
        self.high_noise_model = shard_fn(DiT().eval().requires_grad_(False))

    def generate(self):
        with torch.no_grad():
            context = self.text_encoder(torch.zeros(1, 8, dtype=torch.long, device="cuda"))
            return self.low_noise_model(self.high_noise_model(torch.randn(1, 8, 128, device="cuda")))


if __name__ == "__main__":
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    WanT2V(rank).generate()
'''


def test_of_several_models_each_wrapped_once_the_last_is_the_one_the_job_is_about(tmp_path, cli):
    # Wan2.2's generate: a frozen text encoder wrapped first, then the low- and high-noise DiTs with the same
    # shard function; no optimizer says which is trained. A tie of single wraps kept the first (the text
    # encoder); the last call's model is the plan's, as with two models (Wan2.1)
    from oracle import fsdp1_units

    (tmp_path / "generate.py").write_text(THREE_MODELS)
    res = cli("generate.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["class"] == "DiT"
    ns: dict = {}
    exec(compile(THREE_MODELS.split("class WanT2V")[0], "generate.py", "exec"), ns)
    real = fsdp1_units(ns["DiT"], world_size=8, auto_wrap_policy=ns["partial"](
        ns["lambda_auto_wrap_policy"], lambda_fn=lambda m: type(m).__name__ == "Block"))
    # (torch's root unit of a DiT whose parameters are all in its blocks owns no FlatParameter)
    assert [u["module"] for u in f["plan"]["units"] if u["numel"]] == [r["module"] for r in real] == \
        ["blocks.0", "blocks.1", "blocks.2"]


PEFT_INJECT = '''
import os
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from peft import LoraConfig, inject_adapter_in_model


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.to_q = nn.Linear(d, d)
        self.to_k = nn.Linear(d, d)

    def forward(self, x):
        return self.to_q(x) + self.to_k(x)


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj_in = nn.Linear(64, 64)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        x = self.proj_in(x)
        for b in self.blocks:
            x = b(x)
        return x

    def add_adapter(self, config):
        inject_adapter_in_model(config, self)        # diffusers' ModelMixin.add_adapter


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    transformer = Transformer()
    transformer.requires_grad_(False)
    transformer.add_adapter(LoraConfig(r=4, target_modules=["to_q", "to_k"]))
    for block in transformer.blocks:
        fully_shard(block)
    fully_shard(transformer)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for step in range(10):
        transformer(torch.randn(2, 64, device="cuda")).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''


def test_a_wrapper_peft_builds_around_the_model_and_drops_is_not_its_root(tmp_path, cli):
    # diffusers' add_adapter -> peft.inject_adapter_in_model makes a LoraModel(model), injects the LoRA
    # layers in place and drops the LoraModel: the root is the transformer, root-wrapped, units `blocks.N`
    # (as real FSDP2 builds them on the same code), not `model.blocks.N` of a LoraModel
    from oracle import fsdp2_groups
    from peft import LoraConfig, inject_adapter_in_model

    (tmp_path / "train_lora.py").write_text(PEFT_INJECT)
    res = cli("train_lora.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    ns: dict = {}
    exec(compile(PEFT_INJECT.split("def main")[0], "train_lora.py", "exec"), ns)

    def build():
        model = ns["Transformer"]()
        model.requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=4, target_modules=["to_q", "to_k"]), model)
        return model

    def wrap(model, mesh):
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    real = fsdp2_groups(build, world_size=4, apply=wrap)
    assert f["model"]["class"] == "Transformer" and f["plan"]["root_wrapped"] is True
    assert [u["module"] for u in f["plan"]["units"]] == [g["modules"][0] for g in real] == \
        ["blocks.0", "blocks.1", "blocks.2", ""]
    assert [u["trainable_numel"] for u in f["plan"]["units"]] == \
        [sum(_numel(p["shape"]) for p in g["params"] if p["requires_grad"]) for g in real]


ACC_YAML = '''compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_state_dict_type: SHARDED_STATE_DICT
mixed_precision: bf16
{processes}'''

ACC_TRAIN = '''
import torch
import torch.nn as nn
from accelerate import Accelerator


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Linear(64, 64)

    def forward(self, x):
        return self.ff(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


accelerator = Accelerator()
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(10):
    accelerator.backward(model(torch.randn(2, 64, device=accelerator.device)).sum())
    optimizer.step()
'''


@pytest.mark.parametrize("processes", ["num_processes: 4\n", ""])
def test_accelerate_launch_takes_the_configs_process_count_or_is_refused_without_one(tmp_path, cli, processes):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    (tmp_path / "fsdp.yaml").write_text(ACC_YAML.format(processes=processes))
    (tmp_path / "train.py").write_text(ACC_TRAIN)
    (tmp_path / "launch.sh").write_text("#!/bin/bash\naccelerate launch --config_file fsdp.yaml train.py\n")
    args = launch_command_parser().parse_args(["--config_file", str(tmp_path / "fsdp.yaml"), "train.py"])
    try:      # the oracle: what accelerate itself does with the launch line
        args, _, _ = _validate_launch_command(args)
        refused = None
    except ValueError as exc:
        refused = exc
    res = cli("launch.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    if refused is None:
        assert res.code in (0, 1), res.err
        assert json.loads(res.out)["files"][0]["plan"]["world_size"] == args.num_processes == 4
    else:
        assert res.code == 2
        assert res.err.splitlines()[0].startswith("fsdp-lint: error: launch.sh: line 2: `accelerate launch "
                                                  "--config_file fsdp.yaml` passes no --num_processes")
        assert str(refused) in res.err


def test_a_hub_file_an_installed_library_asks_for_is_named(tmp_path, cli):
    # moshi's CheckpointInfo.from_hf_repo resolves a checkpoint's files with hf_hub_download: the weights
    # stand in, the tokenizer file is not here and the hub's offline error ends the lint -- naming the file
    # and the command that gets it (huggingface_hub's own message names neither)
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "hublib").mkdir(parents=True)
    (site / "hublib" / "__init__.py").write_text('''
from dataclasses import dataclass

from huggingface_hub import hf_hub_download


@dataclass
class CheckpointInfo:
    weights: str
    tokenizer: str
    dim: int = 64

    @staticmethod
    def from_hf_repo(repo):
        weights = hf_hub_download(repo, "model.safetensors")
        tokenizer = hf_hub_download(repo, "tokenizer_spm_32k_3.model")
        return CheckpointInfo(weights, tokenizer)
''')
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text('''
import safetensors.torch
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from hublib import CheckpointInfo


class LM(nn.Sequential):
    def __init__(self, dim):
        super().__init__(*[nn.Linear(dim, dim) for _ in range(4)])


info = CheckpointInfo.from_hf_repo("someorg/somemodel")
with torch.device("meta"):
    model = LM(info.dim)
model.load_state_dict(safetensors.torch.load_file(info.weights), assign=True)
model = FSDP(model, device_id=torch.device("cpu"))
''')
    sys.path.insert(0, str(site))
    try:
        res = cli("train.py", "-n", "2", "--no-cache", cwd=str(repo))
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("hublib", None)
    assert res.code == 2, res.out
    line = res.err.splitlines()[0]
    assert line.startswith("fsdp-lint: error: train.py:14: setup code failed on the meta device: LocalEntryNotFoundError"), line
    assert line.endswith("(tokenizer_spm_32k_3.model of the hub repository someorg/somemodel is not here, and fsdp-lint "
                         "never downloads: `hf download someorg/somemodel tokenizer_spm_32k_3.model` puts "
                         "it in the local Hugging Face cache)"), line


def test_a_launch_scripts_argument_loop_leaves_its_defaults(tmp_path, cli):
    # mochi's fine-tuner: `while [[ $# -gt 0 ]]; do case $1 in -c|--config) CONFIG_PATH="$2"; shift 2;; ...`
    # over several lines; without arguments no arm runs and the default stands (its arms' assignments
    # were made in order, and --config-path '' refused)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "finetune.yaml").write_text("lr: 1e-4\n")
    (tmp_path / "train.py").write_text('''
import argparse, os
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--config-path", required=True)
args = parser.parse_args()
assert os.path.exists(args.config_path), args.config_path
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
for layer in model:
    fully_shard(layer)
fully_shard(model)
''')
    (tmp_path / "run.bash").write_text('''#!/bin/bash
SCRIPT_DIR="$(cd "$(dirname "$0")" && pwd)"
CONFIG_PATH="${SCRIPT_DIR}/configs/finetune.yaml"
while [[ $# -gt 0 ]]; do
    case $1 in
        -c|--config)
            CONFIG_PATH="$2"
            shift 2
            ;;
        *)
            echo "Unknown option $1"
            exit 1
            ;;
    esac
done
python "${SCRIPT_DIR}/train.py" --config-path "${CONFIG_PATH}"
''')
    res = cli("run.bash", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["args"] == ["--config-path", os.path.join(os.path.realpath(str(tmp_path)), "configs", "finetune.yaml")] or \
        f["args"] == ["--config-path", os.path.join(str(tmp_path), "configs", "finetune.yaml")]


def test_a_stand_in_data_set_cut_into_token_blocks_gives_blocks(tmp_path, cli):
    # mdlm: OpenWebText tokenized, concatenated and cut into 1,024-token blocks (the remainder dropped), then
    # a shuffled DataLoader, whose length the model's set-up reads. One-line placeholder rows gave 0 blocks
    # and `RandomSampler`'s "num_samples=0" stopped the lint; a data set of documents' length gives blocks
    (tmp_path / "train.py").write_text('''
import itertools

import datasets
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def group_texts(examples, block_size):
    ids = list(itertools.chain(*examples["input_ids"]))
    total = (len(ids) // block_size) * block_size
    return {"input_ids": [ids[i:i + block_size] for i in range(0, total, block_size)]}


def get_dataloaders(block_size=1024):
    ds = datasets.load_dataset("Skylion007/openwebtext", split="train")
    ds = ds.map(lambda ex: {"input_ids": [[ord(c) % 256 for c in t] for t in ex["text"]]},
                batched=True, remove_columns=["text"])
    ds = ds.map(group_texts, batched=True, fn_kwargs={"block_size": block_size})
    train_loader = torch.utils.data.DataLoader(ds.with_format("torch"), batch_size=8, shuffle=True)
    return train_loader, len(train_loader)


def main():
    loader, steps_per_epoch = get_dataloaders()
    model = nn.Sequential(nn.Embedding(256, 64), *[nn.Linear(64, 64) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, total_steps=steps_per_epoch)
    for batch in loader:
        pass


if __name__ == "__main__":
    main()
''')
    res = cli("train.py", "-n", "2", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["module"] for u in f["plan"]["units"]] == ["0", "1", "2", "3", ""]
    assert not any("num_samples" in s["error"] for s in f["replay"]["skipped_statements"])


def test_a_look_at_the_data_before_the_model_exists_is_set_up_not_training(tmp_path, cli):
    # mdlm's main: `train_ds, valid_ds = get_dataloaders(...)`, `_print_batch(train_ds, valid_ds)` (one batch of
    # each, printed), then the model. Iterating a DataLoader before any model exists trains nothing: it runs
    # in this process, and the replay goes on to the model and its wrap (it stopped there, "never reached a
    # model", before)
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset


def print_batch(train_loader, valid_loader, k=4):
    train_batch, valid_batch = next(iter(train_loader)), next(iter(valid_loader))
    print("train", train_batch[0].shape, train_batch[0][0, :k].tolist())
    print("valid", valid_batch[0].shape, valid_batch[0][0, :k].tolist())
    return train_batch[0].shape[-1]


def main():
    data = TensorDataset(torch.arange(64 * 16).reshape(64, 16))
    train_loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=4)
    valid_loader = DataLoader(data, batch_size=8)
    seq_len = print_batch(train_loader, valid_loader)
    model = nn.Sequential(nn.Embedding(1024, 2 * seq_len), *[nn.Linear(2 * seq_len, 2 * seq_len) for _ in range(2)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters())
    for (tokens,) in train_loader:
        model(tokens).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
''')
    res = cli("train.py", "-n", "2", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert [u["module"] for u in f["plan"]["units"]] == ["0", "1", "2", ""]
    assert f["replay"]["skipped_statements"] == [] and f["notes"] == []


REENTRANT = '''
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d=64, n=4, vocab=128, gradient_checkpointing=True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab)
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, tokens):
        h = self.emb(tokens)
        for block in self.blocks:
            if self.training and self.gradient_checkpointing:
                h = cp.checkpoint(block, h, use_reentrant=True)
            else:
                h = block(h)
        return self.head(h)


def example_inputs():
    return torch.randint(0, 128, (2, 16))


if __name__ == "__main__":
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(10):
        model(example_inputs()).sum().backward()
        optimizer.step()
'''


def test_reentrant_checkpointing_gathers_each_block_again_in_backward(tmp_path, cli):
    # FSDP-Training's model: `h = checkpoint(block, h)` with use_reentrant=True runs each block's forward
    # under no_grad, and backward recomputes it with grad, gathering the block again: the all-gathers of a
    # real step (torch's FSDP2 under the fake process group, counted) -- every block twice
    from oracle_nd import step_collectives

    (tmp_path / "train.py").write_text(REENTRANT)
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    units = json.loads(res.out)["files"][0]["plan"]["units"]
    ns: dict = {}
    exec(compile(REENTRANT.split('if __name__')[0], "train.py", "exec"), ns)

    def wrap(model, mesh):
        for block in model.blocks:
            ns["fully_shard"](block, mesh=mesh)
        ns["fully_shard"](model, mesh=mesh)

    log = step_collectives(ns["Net"], wrap, ns["example_inputs"], world_size=4, rank=0, mesh_shape=(4,),
                           mesh_dim_names=None)
    real = sum(1 for entry in log if entry[0] == "all_gather")
    assert sum(u["all_gathers_per_step"] for u in units) == real
    assert [u["all_gathers_per_step"] for u in units if u["module"].startswith("blocks.")] == [2, 2, 2, 2]


def test_a_data_set_call_its_library_refuses_is_the_scripts_error(tmp_path, cli):
    # `dataset, _ = load_dataset()`: datasets refuses the call itself (no path), on a node too; a stand-in
    # data set was returned for it, and the unpack of that stand-in was reported instead
    import datasets

    try:
        datasets.load_dataset()
        raise AssertionError("datasets accepted load_dataset() without a path")
    except TypeError as exc:
        refused = f"TypeError: {exc}"
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from datasets import load_dataset


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(x)


class Trainer:
    def __init__(self, model, loader):
        self.loader = loader
        self.model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


def main():
    model = nn.Sequential(*[Block() for _ in range(4)])
    dataset, _ = load_dataset()
    loader = torch.utils.data.DataLoader(dataset, batch_size=8)
    Trainer(model, loader)


if __name__ == "__main__":
    main()
''')
    res = cli("train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.splitlines()[0]
    assert "train.py:26: " in line and refused in line and "not enough values to unpack" not in line, line


def test_the_same_launch_in_two_branches_of_an_if_is_linted_once(tmp_path):
    # mochi: `if [ "$NUM_GPUS" -gt 1 ]; then for RANK in ...; do env RANK=$RANK python train.py ... & done;
    # else python train.py ... & fi`: only one branch runs, so one launch (its error was printed twice);
    # launches one after the other are each a launch
    from fsdp_lint.entry.shell import shell_launches

    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "run.bash").write_text('''#!/bin/bash
NUM_GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if [ "$NUM_GPUS" -gt 1 ]; then
    for RANK in $(seq 0 $((NUM_GPUS-1))); do
        env RANK=$RANK CUDA_VISIBLE_DEVICES=$RANK python train.py --config-path cfg.yaml &
    done
else
    python train.py --config-path cfg.yaml &
fi
python train.py --config-path cfg.yaml
''')
    launches = shell_launches(str(tmp_path / "run.bash"))
    assert [(os.path.basename(l.path), l.args, l.line) for l in launches] == [
        ("train.py", ["--config-path", "cfg.yaml"], 5), ("train.py", ["--config-path", "cfg.yaml"], 10)]
    # (a count the script sets itself decides the branch, as bash does: the `else` launch)
    text = (tmp_path / "run.bash").read_text().replace("$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)", "1")
    (tmp_path / "run.bash").write_text(text)
    assert [l.line for l in shell_launches(str(tmp_path / "run.bash"))] == [8, 10]
