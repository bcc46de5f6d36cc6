"""Round 16 of the real-launch survey: what the simulated node lacks, skipped only where it decides nothing of the
plan -- a frozen helper model (a VAE, a teacher) loaded after the trained model was wrapped, from a folder of the
node's. The oracle is real FSDP1 under the fake process group."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402

DIFFUSION = {
    "diffusion/__init__.py": "",
    "diffusion/nets.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class DiTBlock(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.attn = nn.Linear(width, 3 * width)
                self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                return x + self.mlp(x)


        class DiT(nn.Module):
            def __init__(self, width: int = 64, depth: int = 4):
                super().__init__()
                self.embed = nn.Linear(16, width)
                self.blocks = nn.ModuleList(DiTBlock(width) for _ in range(depth))

            def forward(self, x):
                x = self.embed(x)
                for b in self.blocks:
                    x = b(x)
                return x


        def build(depth: int = 4) -> DiT:
            return DiT(depth=depth)
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import torch.distributed as dist
        from diffusers import AutoencoderTiny
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from diffusion.nets import DiTBlock, build

        parser = argparse.ArgumentParser()
        parser.add_argument("--depth", type=int, default=4)
        parser.add_argument("--tiny_vae", default="output/pretrained_models/tinyvae")
        args = parser.parse_args()

        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        model = build(args.depth)
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({DiTBlock}),
                     sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, device_id=torch.cuda.current_device())
        # the frozen decoder used for previews: a folder the node has
        vae = AutoencoderTiny.from_pretrained(args.tiny_vae, torch_dtype=torch.float16)
        vae.requires_grad_(False)
        vae = vae.eval().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(10):
            pass
    ''',
}


def test_a_frozen_helper_loaded_after_the_wrap_from_a_folder_of_the_node(cli, tmp_path, monkeypatch):
    # the VAE's folder is not here: its load and what follows from it are skipped (noted, with the folder named as
    # a path of the node's, not a hub model), and the plan is the trained model's, as real FSDP1 builds it
    from oracle import fsdp1_units
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, DIFFUSION)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "--depth", "3", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    plan = f["plan"]
    assert plan["api"] == "fsdp1" and plan["origin"] != "suggested" and plan["sharding_strategy"] == "SHARD_GRAD_OP"
    monkeypatch.syspath_prepend(str(tmp_path))
    from diffusion.nets import DiTBlock, build

    real = fsdp1_units(lambda: build(3), world_size=8, auto_wrap_policy=ModuleWrapPolicy({DiTBlock}),
                       sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert [(u["module"], u["numel"]) for u in plan["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]
    skipped = " ".join(f["notes"]) + json.dumps(f.get("skipped_statements", []))
    assert "no model folder 'output/pretrained_models/tinyvae' here" in skipped and "hf download" not in skipped


def test_freezing_the_wrapped_model_from_a_missing_folder_still_ends_the_lint(cli, tmp_path):
    # the control: what is frozen is what the wrap is given (its frozen part changes every unit's trainable share),
    # so the folder it needs ends the lint, named
    tree = dict(DIFFUSION)
    tree["train.py"] = tree["train.py"].replace(
        "        model = build(args.depth)\n",
        "        model = build(args.depth)\n"
        "        frozen = AutoencoderTiny.from_pretrained(args.tiny_vae)\n"
        "        model.embed.requires_grad_(frozen is None)\n")
    write_tree(tmp_path, tree)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    assert "no model folder 'output/pretrained_models/tinyvae' here" in res.err


LAZY_KERNEL = {
    "lm/__init__.py": "",
    "lm/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Attention(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                # a CUDA-only kernel package, imported where it is used (flash-attn's users do)
                from fused_kernels_nowhere.modules import FlashSelfAttention

                self.qkv = nn.Linear(width, 3 * width)
                self.inner = FlashSelfAttention()


        class Block(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.attn = Attention(width)
                self.mlp = nn.Linear(width, width)


        class LM(nn.Module):
            def __init__(self, vocab: int = 1000, width: int = 64, depth: int = 4):
                super().__init__()
                self.embedding = nn.Embedding(vocab, width)
                self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse
        import logging
        import traceback

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from lm.model import LM, Block

        logger = logging.getLogger(__name__)


        def main(args):
            model = LM(depth=args.depth)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())
            optimizer = torch.optim.AdamW(model.parameters())


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--depth", type=int, default=4)
            args = parser.parse_args()
            dist.init_process_group("nccl")
            try:
                main(args)
            except Exception:
                logger.error(f"rank {dist.get_rank()} failed:\\n{traceback.format_exc()}")
    ''',
}


def test_a_model_that_failed_to_build_under_the_scripts_own_except_is_the_cause(cli, tmp_path):
    # `try: main(args) except Exception: logger.error(...)`: the block's lazy import fails, the handler logs it,
    # the wrap never runs; the embedding built on the way is not the job's model (it was a suggested plan, exit 0)
    write_tree(tmp_path, LAZY_KERNEL)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "the setup never reached its wrap code: the model failed to build" in line
    assert "lm/model.py:" in line and "fused_kernels_nowhere" in line and "train.py:31 caught it" in line


TRAINER_LIB = '''
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def read_manifest(url):
    with open(url.replace("s3://", "/mnt/s3/")) as fh:       # the node's mounted bucket
        return [line.split() for line in fh]


def main(argv, build, block_class):
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs")
    parser.add_argument("--dataset-manifest")
    parser.add_argument("--fsdp", action="store_true")
    args = parser.parse_args(argv)
    dist.init_process_group("nccl")
    model = FSDP(build(), auto_wrap_policy=ModuleWrapPolicy({block_class}), device_id=torch.cuda.current_device(),
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    optimizer = torch.optim.AdamW(model.parameters())
    data = read_manifest(args.dataset_manifest)
    for batch in data:
        model(torch.tensor(batch)).sum().backward()
        optimizer.step()
    torch.save({"done": True}, f"{args.logs}/stats_1.pt")
'''

MODELS = '''
from __future__ import annotations

import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ff = nn.Linear(width, width)


class Net(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 8)


def build() -> Net:
    return Net()
'''

RUNNER = '''
from __future__ import annotations

import glob
import logging
import os

import torch

from models import Block, build
from trainerlib_round16.main import main

if __name__ == "__main__":
    logdir = "logs/run1"
    os.makedirs(logdir, exist_ok=True)
    try:
        main(["--logs", logdir, "--dataset-manifest", "s3://bucket/manifest.jsonl", "--fsdp"], build, Block)
    except Exception as e:
        logging.error(e)
    stats = sorted(glob.glob(os.path.join(logdir, "stats_*.pt")))
    if not stats:
        raise ValueError(f"Could not find stats in {logdir}")
'''


def test_an_installed_trainer_that_wrapped_then_failed_on_its_data_under_the_scripts_except(cli, tmp_path,
                                                                                               monkeypatch):
    # an installed trainer's main() builds, wraps, makes its optimizer, then reads a data manifest the node has;
    # the script's `except` logs the failure and its next lines look for the stats training writes -- which the
    # lint reported as the failure. Training starts where the read failed; the plan is real FSDP1's
    from oracle import fsdp1_units
    from torch.distributed.fsdp import MixedPrecision
    import torch

    site, project = tmp_path / "site-packages", tmp_path / "project"      # the trainer is installed, not the project's
    write_tree(site, {"trainerlib_round16/__init__.py": "", "trainerlib_round16/main.py": TRAINER_LIB})
    project.mkdir()
    (project / "train.py").write_text(RUNNER)
    (project / "models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(project))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert "plan" in f, f
    from models import Block, build
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    real = fsdp1_units(build, world_size=8, auto_wrap_policy=ModuleWrapPolicy({Block}),
                       mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    assert [(u["module"], u["numel"]) for u in f["plan"]["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]
    stopped = f["replay"]["stopped_at"]
    assert stopped["line"] == 17 and "FileNotFoundError" in stopped["reason"] and "except" in stopped["reason"], stopped
    assert any("the setup's end" in n and "FileNotFoundError" in n for n in f["notes"]), f["notes"]


def test_a_resume_the_script_catches_between_wraps_ends_nothing(cli, tmp_path):
    # the control: `try: load_checkpoint(...) except FileNotFoundError:` between the blocks' wraps and the root's
    # (the script's own code raised it, not the call that wrapped): the root is still wrapped
    (tmp_path / "train.py").write_text(
        "from __future__ import annotations\n\nimport torch\nimport torch.nn as nn\n"
        "from torch.distributed.fsdp import fully_shard\n\n"
        "torch.distributed.init_process_group('nccl')\n"
        "model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])\n"
        "for layer in model:\n    fully_shard(layer)\n"
        "try:\n    state = torch.load('checkpoints/last.pt')\nexcept FileNotFoundError:\n    state = None\n"
        "fully_shard(model)\n")
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    units = json.loads(res.out)["files"][0]["plan"]["units"]
    assert len(units) == 3 + 1 and units[-1]["module"] == ""


SAME_NAMES = {
    "trainlib/__init__.py": "",
    "trainlib/sharding.py": '''
        from __future__ import annotations

        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


        def shard(model):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.layers:
                fully_shard(layer, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
    ''',
    "trainlib/trainer.py": '''
        from __future__ import annotations

        from dataclasses import dataclass

        import torch

        from trainlib.sharding import shard


        class Throughput:
            """a helper defined before the trainer, with an `__init__` and a `setup` of its own"""

            def __init__(self, window: int = 10):
                self.window = window

            def setup(self):
                self.samples = []


        @dataclass
        class TrainerConfig:
            lr: float = 1e-4
            fsdp: bool = False


        class Trainer:
            def __init__(self, model, config):
                self.model = model
                self.config = config
                self.setup()

            def setup(self):
                if self.config.fsdp:
                    shard(self.model)
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import torch.distributed as dist
        import torch.nn as nn

        from trainlib.trainer import Trainer, TrainerConfig


        class Net(nn.Module):
            def __init__(self, width: int = 64, depth: int = 4):
                super().__init__()
                self.inp = nn.Linear(width, width)
                self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--fsdp", action="store_true")
            parser.add_argument("--dry-run", action="store_true")
            args = parser.parse_args()
            dist.init_process_group("nccl")
            model = Net()
            if args.dry_run:
                model.to(torch.bfloat16)
                return
            trainer = Trainer(model, TrainerConfig(fsdp=args.fsdp))


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_trainer_whose_methods_share_names_with_another_class_of_its_module(cli, tmp_path, monkeypatch):
    # `Throughput.__init__`/`setup` came first in trainer.py and hid `Trainer.__init__`/`setup`, which wrap: the
    # trainer's construction was not followed and a per-block plan was suggested (exit 0)
    from oracle import fsdp2_groups
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    import torch

    write_tree(tmp_path, SAME_NAMES)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "--fsdp", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["origin"] != "suggested"
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib.util

    spec = importlib.util.spec_from_file_location("same_names_train", tmp_path / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def apply(model, mesh):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)

    real = fsdp2_groups(mod.Net, world_size=8, apply=apply)
    assert [u["module"] for u in plan["units"]] == [",".join(g["modules"]) for g in real]
    assert [u["numel"] for u in plan["units"]] == [sum(_numel(p["shape"]) for p in g["params"]) for g in real]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


PREPARED_DATA = {
    "fsdp.yaml": '''
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        fsdp_config:
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
          fsdp_version: 1
        mixed_precision: bf16
        num_machines: 1
        num_processes: 4
    ''',
    "tiny/config.json": json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "vocab_size": 256}),
    "data/prompts.py": '''
        from __future__ import annotations

        import pickle

        import torch
        from torch.utils.data import Dataset


        class Prompts(Dataset):
            def __init__(self, path: str, tokenizer=None):
                with open(path, "rb") as fh:
                    self.prompts = pickle.load(fh)
                self.tokenizer = tokenizer

            def __len__(self):
                return len(self.prompts)

            def __getitem__(self, i):
                return torch.tensor(self.tokenizer(self.prompts[i])["input_ids"])
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from data.prompts import Prompts

        parser = argparse.ArgumentParser()
        parser.add_argument("--model", default="tiny")
        parser.add_argument("--tokenizer", default="acme/tiny-llama")
        parser.add_argument("--train_prompt_path", required=True)
        args = parser.parse_args()

        accelerator = Accelerator()
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        loader = accelerator.prepare(DataLoader(Prompts(args.train_prompt_path, tokenizer), batch_size=2))
        eval_loader = DataLoader(Prompts(args.train_prompt_path + ".eval", tokenizer), batch_size=2)
        eval_loader = accelerator.prepare(eval_loader)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters()))
    ''',
}


def test_the_data_given_to_prepare_decides_nothing_of_the_wrap(cli, tmp_path, monkeypatch):
    # a tokenizer (from the hub) and a captions file (named by `--train_prompt_path`) that only feed data loaders
    # handed to `accelerator.prepare`: missing here, they are skipped, and the plan is the one of the same script
    # without any data (the data decides nothing)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    write_tree(tmp_path, PREPARED_DATA)
    (tmp_path / "run.sh").write_text("accelerate launch --config_file fsdp.yaml train.py "
                                     "--train_prompt_path /data/captions.pkl\n")
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    with_data = json.loads(res.out)["files"][0]
    assert "acme/tiny-llama" in json.dumps(with_data["replay"]["skipped_statements"])
    # without the tokenizer: the captions file the data set opens is what is missing, skipped as data
    write_tree(tmp_path / "no_tokenizer", {**PREPARED_DATA, "train.py": PREPARED_DATA["train.py"].replace(
        ", tokenizer)", ")")})
    (tmp_path / "no_tokenizer/run.sh").write_text((tmp_path / "run.sh").read_text())
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path / "no_tokenizer"))
    assert res.code in (0, 1), res.err
    data_only = json.loads(res.out)["files"][0]
    assert "/data/captions.pkl" in json.dumps(data_only["replay"]["skipped_statements"])
    control = dict(PREPARED_DATA)
    control["train.py"] = "\n".join(line for line in PREPARED_DATA["train.py"].splitlines()
                                    if "tokenizer =" not in line and "loader" not in line)
    write_tree(tmp_path / "control", control)
    (tmp_path / "control/run.sh").write_text("accelerate launch --config_file fsdp.yaml train.py "
                                             "--train_prompt_path /data/captions.pkl\n")
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path / "control"))
    assert res.code in (0, 1), res.err
    without = json.loads(res.out)["files"][0]
    def units(f):
        return [(u["module"], u["numel"], u["param_dtype"], u["shard_numel"]) for u in f["plan"]["units"]]

    assert units(with_data) == units(data_only) == units(without)
    assert with_data["plan"]["world_size"] == 4
    assert len(with_data["plan"]["units"]) == 3 + 1


def test_a_library_that_finds_print_by_its_module_and_name(cli, tmp_path):
    # numba (imported by librosa and whisper) looks each built-in it compiles up by `obj.__module__` and its name
    # at import: the replay's `print` says it is Python's
    write_tree(tmp_path, {
        "jitlib/__init__.py": '''
            import importlib

            BUILTINS = {f: getattr(importlib.import_module(f.__module__), f.__qualname__) for f in (print, len, open)}
        ''',
        "train.py": '''
            from __future__ import annotations

            import torch
            import torch.nn as nn
            from torch.distributed.fsdp import fully_shard

            import jitlib  # noqa: F401

            torch.distributed.init_process_group("nccl")
            model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
            for layer in model:
                fully_shard(layer)
            fully_shard(model)
        ''',
    })
    res = cli("train.py", "-n", "2", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert len(json.loads(res.out)["files"][0]["plan"]["units"]) == 3


def test_an_autoprocessor_with_only_the_config_here_names_the_tokenizer(cli, tmp_path, monkeypatch):
    # the hub cache holds the model's config.json only (a node's cache before its first download):
    # `AutoProcessor.from_pretrained` failed with transformers' own "Unrecognized processing class"
    snap = tmp_path / "hf/hub/models--acme--tiny-lm/snapshots/0123456789abcdef0123456789abcdef01234567"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                                  "vocab_size": 256}))
    refs = tmp_path / "hf/hub/models--acme--tiny-lm/refs"
    refs.mkdir()
    (refs / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "train.py").write_text(
        "from __future__ import annotations\n\nimport torch\nfrom torch.distributed.fsdp import fully_shard\n"
        "from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor\n\n"
        "torch.distributed.init_process_group('nccl')\nprocessor = AutoProcessor.from_pretrained('acme/tiny-lm')\n"
        "config = AutoConfig.from_pretrained('acme/tiny-lm')\n"
        "config.pad_token_id = getattr(processor, 'tokenizer', processor).pad_token_id\n"
        "model = AutoModelForCausalLM.from_config(config)\nfully_shard(model)\n")
    res = cli("train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    assert "train.py:8:" in res.err and "no tokenizer for 'acme/tiny-lm' here" in res.err
    assert "Unrecognized processing class" not in res.err


def test_a_script_in_a_package_folder_imports_its_own_folder_first(cli, tmp_path):
    # `python src/train.py` searches src/ first: its `datasets/` package is the one `import datasets.toy` finds, not
    # Hugging Face's (the oracle: python itself, on a probe beside it); the file has an `__init__.py` beside it
    import subprocess
    import sys as _sys

    write_tree(tmp_path, {
        "src/__init__.py": "",
        "src/datasets/__init__.py": "",
        "src/datasets/toy.py": "N_BLOCKS = 5\n",
        "src/probe.py": "import datasets.toy\nprint(datasets.toy.N_BLOCKS)\n",
        "src/train.py": '''
            from __future__ import annotations

            import torch
            import torch.nn as nn
            from torch.distributed.fsdp import fully_shard

            from datasets.toy import N_BLOCKS

            torch.distributed.init_process_group("nccl")
            model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(N_BLOCKS)])
            for layer in model:
                fully_shard(layer)
            fully_shard(model)
        ''',
    })
    probe = subprocess.run([_sys.executable, "src/probe.py"], cwd=tmp_path, capture_output=True, text=True)
    assert probe.stdout.strip() == "5", probe.stderr
    res = cli("src/train.py", "-n", "2", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert len(json.loads(res.out)["files"][0]["plan"]["units"]) == 5 + 1


def test_a_module_that_checks_the_values_it_computes_in_its_init(cli, tmp_path, monkeypatch):
    # `freqs = 2.0 ** torch.linspace(0, 8, 16)` then `assert freqs.isfinite().all()` in a module's __init__: the
    # small tensor made from values holds them (on meta the check read False and failed); the plan is real FSDP2's
    from oracle import fsdp2_groups
    from torch.distributed.fsdp import fully_shard

    write_tree(tmp_path, {
        "fold/__init__.py": "",
        "fold/embed.py": '''
            from __future__ import annotations

            import torch
            import torch.nn as nn


            class FourierEmbed(nn.Module):
                def __init__(self, dim: int = 64, n_freqs: int = 16, max_freq: float = 8.0):
                    super().__init__()
                    bands = 2.0 ** torch.linspace(0.0, max_freq, steps=n_freqs)
                    assert bands.isfinite().all(), f"nan: {bands.isnan().any()}"
                    self.register_buffer("bands", bands, persistent=False)
                    self.proj = nn.Linear(2 * n_freqs, dim)


            class Net(nn.Module):
                def __init__(self, dim: int = 64, depth: int = 3):
                    super().__init__()
                    self.embed = FourierEmbed(dim)
                    self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        ''',
        "train.py": '''
            from __future__ import annotations

            import torch
            from torch.distributed.fsdp import fully_shard

            from fold.embed import Net

            torch.distributed.init_process_group("nccl")
            model = Net()
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        ''',
    })
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    monkeypatch.syspath_prepend(str(tmp_path))
    from fold.embed import Net

    def apply(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    real = fsdp2_groups(Net, world_size=4, apply=apply, device="cpu")
    assert [u["numel"] for u in plan["units"]] == [sum(_numel(p["shape"]) for p in g["params"]) for g in real]


def test_a_logger_stood_in_for_is_handed_to_hydras_instantiate(cli, tmp_path):
    # Lightning's TensorBoardLogger without tensorboard: Lightning's DummyLogger stands in, and the Trainer is built
    # by `hydra.utils.instantiate(cfg, strategy=..., logger=[it])`; OmegaConf read the stand-in's `_metadata` (any
    # name answered a function) and failed, where a node's logger has no such attribute
    import importlib.util

    write_tree(tmp_path, {"train.py": '''
        from __future__ import annotations

        import hydra
        import lightning.pytorch as pl
        import torch
        import torch.nn as nn
        from lightning.pytorch.strategies import FSDPStrategy
        from omegaconf import OmegaConf

        TRAINER = {"_target_": "lightning.pytorch.Trainer", "accelerator": "gpu", "devices": "auto",
                   "precision": "bf16-mixed", "max_steps": 10}
        LOGGER = {"_target_": "lightning.pytorch.loggers.TensorBoardLogger", "save_dir": "logs"}


        class Lit(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])

            def training_step(self, batch, _):
                return self.blocks(batch).sum()

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters())


        def main():
            model = Lit()
            loggers = [hydra.utils.instantiate(OmegaConf.create(LOGGER))]
            strategy = FSDPStrategy(auto_wrap_policy={nn.Linear})
            trainer = hydra.utils.instantiate(OmegaConf.create(TRAINER), strategy=strategy, logger=loggers)
            trainer.fit(model, train_dataloaders=torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=8))


        if __name__ == "__main__":
            main()
    '''})
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert len(f["plan"]["units"]) == 3 + 1 and f["plan"]["world_size"] == 4
    if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
        assert any("DummyLogger stood in" in n for n in f["notes"])


def test_a_data_helper_that_writes_what_the_model_is_built_from(cli, tmp_path, monkeypatch):
    # `train_ds, train_dl = init_dataset_and_dataloader(configs, path)` sets `configs["vocab_size"]` (WeNet's idiom);
    # its results are not read before the wrap, so the call was left out and the model failed on the missing key
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, {
        "asr/__init__.py": "",
        "asr/data.py": '''
            from __future__ import annotations

            from torch.utils.data import DataLoader, Dataset


            class Utterances(Dataset):
                def __init__(self, path: str):
                    with open(path) as fh:
                        self.items = [line.split() for line in fh]

                def __len__(self):
                    return len(self.items)


            def init_dataset_and_dataloader(configs: dict, path: str):
                configs["vocab_size"] = 4233          # the tokenizer's units: the model's output size
                dataset = Utterances(path)
                return dataset, DataLoader(dataset, batch_size=None)
        ''',
        "asr/model.py": '''
            from __future__ import annotations

            import torch.nn as nn


            class Block(nn.Module):
                def __init__(self, d: int):
                    super().__init__()
                    self.ff = nn.Linear(d, d)


            class Net(nn.Module):
                def __init__(self, configs: dict):
                    super().__init__()
                    self.emb = nn.Embedding(configs["vocab_size"], configs["d"])
                    self.blocks = nn.ModuleList(Block(configs["d"]) for _ in range(configs["n"]))
                    self.out = nn.Linear(configs["d"], configs["vocab_size"])
        ''',
        "train.py": '''
            from __future__ import annotations

            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            from asr.data import init_dataset_and_dataloader
            from asr.model import Block, Net


            def main():
                torch.distributed.init_process_group("nccl")
                configs = {"d": 64, "n": 3}
                train_ds, train_dl = init_dataset_and_dataloader(configs, "data/train/data.list")
                model = Net(configs)
                model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())


            if __name__ == "__main__":
                main()
        ''',
    })
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    monkeypatch.syspath_prepend(str(tmp_path))
    from asr.model import Block, Net

    real = fsdp1_units(lambda: Net({"d": 64, "n": 3, "vocab_size": 4233}), world_size=4,
                       auto_wrap_policy=ModuleWrapPolicy({Block}))
    assert [(u["module"], u["numel"]) for u in plan["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]


def test_a_project_subclass_of_fsdp_with_its_own_constructor(cli, tmp_path, monkeypatch):
    # `class FSDPWrapper(FullyShardedDataParallel): def __init__(self, opts, model): super().__init__(module=model,
    # ...)` called `FSDPWrapper(opts=..., model=model)`: the recorder took `opts` for the module (or had none), the
    # wrap was skipped and a plan suggested (exit 0). The plan is the one real FSDP1 builds through the subclass
    import torch
    import torch.nn as nn
    from oracle import fake_pg, strip_wrapper_prefixes
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    write_tree(tmp_path, {
        "corelib/__init__.py": "",
        "corelib/fsdp_wrapper.py": '''
            from __future__ import annotations

            import functools

            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


            class FSDPWrapper(FullyShardedDataParallel):
                def __init__(self, opts: dict, model, block_cls):
                    self.opts = opts
                    super().__init__(
                        module=model,
                        sharding_strategy=ShardingStrategy[opts.get("strategy", "FULL_SHARD")],
                        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={block_cls}),
                        device_id=opts["device"] if "device" in opts else torch.cuda.current_device(),
                    )
        ''',
        "train.py": '''
            from __future__ import annotations

            import torch
            import torch.nn as nn

            from corelib.fsdp_wrapper import FSDPWrapper


            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(64, 64)

                def forward(self, x):
                    return self.fc(x)


            torch.distributed.init_process_group("nccl")
            model = nn.Sequential(*[Block() for _ in range(4)])
            fsdp_model = FSDPWrapper(opts={"strategy": "SHARD_GRAD_OP"}, model=model, block_cls=Block)
            optimizer = torch.optim.AdamW(fsdp_model.parameters(), lr=1e-4)
        ''',
    })
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["api"] == "fsdp1" and plan["origin"] != "suggested" and plan["sharding_strategy"] == "SHARD_GRAD_OP"
    monkeypatch.syspath_prepend(str(tmp_path))
    from corelib.fsdp_wrapper import FSDPWrapper

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

    with fake_pg(4):
        real = FSDPWrapper(opts={"strategy": "SHARD_GRAD_OP", "device": torch.device("cpu")},
                           model=nn.Sequential(*[Block() for _ in range(4)]), block_cls=Block)
        units = sorted(strip_wrapper_prefixes(name) for name, m in real.named_modules() if isinstance(m, FSDP))
    assert sorted(u["module"] for u in plan["units"]) == units


def test_what_the_scripts_except_caught_after_the_wrap_is_named_with_what_fails_next(cli, tmp_path, monkeypatch):
    # the installed trainer wraps, then refuses the data config's placeholder bucket (a node refuses it too); the
    # script's `except` logs it and its next lines fail on the stats training never wrote: the one line names both
    site, project = tmp_path / "site-packages", tmp_path / "project"
    lib = TRAINER_LIB.replace('''    with open(url.replace("s3://", "/mnt/s3/")) as fh:       # the node's mounted bucket
        return [line.split() for line in fh]''', '''    bucket = url.split("/")[2]
    if not bucket.replace("-", "").isalnum():
        raise ValueError(f"Invalid bucket name {bucket!r}")
    return []''')
    write_tree(site, {"trainerlib_round16c/__init__.py": "", "trainerlib_round16c/main.py": lib})
    project.mkdir()
    (project / "train.py").write_text(RUNNER.replace("trainerlib_round16.main", "trainerlib_round16c.main")
                                      .replace("s3://bucket/manifest.jsonl", "s3://***REMOVED***/manifest.jsonl"))
    (project / "models.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(project))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "Could not find stats" in line
    assert "after the wrap, the script's `except` at train.py:18 caught: ValueError: Invalid bucket name" in line


def test_a_workspace_member_not_installed_is_named_as_the_repositorys_own(cli, tmp_path):
    # `mylib/src/mylib/` (a workspace member, installed with `pip install -e mylib` on the node): its folder at the
    # root imports as an empty namespace package, and the line called it "the installed mylib"
    write_tree(tmp_path, {
        "pyproject.toml": "[project]\nname = 'trainer'\nversion = '0'\n",
        "mylib/pyproject.toml": "[project]\nname = 'mylib'\nversion = '0'\n",
        "mylib/src/mylib/__init__.py": "import torch.nn as nn\n\n\nclass Block(nn.Linear):\n    pass\n",
        "scripts/train.py": '''
            from __future__ import annotations

            import torch
            import torch.nn as nn
            from torch.distributed.fsdp import fully_shard

            from mylib import Block

            torch.distributed.init_process_group("nccl")
            model = nn.Sequential(Block(16, 16), Block(16, 16))
            fully_shard(model)
        ''',
    })
    res = cli("scripts/train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "the installed mylib" not in line
    assert "`mylib` is the repository's own package mylib/src/mylib" in line and "pip install -e mylib" in line


def test_an_error_another_process_raised_is_said_with_its_own_last_line():
    # Ray's `RayTaskError` says `ray::main_task() (pid=..., ip=...)`, then the worker's traceback: the worker's own
    # error (its last line) is the cause the one line gives
    from fsdp_lint.replay.one_line import one_line

    class RayTaskError(RuntimeError):
        pass

    worker = ("ray::main_task() (pid=4242, ip=10.1.2.3)\nTraceback (most recent call last):\n"
              '  File "verl/trainer/main_ppo.py", line 90, in main_task\n    from tensordict import TensorDict\n'
              "ImportError: tensordict 0.5.0 needs torch<2.6")
    line = one_line(RayTaskError(worker))
    assert line.startswith("RayTaskError: ray::main_task() (pid=4242, ip=10.1.2.3)")
    assert line.endswith("ImportError: tensordict 0.5.0 needs torch<2.6")
