"""Round 15 of the real-launch survey: the simulated node answering as a GPU node would (meshes bound from
torch's alias modules, files loaded in a module's ``__init__``, index tensors, the project's print patch,
data sets filled from missing files, other ranks' files, snapshot weights, stand-in weights saved, CUDA-only
packages). Each fixture is written in the idiom met; the oracle is real torch, python or the library itself."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import REPO, run_subprocess, write_tree  # noqa: E402




def _plan(res):
    return json.loads(res.out)["files"][0]["plan"]


# composer's idiom: the mesh function bound from torch's deprecated alias module, in a helper module of the project
MESH_HELPER = '''
    from __future__ import annotations

    {import_line}


    def data_parallel_mesh(world: int):
        return init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("replicate", "shard"))
'''
MESH_TRAIN = '''
    from __future__ import annotations

    import sys

    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    from project.parallel import data_parallel_mesh

    dist.init_process_group("nccl")
    mesh = data_parallel_mesh(dist.get_world_size())
    model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(int(sys.argv[1]))])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
'''


@pytest.mark.parametrize("import_line", [
    "from torch.distributed._tensor.device_mesh import init_device_mesh",
    "from torch.distributed.tensor.device_mesh import init_device_mesh",
    "from torch.distributed.tensor import init_device_mesh",
])
def test_init_device_mesh_bound_from_an_alias_module_is_the_simulated_mesh(cli, tmp_path, import_line):
    # the oracle: python says every alias module holds torch's one init_device_mesh, so a script binding it from
    # any of them builds the same mesh as one binding it from torch.distributed.device_mesh
    module = import_line.split()[1]
    probe = run_subprocess(["-c", "import warnings; warnings.simplefilter('ignore'); import importlib; "
                                  "import torch.distributed.device_mesh as d; "
                                  f"print(importlib.import_module('{module}').init_device_mesh is d.init_device_mesh)"])
    assert probe.stdout.strip() == "True", probe.stderr
    plans = []
    for name, line in (("alias", import_line), ("control", "from torch.distributed.device_mesh import init_device_mesh")):
        root = tmp_path / name
        write_tree(root, {"train.py": MESH_TRAIN, "project/__init__.py": "",
                     "project/parallel.py": MESH_HELPER.format(import_line=line)})
        res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "3", cwd=str(root))
        assert res.code in (0, 1), res.err
        plans.append(_plan(res))
    alias, control = plans
    assert alias["mesh"]["shape"] == control["mesh"]["shape"] == [2, 4]
    assert [u["shard_group_size"] for u in alias["units"]] == [u["shard_group_size"] for u in control["units"]] == [4] * 4
    assert [u["replicate_group_size"] for u in alias["units"]] == [2] * 4


# torchtools' SmartCrop: a module loads a small bundled checkpoint in its constructor, and what it holds decides the
# model (here the depth); a file that exists is loaded for real, whoever's __init__ loads it
BUNDLED_LOAD = {
    "train.py": '''
        from __future__ import annotations

        import sys

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from project.model import Block, Net

        dist.init_process_group("nccl")
        model = FSDP(Net(sys.argv[1]), auto_wrap_policy=ModuleWrapPolicy([Block]), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/model.py": '''
        from __future__ import annotations

        import os

        import torch
        import torch.nn as nn

        HERE = os.path.dirname(__file__)


        def load_bundled(name: str) -> dict:
            path = os.path.join(HERE, name)
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                return load_file(path)
            return torch.load(path, map_location="cpu")


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(64, 64)


        class Net(nn.Module):
            def __init__(self, bundled: str):
                super().__init__()
                state = load_bundled(bundled)
                self.crop = nn.Conv2d(3, 1, 3).requires_grad_(False)
                self.crop.load_state_dict({k: v for k, v in state.items() if k != "depth"})
                self.blocks = nn.ModuleList(Block() for _ in range(int(state["depth"])))
    ''',
}


@pytest.mark.parametrize("bundled", ["legacy.pt", "zip.pt", "weights.safetensors"])
def test_a_bundled_file_loaded_in_a_module_init_holds_its_values(cli, tmp_path, bundled):
    write_tree(tmp_path, BUNDLED_LOAD)
    import torch
    import torch.nn as nn

    state = dict(nn.Conv2d(3, 1, 3).state_dict(), depth=torch.tensor(3))
    path = tmp_path / "project" / bundled
    if bundled.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(state, str(path))
        from safetensors.torch import load_file
        depth = int(load_file(str(path))["depth"])
    else:
        torch.save(state, str(path), _use_new_zipfile_serialization=bundled == "zip.pt")
        depth = int(torch.load(str(path), map_location="cpu")["depth"])     # the oracle: torch itself
    assert depth == 3
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", bundled, cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = _plan(res)
    assert sum(u["class"] == "Block" for u in plan["units"]) == depth


# SpecForge: a frozen head built from the hub model's config, its weights found by a glob over the snapshot folder
# of snapshot_download(allow_patterns=[...]); the local cache holds the config only (a node downloads the weights)
SNAPSHOT_GLOB = {
    "train.py": '''
        from __future__ import annotations

        import sys

        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        from project.target import TargetHead

        torch.distributed.init_process_group("nccl")
        model = nn.ModuleDict({"target": TargetHead.from_pretrained(sys.argv[1]),
                               "draft": nn.Sequential(*[nn.Linear(32, 32) for _ in range(2)])})
        for block in model["draft"]:
            fully_shard(block)
        fully_shard(model)
    ''',
    "project/__init__.py": "",
    "project/target.py": '''
        from __future__ import annotations

        import glob
        import os

        import torch.nn as nn
        from huggingface_hub import snapshot_download
        from safetensors.torch import load_file
        from transformers import AutoConfig


        class TargetHead(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
                self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

            @classmethod
            def from_pretrained(cls, repo: str) -> "TargetHead":
                head = cls(AutoConfig.from_pretrained(repo))
                path = snapshot_download(repo_id=repo, allow_patterns=["*.json", "*.safetensors"])
                files = glob.glob(os.path.join(path, "*.safetensors"))
                if not files:
                    raise FileNotFoundError("No checkpoint found.")
                state = load_file(files[0])
                head.embed_tokens.weight.data.copy_(state["model.embed_tokens.weight"])
                head.lm_head.weight.data.copy_(state["lm_head.weight"])
                return head.requires_grad_(False)
    ''',
}


def test_weights_globbed_from_a_snapshot_download_stand_in(tmp_path):
    write_tree(tmp_path, SNAPSHOT_GLOB)
    repo = tmp_path / "hf" / "hub" / "models--acme--tiny-lm"
    snapshot = repo / "snapshots" / ("1" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    (snapshot / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100}))
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"), "HF_HUB_OFFLINE": "1"}
    # the oracle: huggingface_hub offline gives the cached snapshot, which holds no weights (a node's has them)
    real = run_subprocess(["-c", "import glob, os; from huggingface_hub import snapshot_download; "
                                 "p = snapshot_download(repo_id='acme/tiny-lm', allow_patterns=['*.json', '*.safetensors']); "
                                 "print(sorted(os.listdir(p)), glob.glob(os.path.join(p, '*.safetensors')))"],
                          env=env)
    assert real.stdout.strip() == "['config.json'] []", real.stderr
    # (a process of its own: huggingface_hub reads the cache's place when it is imported)
    res = run_subprocess(["-m", "fsdp_lint", "train.py", "-n", "8", "--no-cache", "--format", "json", "--",
                          "acme/tiny-lm"], cwd=str(tmp_path), timeout=300, env={**env, "PYTHONPATH": REPO})
    assert res.returncode in (0, 1), res.stderr
    report = json.loads(res.stdout)["files"][0]
    import torch.nn as nn

    head = sum(p.numel() for p in (*nn.Embedding(100, 32).parameters(), *nn.Linear(32, 100, bias=False).parameters()))
    draft = 2 * sum(p.numel() for p in nn.Linear(32, 32).parameters())
    assert report["model"]["numel"] == head + draft
    assert report["model"]["trainable_numel"] == draft
    assert any("acme/tiny-lm" in n and "model.safetensors" in n for n in report["notes"]), report["notes"]
    assert not list((tmp_path / "hf").rglob("*.safetensors"))          # the cache is left as it was


# a project Dataset pre-initialises its sample list, then fills it from annotation files that are on the node only;
# __len__ is len(list): 0 here, and the shuffling sampler refuses an empty data set
EMPTY_DATASET = {
    "train.py": '''
        from __future__ import annotations

        import sys

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.utils.data import DataLoader

        from project.data import PairDataset

        dist.init_process_group("nccl")
        dataset = PairDataset(sys.argv[1])
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
        layers = 2 if len(loader) > 0 else 1
        model = FSDP(nn.Sequential(*[nn.Linear(64, 64) for _ in range(layers)]), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/data.py": '''
        from __future__ import annotations

        import json
        import os

        import torch
        from torch.utils.data import Dataset


        class PairDataset(Dataset):
            def __init__(self, root: str, lists=("data_info.json",)):
                self.samples = []
                for name in lists:
                    with open(os.path.join(root, name)) as f:
                        self.samples += json.load(f)

            def __len__(self):
                return len(self.samples)

            def __getitem__(self, i):
                return torch.randn(64)
    ''',
}


def test_a_dataset_left_empty_by_a_skipped_read_has_the_stand_in_length(cli, tmp_path):
    write_tree(tmp_path, EMPTY_DATASET)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "/cluster/annotations", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    report = json.loads(res.out)["files"][0]
    assert len(report["plan"]["units"]) == 1 and report["model"]["numel"] == 2 * (64 * 64 + 64)
    skipped = report["replay"]["skipped_statements"]
    assert any("data_info.json" in s["error"] and "length stands in" in s["error"] for s in skipped), skipped


def test_a_dataset_empty_on_the_node_too_is_the_scripts_failure(cli, tmp_path):
    # the annotation file is here and lists nothing: torch's sampler refuses the empty data set (the oracle)
    write_tree(tmp_path, EMPTY_DATASET)
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "data_info.json").write_text("[]")
    import torch.utils.data as tud

    with pytest.raises(ValueError, match="num_samples"):
        tud.RandomSampler([])
    res = cli("train.py", "-n", "8", "--no-cache", "--", "annotations", cwd=str(tmp_path))
    assert res.code == 2 and "num_samples" in res.err, res.err


# flex-attention style: a module's __init__ makes document ids from a Python list of lengths "on the GPU" with a
# data-dependent op (repeat_interleave); the number of documents sizes a parameter
INDEX_IN_INIT = {
    "train.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from project.model import Block, Net

        dist.init_process_group("nccl")
        model = FSDP(Net("cuda"), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/model.py": '''
        from __future__ import annotations

        import torch
        import torch.nn as nn


        class DocumentMask(nn.Module):
            def __init__(self, device, scales=((1, 1), (2, 2), (4, 4)), length: int = 32, dim: int = 16):
                super().__init__()
                lengths = [h * w for h, w in scales]
                offsets = torch.cumsum(torch.tensor([0] + lengths, device=device, dtype=torch.int32), dim=-1)
                if offsets[-1] < length:
                    offsets = torch.cat((offsets, torch.tensor([length], device=device, dtype=torch.int32)))
                counts = offsets[1:] - offsets[:-1]
                self.doc_id = torch.repeat_interleave(torch.arange(len(counts), device=device), counts)
                self.register_buffer("positions", torch.arange(self.doc_id.numel(), device=device))
                self.doc_embed = nn.Embedding(int(self.doc_id.max()) + 1, dim)


        class Block(nn.Module):
            def __init__(self, device):
                super().__init__()
                self.mask = DocumentMask(device)
                self.ff = nn.Linear(16, 16)


        class Net(nn.Module):
            def __init__(self, device):
                super().__init__()
                self.blocks = nn.ModuleList(Block(device) for _ in range(3))
    ''',
}


def test_an_index_tensor_a_module_init_computes_from_constants_holds_its_values(cli, tmp_path):
    write_tree(tmp_path, INDEX_IN_INIT)
    sys.path.insert(0, str(tmp_path))
    try:
        from project.model import Net   # the oracle: real torch builds the model on the CPU
        real = Net("cpu")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "project" or m.startswith("project.")]:
            del sys.modules[name]
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    report = json.loads(res.out)["files"][0]
    assert report["model"]["numel"] == sum(p.numel() for p in real.parameters())
    embed = [p for u in report["plan"]["units"] for p in u["params"] if p["fqn"].endswith("doc_embed.weight")]
    assert [p["shape"] for p in embed] == [list(real.blocks[0].mask.doc_embed.weight.shape)] * 3


# DeiT/MAE/VAR's setup_for_distributed: builtins.print replaced by a rank-0 print taking force=, guarded so that it
# replaces only Python's own print (`type(print) != type(open)`: already replaced); the model prints with force=True
PRINT_PATCH = {
    "train.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from project.dist import setup_for_distributed
        from project.model import Block, Net

        dist.init_process_group("nccl")
        setup_for_distributed(dist.get_rank() == 0)
        print("setup done", force=True)
        model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/dist.py": '''
        from __future__ import annotations

        import builtins


        def setup_for_distributed(is_master: bool) -> None:
            builtin_print = builtins.print
            if type(builtin_print) != type(open):      # already replaced: keep it
                return

            def print(*args, force: bool = False, **kwargs):
                if is_master or force:
                    builtin_print(*args, **kwargs)

            builtins.print = print
    ''',
    "project/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ff = nn.Linear(64, 64)


        class Net(nn.Module):
            def __init__(self, n: int = 3):
                super().__init__()
                self.blocks = nn.ModuleList(Block() for _ in range(n))
                print(f"built {n} blocks", force=True)
    ''',
}


def test_the_projects_print_replacement_works_as_on_a_node_and_is_undone(cli, tmp_path):
    write_tree(tmp_path, PRINT_PATCH)
    import builtins

    # the oracle: python itself runs the project's replacement, and print then takes force=
    probe = run_subprocess(["-c", "from project.dist import setup_for_distributed; setup_for_distributed(False); "
                                  "print('hidden'); print('shown', force=True)"], cwd=str(tmp_path))
    assert probe.returncode == 0 and probe.stdout.strip() == "shown", probe.stderr
    before = builtins.print
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert len(json.loads(res.out)["files"][0]["plan"]["units"]) == 4
    assert builtins.print is before


# Model-Optimizer's _merge_distributed_shards: each rank saves its data shard, a barrier, then rank 0 loads every
# rank's folder and concatenates them; the other ranks' folders are not on the simulated node
RANK_SHARDS = {
    "train.py": '''
        from __future__ import annotations

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        from project.data import merged_shards

        dist.init_process_group("nccl")
        merged = merged_shards("shards_cache")
        layers = 2 if merged is not None and len(merged) == 4 * dist.get_world_size() else 1
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(layers)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    ''',
    "project/__init__.py": "",
    "project/data.py": '''
        from __future__ import annotations

        import os

        import datasets
        import torch.distributed as dist


        def merged_shards(cache: str):
            rank, world = dist.get_rank(), dist.get_world_size()
            tmp = os.path.join(cache, "temp")
            local = datasets.Dataset.from_dict({"input_ids": [[rank, 1, 2]] * 4})
            local.save_to_disk(os.path.join(tmp, f"rank_{rank}"))
            dist.barrier()
            if rank != 0:
                return None
            shards = [datasets.load_from_disk(os.path.join(tmp, f"rank_{r}")) for r in range(world)]
            return datasets.concatenate_datasets(shards).shuffle(seed=0)
    ''',
}


def test_other_ranks_data_shards_saved_before_a_barrier_load_as_rank_0s(cli, tmp_path):
    write_tree(tmp_path, RANK_SHARDS)
    import datasets

    # the oracle: the datasets library itself, every rank's folder saved (as on a node), merged by rank 0
    for r in range(8):
        datasets.Dataset.from_dict({"input_ids": [[r, 1, 2]] * 4}).save_to_disk(str(tmp_path / "oracle" / f"rank_{r}"))
    merged = datasets.concatenate_datasets([datasets.load_from_disk(str(tmp_path / "oracle" / f"rank_{r}"))
                                            for r in range(8)])
    assert len(merged) == 32
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    report = json.loads(res.out)["files"][0]
    assert report["model"]["numel"] == 2 * (64 * 64 + 64)
    assert any("rank 0's" in n for n in report["notes"]), report["notes"]
    assert not (tmp_path / "shards_cache").exists()          # what the replay wrote is removed


# rank 0 keeps a copy of a frozen pretrained component next to the run's outputs during setup, and the trained
# model is built from that copy's config; the component's weights are not here (a config-only folder)
SAVE_PRETRAINED = {
    "train.py": '''
        from __future__ import annotations

        import os
        import sys

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoConfig, LlamaForCausalLM

        from project.model import Denoiser

        dist.init_process_group("nccl")
        encoder = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
        if dist.get_rank() == 0:
            encoder.save_pretrained(os.path.join("out", "text_encoder"))
        dist.barrier()
        encoder.requires_grad_(False)
        model = Denoiser(AutoConfig.from_pretrained(os.path.join("out", "text_encoder")).hidden_size)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    ''',
    "project/__init__.py": "",
    "project/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Denoiser(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
    ''',
}


def test_save_pretrained_of_stand_in_weights_writes_the_config_only(cli, tmp_path):
    write_tree(tmp_path, SAVE_PRETRAINED)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=100)
    config.save_pretrained(str(tmp_path / "encoder"))
    # the oracle: transformers refuses to save weights that hold no data (the stand-ins), and saves real ones
    import torch

    with torch.device("meta"):
        meta_model = LlamaForCausalLM(config)
    with pytest.raises(Exception):
        meta_model.save_pretrained(str(tmp_path / "oracle_meta"))
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "encoder", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    report = json.loads(res.out)["files"][0]
    assert report["model"]["numel"] == 3 * (48 * 48 + 48)
    assert not report["replay"]["skipped_statements"], report["replay"]["skipped_statements"]
    assert any("save_pretrained" in n and "no weights" in n for n in report["notes"]), report["notes"]
    assert not (tmp_path / "out").exists()          # what the replay wrote is removed


# a model probes a CUDA-only kernel package's function signature at construction to pick a code path; the package's
# build needs CUDA, so it cannot be installed on a CPU-only linting machine (every GPU node has it)
KERNEL_PROBE = {
    "train.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from project.model import Block, Net

        dist.init_process_group("nccl")
        model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/model.py": '''
        from __future__ import annotations

        import torch.nn as nn
        from flash_attn import flash_attn_func


        class Block(nn.Module):
            def __init__(self, d: int = 64):
                super().__init__()
                self.fused = "softmax_scale" in flash_attn_func.__code__.co_varnames
                self.qkv = nn.Linear(d, 3 * d)


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList(Block() for _ in range(2))
    ''',
}


def test_a_cuda_only_kernel_introspected_by_the_model_is_named_as_not_installable_here(cli, tmp_path):
    write_tree(tmp_path, KERNEL_PROBE)
    import importlib.util

    import torch

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    # the model reads the function's code: a use by the model, named (not an AttributeError of the stand-in)
    assert "project/model.py:11:" in line and "flash_attn_func.__code__" in line and "AttributeError" not in line, line
    if torch.version.cuda is None:
        # (the oracle: a CPU-only torch cannot build flash-attn's CUDA kernels)
        assert "cannot be installed on this machine" in line, line
