"""Round 17 of the real-launch survey: the classes it found, each on a fixture in the idiom. The oracle is real FSDP1
under the fake process group, and python itself for what python does."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402

HYDRA_NAMED_TRAINER = {
    "conf/config.yaml": '''
        _trainer_: recipes.trainer.Trainer
        width: 64
        depth: 3
    ''',
    "recipes/__init__.py": "",
    "recipes/trainer.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy


        class Block(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                return x + self.ff(x)


        class Net(nn.Module):
            def __init__(self, width: int, depth: int):
                super().__init__()
                self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
                self.out = nn.Linear(width, 10)


        class Trainer:
            def __init__(self, width: int, depth: int):
                dist.init_process_group("nccl")
                self.model = FSDP(Net(width, depth), auto_wrap_policy=ModuleWrapPolicy({Block}),
                                  device_id=torch.cuda.current_device())

            def run(self):
                for step in range(10):
                    self.model(torch.zeros(2, 64)).sum().backward()
    ''',
    "train.py": '''
        from __future__ import annotations

        import hydra
        from omegaconf import DictConfig


        @hydra.main(version_base="1.2", config_path="conf", config_name="config")
        def main(config: DictConfig) -> None:
            trainer_cls = hydra.utils.get_object(config._trainer_)     # the recipe names its trainer
            trainer_cls(config.width, config.depth).run()


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_bare_double_dash_launches_the_file_with_no_arguments(cli, tmp_path, monkeypatch):
    # `fsdp-lint train.py --`: the file is launched as `python train.py` (nothing after `--`), as `-- ARGS` launches
    # it; its model, named only in the recipe's config, is never seen by reading the file -- it was "skipped (no
    # model or FSDP use)", exit 0, a silent pass in CI
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, HYDRA_NAMED_TRAINER)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    monkeypatch.syspath_prepend(str(tmp_path))
    from recipes.trainer import Block, Net

    real = fsdp1_units(lambda: Net(64, 3), world_size=8, auto_wrap_policy=ModuleWrapPolicy({Block}))
    assert [(u["module"], u["numel"]) for u in f["plan"]["units"] if u["numel"]] == \
        [(r["module"], r["numel"]) for r in real]
    # the control: without `--` the file is screened, and its syntax reaches no model
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 0 and "skipped" in (res.out + res.err)


def test_hydras_own_failure_in_an_entry_whose_trainer_is_named_in_its_config(cli, tmp_path):
    # the recipe's defaults name a config group no package registered here or on the node: Hydra stops before
    # main() runs, as `python train.py` does; it was "no model found" (the file's syntax reaches no wrap)
    tree = dict(HYDRA_NAMED_TRAINER)
    tree["conf/config.yaml"] = '''
        defaults:
          - launcher: submitit
          - _self_
        _trainer_: recipes.trainer.Trainer
        width: 64
        depth: 3
    '''
    write_tree(tmp_path, tree)
    res = cli("train.py", "-n", "8", "--no-cache", "--", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "MissingConfigException" in line and "launcher/submitit" in line, line


FRAMEWORK_FACTORY = {
    "scripts/pretrain.sh": '''
        #!/bin/bash
        torchrun --standalone --nproc-per-node=8 train.py --arch base_1b
    ''',
    "train.py": '''
        """The model is made by a framework's loader and wrapped by its FSDP helper; the framework is not installed."""
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        from seqframework.models import load_model_card
        from seqframework.nn.fsdp import to_fsdp
        from seqframework.optim import AdamW


        def main():
            dist.init_process_group("nccl")
            model = load_model_card("base_1b", device=torch.device("cuda"), dtype=torch.float16)
            model = to_fsdp(model, wrap_policy=None, mixed_precision_dtype=torch.float16)
            optimizer = AdamW(model.parameters(), lr=1e-4)      # the framework's own optimizer too
            for step in range(10):
                optimizer.step()


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_model_made_and_wrapped_by_a_framework_not_installed_names_the_framework(cli, tmp_path):
    # python stops at the import; fsdp-lint stands the framework in and goes on, and nothing builds a model: the
    # cause is the framework's loader the setup calls, named with its package (it was "no model found")
    write_tree(tmp_path, FRAMEWORK_FACTORY)
    res = cli("scripts/pretrain.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "train.py:14: the setup calls `load_model_card()`" in line and "`seqframework` is not installed" in line, line


# -- launch scripts: bash is the oracle (the script run with the launchers replaced by echo) -----------------------

FUNCTIONS = '''\
#!/usr/bin/env bash
# a helper that reads its own arguments, defined before the script's argument loop and called in a substitution
make_suffix() {
  local suffix=""
  while [[ "$#" -gt 0 ]]; do
    case $1 in
      --layers) suffix+="_l$2"; shift 2 ;;
      *) shift ;;
    esac
  done
  echo "$suffix"
}
launch() {
  torchrun --nproc_per_node="$1" train_a.py --layers "$2" --lr 0.5
}
LAYERS=2
NPROC=2
TAG="exp$(make_suffix "$@")"
while [[ "$#" -gt 0 ]]; do
  case "$1" in
    --layers) LAYERS="$2"; shift 2 ;;
    --nproc) NPROC="$2"; shift 2 ;;
    *) exit 1 ;;
  esac
done
launch "$NPROC" "$LAYERS"
'''


def test_shell_functions_run_where_they_are_called_with_their_own_arguments(cli, tmp_path):
    # a definition runs nothing where it stands (its argument loop used to eat the script's arguments: layers 2, a
    # wrong plan with exit 0); a call runs its body with the call's arguments
    from test_survey_round15_launch import NETS, TRAIN_ARGS, _bash_echo, _plan

    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, "run.sh": FUNCTIONS, **NETS})
    given = ["--layers", "5", "--nproc", "4"]
    [ran] = _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node=4", "train_a.py", "--layers", "5", "--lr", "0.5"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["args"] == ["--layers", "5", "--lr", "0.5"] and f["plan"]["world_size"] == 4
    assert len(f["plan"]["units"]) == 5 + 1


EXPANSIONS = '''\
#!/usr/bin/env bash
PROMPT=16
RESPONSE=32
MAX_LEN=$(expr $PROMPT + $RESPONSE + 8)
LOG=out/log
mkdir -p $LOG
torchrun --nproc_per_node=2 train_a.py --lr "$MAX_LEN" "${@:2}" \\
  > >(tee $LOG/train.log) \\
  2> >(tee $LOG/train.err >&2)
'''


def test_expr_chains_positional_slices_and_process_substitutions_as_bash_reads_them(cli, tmp_path):
    # `$(expr A + B + C)` is computed, `"${@:2}"` is the arguments from the second, and `> >(tee log)` is where the
    # output goes, not the program's arguments
    from test_survey_round15_launch import NETS, TRAIN_ARGS, _bash_echo, _plan

    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, "run.sh": EXPANSIONS, **NETS})
    given = ["ignored", "--layers", "3"]
    ran = _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path)[0]
    assert ran.split() == ["torchrun", "--nproc_per_node=2", "train_a.py", "--lr", "56", "--layers", "3"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["args"] == ["--lr", "56", "--layers", "3"] and len(f["plan"]["units"]) == 3 + 1


def test_slices_and_substrings_expand_as_bash_expands_them():
    import subprocess

    from fsdp_lint.entry.bash_words import _expanded_words

    env = {"NAME": "qwen2.5-7b-instruct"}
    text = '"${@:2}" ${@:1:1} ${NAME:0:5} ${NAME: -8} ${NAME:6:3}'
    given = ["a", "b c", "d"]
    bash = subprocess.run(["bash", "-c", f'NAME={env["NAME"]}; for w in {text}; do echo "$w"; done', "run.sh",
                           *given], capture_output=True, text=True, check=True).stdout.splitlines()
    assert _expanded_words(text, env, given) == bash


ADAPTER_WRAPPER = {
    "train.py": '''
        from __future__ import annotations

        import torch.distributed as dist
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP


        class InterventionWrapper(nn.Module):
            """An adapter library's wrapper (pyvene's style): its `named_parameters` lists the adapters only."""

            def __init__(self, base: nn.Module, dim: int):
                super().__init__()
                self.model = base
                self.adapters = nn.ModuleDict({"a0": nn.Linear(dim, 4), "a1": nn.Linear(dim, 4)})
                for p in self.model.parameters():
                    p.requires_grad_(False)

            def named_parameters(self, recurse=True):       # torch's keywords not taken
                for name, mod in self.adapters.items():
                    for n, p in mod.named_parameters():
                        yield f"{name}.{n}", p


        def main():
            dist.init_process_group("nccl")
            model = InterventionWrapper(nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]), 256)
            model = DDP(model)


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_model_overriding_named_parameters_is_read_as_torch_holds_it(cli, tmp_path, monkeypatch):
    # the override takes no `remove_duplicate` (an internal error) and hides the frozen base (a plan of 2K parameters):
    # the model holds what its modules register, as `nn.Module.named_parameters` walks them
    import torch.nn as nn

    write_tree(tmp_path, ADAPTER_WRAPPER)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    model = json.loads(res.out)["files"][0]["model"]
    monkeypatch.syspath_prepend(str(tmp_path))
    base = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    expected = sum(p.numel() for p in base.parameters()) + 2 * (256 * 4 + 4)
    assert model["numel"] == expected and model["trainable_numel"] == 2 * (256 * 4 + 4), model


SIZE_BUFFER = {
    "interventions.py": '''
        from __future__ import annotations

        import torch
        import torch.nn as nn


        class LowRankRotate(nn.Module):
            def __init__(self, n, m):
                super().__init__()
                self.weight = nn.Parameter(torch.empty(n, m))
                nn.init.orthogonal_(self.weight)


        class Intervention(nn.Module):
            """A size kept as a 0-dim integer buffer (saved with the intervention), then used to size a weight."""

            def __init__(self, embed_dim: int, rank: int):
                super().__init__()
                self.register_buffer("embed_dim", torch.tensor(embed_dim))
                self.rotate = LowRankRotate(self.embed_dim, rank)
                self.source = nn.Linear(embed_dim, rank)


        class Net(nn.Module):
            def __init__(self, dim: int = 256, depth: int = 4):
                super().__init__()
                self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
                self.interventions = nn.ModuleList(Intervention(dim, 4) for _ in range(2))
    ''',
    "train.py": '''
        from __future__ import annotations

        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        from interventions import Net


        def main():
            dist.init_process_group("nccl")
            model = Net()
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_size_kept_in_a_scalar_integer_buffer_sizes_the_weight_it_is_given_to(cli, tmp_path, monkeypatch):
    # `register_buffer("embed_dim", torch.tensor(dim))` then `torch.empty(self.embed_dim, rank)`: the buffer holds
    # the size, as on the node (it was `Tensor.item() cannot be called on meta tensors`)
    from oracle import fsdp2_groups
    from torch.distributed.fsdp import fully_shard

    write_tree(tmp_path, SIZE_BUFFER)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    monkeypatch.syspath_prepend(str(tmp_path))
    from interventions import Net

    def apply(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    real = fsdp2_groups(Net, world_size=8, apply=apply, device="cpu")     # (on meta it fails as it did here)
    assert [sorted(p["fqn"] for p in u["params"]) for u in plan["units"]] == \
        [sorted(p["fqn"] for p in g["params"]) for g in real]
    shapes = {p["fqn"]: p["shape"] for u in plan["units"] for p in u["params"]}
    assert shapes["interventions.0.rotate.weight"] == [256, 4]


PARAMETRIZED = {
    "train.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard
        from torch.nn.utils import parametrizations


        class Rotate(nn.Module):
            def __init__(self, n: int, r: int):
                super().__init__()
                self.weight = nn.Parameter(torch.empty(n, r))
                nn.init.orthogonal_(self.weight)


        class Net(nn.Module):
            def __init__(self, dim: int = 128, depth: int = 3):
                super().__init__()
                self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
                self.rotate = parametrizations.orthogonal(Rotate(dim, 4))


        def main():
            dist.init_process_group("nccl")
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            initial = {k: v.clone() for k, v in model.state_dict().items()}     # a copy kept for later
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model, optimizer, initial


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_parametrized_weight_read_before_the_wrap_is_no_training_forward(cli, tmp_path, monkeypatch):
    # `model.state_dict()` computes the orthogonal parametrization (its module's forward, over a parameter the
    # optimizer holds): that was taken for the first training forward, before the wrap ("trains a model FSDP does
    # not wrap"); and torch's orthogonal map cannot compute its value on meta -- no check of the model fails there
    from oracle import fsdp2_groups
    from torch.distributed.fsdp import fully_shard

    write_tree(tmp_path, PARAMETRIZED)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    net = importlib.import_module("train").Net

    def apply(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    real = fsdp2_groups(net, world_size=8, apply=apply, device="cpu")
    assert plan["api"] == "fsdp2" and plan["origin"] != "suggested"
    assert [sorted(p["fqn"] for p in u["params"]) for u in plan["units"]] == \
        [sorted(p["fqn"] for p in g["params"]) for g in real]


SUB_PROJECT = {
    ".gitmodules": '[submodule "engine"]\n    path = engine\n    url = https://example.invalid/engine.git\n',
    "engine/setup.py": "from setuptools import find_packages, setup\nsetup(name='engine', packages=find_packages())\n",
    "engine/engine/__init__.py": "from .proto import DataProto\n",
    "engine/engine/proto.py": "class DataProto:\n    pass\n",
    "engine/engine/trainer/__init__.py": "",
    "engine/engine/trainer/main.py": '''
        from __future__ import annotations

        import sys

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        from engine import DataProto  # noqa: F401


        def main(overrides):
            dist.init_process_group("nccl")
            depth = int(dict(o.split("=", 1) for o in overrides).get("model.depth", 2))
            model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(depth)])
            for layer in model:
                fully_shard(layer)
            fully_shard(model)


        if __name__ == "__main__":
            main(sys.argv[1:])
    ''',
    "scripts/train.sh": '''
        #!/bin/bash
        # README: pip install -e ./engine, then run from the repository root
        torchrun --nproc_per_node=8 -m engine.trainer.main model.depth=3
    ''',
    "train_root.py": '''
        from __future__ import annotations

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        from engine import DataProto  # noqa: F401

        dist.init_process_group("nccl")
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(2)])
        fully_shard(model)
    ''',
}


def test_a_module_of_the_repositorys_sub_project_is_launched_from_it(cli, tmp_path):
    # `python -m engine.trainer.main` where engine is a git submodule the README installs (`pip install -e ./engine`):
    # the module is engine/engine/trainer/main.py, imported from the sub-project's folder (it was "no launch")
    write_tree(tmp_path, SUB_PROJECT)
    res = cli("scripts/train.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["path"].endswith(os.path.join("engine", "engine", "trainer", "main.py"))
    assert f["plan"]["world_size"] == 8
    import torch.nn as nn
    from oracle import fsdp2_groups
    from torch.distributed.fsdp import fully_shard

    def apply(model, mesh):
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    real = fsdp2_groups(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]), world_size=8, apply=apply)
    assert [[p["fqn"] for p in u["params"]] for u in f["plan"]["units"]] == \
        [[p["fqn"] for p in g["params"]] for g in real]


def test_a_sub_project_not_installed_is_named_with_its_install(cli, tmp_path):
    # from the repository's root the submodule's folder imports as an empty namespace package: python stops at
    # `from engine import DataProto`; the cause names the sub-project and its editable install, not "the installed
    # engine"
    import subprocess

    write_tree(tmp_path, SUB_PROJECT)
    py = subprocess.run([sys.executable, "-c", "from engine import DataProto"], cwd=tmp_path, capture_output=True,
                        text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert "cannot import name 'DataProto' from 'engine' (unknown location)" in py.stderr
    res = cli("train_root.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert "`engine` is the repository's sub-project engine/" in res.out + res.err
    assert "pip install -e engine" in res.out + res.err and "the installed engine" not in res.out + res.err


PLACEHOLDER_TOKENIZER = {
    "train.py": '''
        from __future__ import annotations

        import os

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoTokenizer

        # the recipe's template: "set LOAD_FROM to your pretrained model"
        load_from = os.environ.get("LOAD_FROM", "/path/to/pretrained/model")
        dist.init_process_group("nccl")
        tokenizer = AutoTokenizer.from_pretrained(load_from)
        model = nn.Sequential(nn.Embedding(len(tokenizer), 32), nn.Linear(32, 32))
        fully_shard(model)
    ''',
}


def test_a_tokenizer_path_that_is_a_folder_is_never_a_hub_download(cli, tmp_path):
    # transformers itself refuses `/path/to/...` as a repo id; the hint said `hf download /path/to/pretrained/model`
    write_tree(tmp_path, PLACEHOLDER_TOKENIZER)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "no tokenizer folder '/path/to/pretrained/model' here" in line and "hf download" not in line, line


def test_an_installed_library_whose_import_fails_here_is_not_called_missing(tmp_path):
    # a library built for an older torch (tensordict<0.6 on torch 2.13) is installed: its import fails inside it.
    # It was "not installed here"; python's own error is what stops it. (A fresh process, as a user runs it: the
    # site folder on its PYTHONPATH from the start.)
    from conftest import REPO, run_subprocess

    site = tmp_path / "site"
    write_tree(site, {
        "oldtd/__init__.py": "from torch.multiprocessing.reductions import NoSuchPickler  # noqa: F401\n",
        "oldtd-0.5.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: oldtd\nVersion: 0.5.0\n",
        "oldtd-0.5.0.dist-info/top_level.txt": "oldtd\n",
    })
    write_tree(tmp_path / "proj", {"train.py": '''
        from __future__ import annotations

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        from oldtd import TensorDict  # noqa: F401  (the rollout buffers only)

        dist.init_process_group("nccl")
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(2)])
        fully_shard(model)
    '''})
    res = run_subprocess(["-m", "fsdp_lint", "train.py", "-n", "8", "--no-cache", "--format", "json"],
                         cwd=str(tmp_path / "proj"), env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}"})
    assert res.returncode in (0, 1), res.stderr
    notes = json.loads(res.stdout)["files"][0]["notes"]
    said = next(n for n in notes if "oldtd" in n)
    assert "`oldtd` is installed, but importing it fails here: cannot import name 'NoSuchPickler'" in said, notes
    assert not any("not installed here" in n and "oldtd" in n for n in notes)


DATA_TYPE_TAG = {
    "train.py": '''
        from __future__ import annotations

        import argparse
        import json
        from pathlib import Path

        import torch.distributed as dist
        import torch.nn as nn
        from datasets import load_dataset
        from torch.distributed.fsdp import fully_shard

        parser = argparse.ArgumentParser()
        parser.add_argument("--dataset_path", default="data/alpaca/train_conversation")
        args = parser.parse_args()


        class JsonDataset:
            """A folder of JSON files, each {"type": ..., "instances": [...]}: the type tag read by the project."""

            def __init__(self, path):
                files = sorted(str(f) for f in Path(path).glob("*.json"))
                self.type = None
                for f in files:
                    self.type = json.load(open(f))["type"]
                self.rows = load_dataset("json", data_files=files, field="instances")["train"]


        def tokenize(ds):
            if ds.type == "text_only":
                return ds.rows.map(lambda r: {"n": len(r["text"])})
            if ds.type == "conversation":
                return ds.rows.map(lambda r: {"n": len(r["messages"])})
            raise NotImplementedError(f'dataset type "{ds.type}" is not supported')


        def setup(model, train_dataset):
            # the trainer's setup: wraps the model and sizes its schedule from the data
            for layer in model:
                fully_shard(layer)
            fully_shard(model)
            return len(train_dataset)


        dist.init_process_group("nccl")
        dataset = JsonDataset(args.dataset_path)
        tokenized = tokenize(dataset)
        steps = setup(nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]), tokenized)
    ''',
}


def test_a_project_check_refusing_a_stood_in_data_set_names_the_data_set(cli, tmp_path):
    # the README's data folder is not here: the data set stands in, and the project's own dispatch on the folder's
    # type tag refuses it; the line names the data set that could not be loaded (python stops at load_dataset)
    write_tree(tmp_path, DATA_TYPE_TAG)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert 'dataset type "None" is not supported' in line
    assert "train.py:26: the data set could not be loaded here and stands in with placeholder rows" in line, line
    assert "Empty 'data_files'" in line


def test_an_error_raised_again_under_a_header_is_said_with_its_own_line():
    # a caller re-raising a worker's failure: `worker::build() (pid=..., ip=...)` then `ValueError: ...` on the next
    # line (as remote-execution libraries do); the one line kept the header alone
    from fsdp_lint.replay.one_line import one_line

    class RemoteError(RuntimeError):
        pass

    said = one_line(RemoteError("worker::build_in_worker() (pid=1234, ip=10.0.0.1)\n  ValueError: width 1000 is not "
                                "divisible by heads 16"))
    assert said == ("RemoteError: worker::build_in_worker() (pid=1234, ip=10.0.0.1) -- ValueError: width 1000 is not "
                    "divisible by heads 16")
    assert one_line(ValueError("a list of things:\nfirst\nsecond")) == "ValueError: a list of things: first"


def test_a_command_substitution_not_computed_stays_one_word_when_its_variable_is_expanded():
    # `TAG="exp$(make_suffix "$@")"` then `run_name=$TAG` unquoted: bash splits the substitution's output (a suffix:
    # no spaces), never its command's text; the text was split into three arguments, which the script's parser refused
    from fsdp_lint.entry.bash_words import _expanded_words

    env = {"TAG": 'exp$(make_suffix "--layers 6")', "ARGS": "--lr 1 --fsdp"}
    assert _expanded_words("train.py run_name=$TAG $ARGS", env, ()) == \
        ["train.py", 'run_name=exp$(make_suffix "--layers 6")', "--lr", "1", "--fsdp"]


def test_a_function_run_in_a_substitution_gives_what_it_echoes(cli, tmp_path):
    # `TAG="exp$(make_suffix "$@")"`, `SUFFIX=$(make_suffix "$@")`: the function's body (its argument loop over the
    # call's arguments, its assignments) read as the script's lines are, its `echo` what the substitution gives --
    # as bash gives it (the oracle); it was passed as its text, which Hydra and argparse refuse
    from test_survey_round16_launch import TRAIN_NAMED
    from test_survey_round15_launch import NETS, _bash_echo, _plan

    script = FUNCTIONS.replace('launch "$NPROC" "$LAYERS"\n', 'SUFFIX=$(make_suffix "$@")\n'
                               'torchrun --nproc_per_node="$NPROC" train_a.py --layers "$LAYERS" --run_name "$TAG$SUFFIX"\n')
    write_tree(tmp_path, {"train_a.py": TRAIN_NAMED, "run.sh": script, **NETS})
    given = ["--layers", "5", "--nproc", "4"]
    [ran] = _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node=4", "train_a.py", "--layers", "5", "--run_name", "exp_l5"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["args"] == ["--layers", "5", "--run_name", "exp_l5"] and f["plan"]["world_size"] == 4
