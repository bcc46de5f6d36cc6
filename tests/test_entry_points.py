"""The front door: which files are linted, how the script's command line reaches it, `--model` for
real constructors, and errors that name the cause (one line, exit 2).

Small repositories are written into a temporary folder the way real ones are laid out (a package
with helpers in other modules, a script next to them), and linted through the command line.
"""
from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from conftest import run_subprocess

MODEL = '''
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_embd: int = 64
    vocab: int = 128

    @classmethod
    def from_name(cls, name: str) -> GPTConfig:
        return cls(**{"tiny": dict(n_layer=2), "small": dict(n_layer=4)}[name])


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(self.fc(self.ln(x)).relu())


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(config.vocab, config.n_embd)
        self.h = nn.ModuleList(Block(config.n_embd) for _ in range(config.n_layer))
        self.lm_head = nn.Linear(config.n_embd, config.vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(x)

    @classmethod
    def from_config_name(cls, name: str) -> GPT:
        return cls(GPTConfig.from_name(name))
'''

SHARDING = '''
from torch.distributed.fsdp import fully_shard


def shard(model):
    for block in model.h:
        fully_shard(block)
    fully_shard(model)
    return model
'''


def write_repo(root, files):
    for name, text in files.items():
        path = os.path.join(str(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(textwrap.dedent(text))
    return str(root)


def units(res):
    return [u["modules"] for u in json.loads(res.out)["files"][0]["plan"]["units"]]


# --------------------------------------------------------------------------------------------
# 1. no silent pass: relevance from the syntax tree and the project-local imports
# --------------------------------------------------------------------------------------------
def test_an_entry_point_that_reaches_fsdp_only_through_its_imports_is_linted(tmp_path, cli):
    write_repo(tmp_path, {"lm/__init__.py": "", "lm/model.py": MODEL, "lm/sharding.py": SHARDING,
                          "train.py": '''
                              import torch
                              from lm.model import GPT, GPTConfig
                              from lm.sharding import shard

                              model = shard(GPT(GPTConfig(n_layer=3)))
                              optimizer = torch.optim.AdamW(model.parameters())
                          '''})
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert units(res) == [["h.0"], ["h.1"], ["h.2"], [""]]


def test_a_word_in_a_comment_or_string_does_not_make_a_file_relevant(tmp_path, cli):
    write_repo(tmp_path, {"utils.py": '''
        # We used to call fully_shard(model) and FullyShardedDataParallel here; nn.Module docs.
        HELP = "wrap with fully_shard() or FSDP(model); subclass torch.nn.Module"

        def fmt(x):
            return f"{x:.2f}"
    '''})
    res = cli(".", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0
    assert "skipped" in json.loads(res.out)["files"][0]


def test_a_file_named_on_the_command_line_and_not_linted_says_why(tmp_path, cli):
    write_repo(tmp_path, {"utils.py": "def fmt(x):\n    return x\n"})
    res = cli("utils.py", cwd=str(tmp_path))
    assert res.code == 0
    assert "utils.py: not linted: no nn.Module and no FSDP use" in res.err and "--model" in res.err


def test_a_directory_walk_skips_files_that_only_import_a_model(tmp_path, cli):
    write_repo(tmp_path, {"lm/__init__.py": "", "lm/model.py": MODEL,
                          "sample.py": "from lm.model import GPT, GPTConfig\nmodel = GPT(GPTConfig())\n"})
    doc = json.loads(cli(".", "--format", "json", cwd=str(tmp_path)).out)
    by_path = {f["path"]: f for f in doc["files"]}
    assert "imports a model" in by_path["sample.py"]["skipped"]
    # the model file is where the model is linted: its constructor needs a config, so the walk says what
    # to pass rather than failing the gate on a file that uses no FSDP
    assert "pass --model lm/model.py:Class(arg=...)" in by_path["lm/model.py"]["skipped"]


def test_a_syntax_error_in_a_named_file_is_reported_even_without_model_words(tmp_path, cli):
    write_repo(tmp_path, {"notes.py": "def broken(:\n    pass\n"})
    res = cli("notes.py", cwd=str(tmp_path))
    assert res.code == 2 and "notes.py:1" in res.err and "syntax error" in res.err


def test_a_non_python_path_is_not_parsed_as_python(tmp_path, cli):
    write_repo(tmp_path, {"configs/8b.yaml": "model:\n  n_layer: 32\n"})
    res = cli("configs/8b.yaml", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "not a Python file" in res.err and "fsdp-lint train.py -- --config configs/8b.yaml" in res.err


# --------------------------------------------------------------------------------------------
# 2. the script's own command line
# --------------------------------------------------------------------------------------------
# the command-line libraries of real entry points: typer; jsonargparse's CLI(setup) (litgpt, LightningCLI);
# tyro.cli(main); plain sys.argv
FUNCTION_CLIS = {
    "typer": ("import typer", "typer.run(main)", ["--layers", "5", "--no-root"]),
    "jsonargparse": ("from jsonargparse import CLI", "CLI(main)", ["--layers", "5", "--root", "false"]),
    "tyro": ("import tyro", "tyro.cli(main)", ["--layers", "5", "--no-root"]),
}


@pytest.mark.parametrize("cli_kind", [*FUNCTION_CLIS, "sys.argv"])
def test_the_scripts_arguments_pick_the_model(tmp_path, cli, cli_kind):
    if cli_kind in FUNCTION_CLIS:
        imp, call, args = FUNCTION_CLIS[cli_kind]
        body = f'''
            {imp}

            def main(layers: int = 2, root: bool = True):
                run(layers, root)

            if __name__ == "__main__":
                {call}
        '''
    else:
        body = '''
            import sys

            if __name__ == "__main__":
                run(int(sys.argv[1]), sys.argv[2] == "root")
        '''
        args = ["5", "noroot"]
    write_repo(tmp_path, {"model.py": MODEL, "train.py": textwrap.dedent('''
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        def run(layers, root):
            model = GPT(GPTConfig(n_layer=layers))
            for block in model.h:
                fully_shard(block)
            if root:
                fully_shard(model)
    ''') + textwrap.dedent(body)})
    res = cli("train.py", "--world-size", "2", "--format", "json", "--", *args, cwd=str(tmp_path))
    assert units(res) == [[f"h.{i}"] for i in range(5)]
    assert json.loads(res.out)["files"][0]["findings"][0]["code"] == "FSD301"


# --------------------------------------------------------------------------------------------
# 3. the training boundary: a training step inside a callback never runs
# --------------------------------------------------------------------------------------------
def test_a_training_step_in_a_callback_never_runs(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "callbacks.py": '''
        import os

        import torch

        class WarmupCallback:
            """Runs one warm-up step when training starts."""

            def on_fit_start(self, trainer):
                out = trainer.model(torch.randint(0, 128, (2, 8)))
                with open(os.path.join(os.path.dirname(__file__), "TRAINING_STARTED"), "w") as fh:
                    fh.write("warmup")
                out.float().mean().backward()
    ''', "train.py": '''
        import torch
        from torch.distributed.fsdp import fully_shard
        from callbacks import WarmupCallback
        from model import GPT, GPTConfig

        class Trainer:
            def __init__(self, model, callbacks):
                self.model, self.callbacks = model, callbacks

            def fit(self):
                for cb in self.callbacks:
                    cb.on_fit_start(self)

        model = GPT(GPTConfig(n_layer=2))
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        Trainer(model, [WarmupCallback()]).fit()
    '''})
    res = cli("train.py", "--world-size", "2", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    doc = json.loads(res.out)["files"][0]
    assert "first forward of the wrapped GPT" in doc["replay"]["stopped_at"]["reason"]
    assert not os.path.exists(tmp_path / "TRAINING_STARTED")


# --------------------------------------------------------------------------------------------
# 4. wrap helpers nobody calls here
# --------------------------------------------------------------------------------------------
def test_an_uncalled_helper_whose_arguments_cannot_be_made_up_says_which_and_how_to_lint_it(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "parallelize.py": '''
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        def apply_fsdp(model, dp_mesh, param_dtype, reduce_dtype):
            mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
            for block in model.h:
                fully_shard(block, mesh=dp_mesh, mp_policy=mp)
            fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    '''})
    res = cli("parallelize.py", cwd=str(tmp_path))
    assert res.code == 2 and "nothing here builds one" in res.err and "lint the entry point" in res.err
    res = cli("parallelize.py", "--model", "model.py:GPT(GPTConfig(n_layer=2))", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "does not make up its arguments `param_dtype`, `reduce_dtype`" in res.err
    assert "None" not in res.err


# --------------------------------------------------------------------------------------------
# 7. --model for real constructors
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target,layers", [
    ("model.py:GPT(GPTConfig(n_layer=2))", 2),
    ('model.py:GPT.from_config_name("small")', 4),
    ('model.py:GPT(config=model.py:GPTConfig.from_name("tiny"))', 2),
    ("lm_model:GPT(GPTConfig(n_layer=3))", 3),
])
def test_model_targets_with_config_objects_and_classmethods(tmp_path, cli, target, layers):
    write_repo(tmp_path, {"model.py": MODEL, "lm_model.py": MODEL})
    res = cli("model.py", "--model", target, "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    doc = json.loads(res.out)["files"][0]
    assert doc["model"]["target"] == target
    assert units(res) == [[f"h.{i}"] for i in range(layers)] + [[""]]      # the suggested plan


def test_model_target_main_is_a_function_that_builds_and_wraps(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "train.py": '''
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        def main(n_layer: int = 6):
            model = GPT(GPTConfig(n_layer=n_layer))
            for block in model.h:
                fully_shard(block)
            fully_shard(model)
    '''})
    res = cli("train.py", "--model", "train.py:main(n_layer=3)", "--format", "json", cwd=str(tmp_path))
    assert units(res) == [["h.0"], ["h.1"], ["h.2"], [""]]
    assert json.loads(res.out)["files"][0]["plan"]["origin"] == "file"


@pytest.mark.parametrize("target,message", [
    ("model.py:GPT(GPTConfig(n_layer=1 + 1))", "only literals, names and calls of named callables"),
    ("model.py:GPT(__import__('os'))", "'__import__' is not allowed"),
    ("model.py:GPT(__import__('os').getcwd())", "is not a named callable"),
    ("model.py:GPT(eval('1'))", "'eval' is not defined in model.py"),
    ("model.py:Nope", "'Nope' is not defined in model.py"),
])
def test_model_targets_are_evaluated_safely(tmp_path, cli, target, message):
    write_repo(tmp_path, {"model.py": MODEL})
    res = cli("model.py", "--model", target, cwd=str(tmp_path))
    assert res.code == 2 and message in res.err


def test_a_loop_that_changes_the_models_parts_runs_before_the_wrap(tmp_path, cli):
    """`for i, block in enumerate(model.layers): parallelize_module(block, tp_mesh, plan)` changes the
    model through its loop variable (read by nothing later): it runs, so the blocks' parameters are
    tensor-parallel when the helper shards them (was: left out of the setup, a plan without TP)."""
    write_repo(tmp_path, {"parallel.py": '''
        from torch.distributed.fsdp import fully_shard

        def shard(model, mesh):
            for block in model.h:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
    ''', "model.py": MODEL, "train.py": '''
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        from model import GPT, GPTConfig
        from parallel import shard

        def main():
            mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
            model = GPT(GPTConfig(n_layer=2))
            plan = {"fc": ColwiseParallel()}
            for layer_id, block in enumerate(model.h):
                parallelize_module(module=block, device_mesh=mesh["tp"], parallelize_plan=plan)
            blocks = model.h
            for block in blocks:                # through a name bound to the model's part
                parallelize_module(block, mesh["tp"], {"proj": RowwiseParallel()})
            shard(model, mesh["dp"])

        main()
    '''})
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    params = {p["fqn"]: p for u in plan["units"] for p in u["params"]}
    for i in range(2):      # one placement per mesh dimension: FSDP's on dp, ColwiseParallel's Shard(0) on tp
        fc = params[f"h.{i}.fc.weight"]
        assert fc["mesh_dims"] == ["dp", "tp"] and fc["placements"][1] == "Shard(dim=0)", fc
    assert {c["module"] for c in plan["tp_collectives"]} == {"h.0.fc", "h.1.fc", "h.0.proj", "h.1.proj"}


# --------------------------------------------------------------------------------------------
# 8. errors name the cause
# --------------------------------------------------------------------------------------------
def test_a_package_the_model_needs_that_is_not_installed_is_named_with_its_distribution(tmp_path, cli):
    write_repo(tmp_path, {"lm/__init__.py": "", "lm/model.py": '''
        import torch.nn as nn
        import cv2

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(int(cv2.IMREAD_COLOR), 4)   # a shape read from the package
    ''', "train.py": '''
        from torch.distributed.fsdp import fully_shard
        from lm.model import Net
        fully_shard(Net())
    '''})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "lm/model.py:8" in res.err and "pip install opencv-python" in res.err
    assert "Missing" not in res.err and "_Stub" not in res.err


def test_a_package_used_outside_the_model_is_a_note_not_an_error(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "train.py": '''
        import wandb_is_not_installed as wandb
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        wandb.init(project="lm")
        model = GPT(GPTConfig(n_layer=2))
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
    '''})
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    notes = json.loads(res.out)["files"][0]["notes"]
    assert any("wandb_is_not_installed" in n and "not used by the model" in n for n in notes)


def test_a_name_the_installed_package_lacks_is_not_a_missing_package(tmp_path, cli):
    # `from transformers import AdamW, T5ForConditionalGeneration` on a transformers without AdamW: the
    # package is installed, one name is not in this version; the names it has are the real ones
    files = {"model.py": MODEL, "data.py": '''
        from torch.optim import AdamW, NoSuchOptimizer
        from torch.nn import Linear, NoSuchLayer
    ''', "train.py": '''
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard
        from data import *
        from model import GPT, GPTConfig

        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = HEAD_LAYER(4, 4)

        model = GPT(GPTConfig(n_layer=2))
        model.extra = Head()
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        optimizer = AdamW(model.parameters())
    '''}
    write_repo(tmp_path, {**files, "train.py": files["train.py"].replace("HEAD_LAYER", "Linear")})
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    doc = json.loads(res.out)["files"][0]
    assert "extra.proj.weight" in [p["fqn"] for u in doc["plan"]["units"] for p in u["params"]]   # the real Linear
    note = next(n for n in doc["notes"] if "NoSuchOptimizer" in n)
    assert "data.py:2: cannot import name 'NoSuchOptimizer' from 'torch.optim'" in note
    assert f"the installed torch {torch.__version__}" in note and "not installed" not in note
    # the absent name used while the model is built: the plan would miss it
    write_repo(tmp_path, {**files, "train.py": files["train.py"].replace("HEAD_LAYER", "NoSuchLayer")})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "cannot import name 'NoSuchLayer' from 'torch.nn'" in res.err
    assert "needs another version" in res.err and "pip install" not in res.err


def test_a_missing_module_of_the_projects_own_package_is_not_a_pip_install(tmp_path, cli):
    write_repo(tmp_path, {"lm/__init__.py": "", "lm/model.py": MODEL, "train.py": '''
        def main():
            from lm.modeling_v2 import GPT
            from torch.distributed.fsdp import fully_shard
            fully_shard(GPT())

        main()
    '''})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and "the project has no module `lm.modeling_v2`" in res.err and "pip install" not in res.err


def test_a_circular_import_names_the_cycle(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "a.py": '''
        from b import helper
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig
        fully_shard(GPT(GPTConfig()))
    ''', "b.py": "from a import GPT\n\ndef helper():\n    return GPT\n"})
    res = cli("a.py", cwd=str(tmp_path))
    assert res.code == 2 and "circular import: __main__ (a.py) -> b -> a -> b" in res.err


def test_the_first_failure_is_reported_not_the_name_it_left_unbound(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "train.py": '''
        import json
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        class Trainer:
            def __init__(self, path):
                with open(path) as fh:
                    self.config = GPTConfig(**json.load(fh))
                self.model = GPT(self.config)
                for block in self.model.h:
                    fully_shard(block)
                fully_shard(self.model)

        Trainer("configs/missing.json")
    '''})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "train.py:8" in res.err and "FileNotFoundError" in res.err and "configs/missing.json" in res.err
    assert "AttributeError" not in res.err


def test_debug_shows_the_traceback_of_the_users_failure(tmp_path):
    write_repo(tmp_path, {"train.py": '''
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        def build():
            return nn.Linear(4, "four")

        fully_shard(build())
    '''})
    proc = run_subprocess(["-m", "fsdp_lint", "train.py", "--debug"], cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and 'train.py", line 6, in build' in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("fsdp-lint: error: train.py:6")


def test_libraries_that_probe_cuda_when_imported_do_not_fail_the_replay(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "kernels.py": '''
        import torch

        # what attention/kernel libraries do at import
        MAJOR, MINOR = torch.cuda.get_device_capability()
        PROPS = torch.cuda.get_device_properties(0)
        TOTAL_GB = PROPS.total_memory / 2 ** 30
        FREE, TOTAL = torch.cuda.mem_get_info()
        USE_FLASH = MAJOR >= 8 and torch.cuda.is_bf16_supported()
        STREAM = torch.cuda.Stream()
    ''', "train.py": '''
        import torch
        from torch.distributed.fsdp import fully_shard
        import kernels
        from model import GPT, GPTConfig

        torch.cuda.set_device(0)
        model = GPT(GPTConfig(n_layer=2)).to(torch.cuda.current_device())
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
    '''})
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert units(res) == [["h.0"], ["h.1"], [""]]


def test_a_package_script_that_imports_its_siblings_as_top_level_modules(tmp_path, cli):
    """`scripts/` has an `__init__.py`, yet its script imports `train_utils` next to it as `python
    scripts/train.py` finds it: the script's folder is searched first, as python searches it -- a sibling named like
    an installed package hides it there too (the oracle: python itself)."""
    import subprocess
    import sys as _sys

    write_repo(tmp_path, {"scripts/__init__.py": "", "scripts/model.py": MODEL,
                          "scripts/train_utils.py": SHARDING, "scripts/train.py": '''
        import yaml                     # the installed PyYAML: no sibling has its name
        from model import GPT, GPTConfig
        from train_utils import shard

        cfg = yaml.safe_load("n_layer: 3")
        shard(GPT(GPTConfig(**cfg)))
    '''})
    res = cli("scripts/train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert units(res) == [["h.0"], ["h.1"], ["h.2"], [""]]
    # a sibling `yaml.py` is what `import yaml` finds from the script's folder, under python and here
    (tmp_path / "scripts" / "yaml.py").write_text("raise ImportError('scripts/yaml.py is not PyYAML')\n")
    ran = subprocess.run([_sys.executable, "-c", "import runpy, sys; sys.path.insert(0, 'scripts'); "
                          "runpy.run_path('scripts/yaml.py')"], cwd=tmp_path, capture_output=True, text=True)
    assert "scripts/yaml.py is not PyYAML" in ran.stderr
    res = cli("scripts/train.py", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and "scripts/yaml.py is not PyYAML" in res.err, res.err


def test_a_package_not_installed_that_is_handed_the_model_is_an_error_not_a_note(tmp_path, cli):
    # a conversion applied in the parallelize helper (fp8 training, fused kernels) changes the model that
    # is wrapped: standing in for it would report a plan without it. A logger watching the model does not.
    write_repo(tmp_path, {"model.py": MODEL, "parallel.py": '''
        from lowbit_kernels_not_installed.fp8 import convert_linears
        from torch.distributed.fsdp import fully_shard

        def parallelize(model, mesh=None):
            convert_linears(model, skip=("lm_head",))
            for block in model.h:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model
    ''', "train.py": '''
        import wandb
        from model import GPT, GPTConfig
        from parallel import parallelize

        model = parallelize(GPT(GPTConfig(n_layer=2)))
        wandb.watch(model, log="gradients")
    '''})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "parallel.py:6: the model uses `convert_linears`" in res.err
    assert "pip install lowbit-kernels-not-installed" in res.err

    (tmp_path / "parallel.py").write_text((tmp_path / "parallel.py").read_text().replace(
        "convert_linears(model, ", "print("))
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    notes = json.loads(res.out)["files"][0]["notes"]
    assert any("wandb" in n and "not used by the model" in n for n in notes) or "wandb" not in " ".join(notes)


def test_a_gloo_side_group_next_to_the_training_group_is_not_an_unmodelled_plan(tmp_path, cli):
    # a CPU group for barriers and object collectives (`new_group(backend="gloo")`) beside NCCL training:
    # the group's ranks are what a plan reads, its backend is not
    write_repo(tmp_path, {"model.py": MODEL, "train.py": '''
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        dist.init_process_group("nccl")
        cpu_group = dist.new_group(backend="gloo")
        model = GPT(GPTConfig(n_layer=2))
        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        dist.barrier(group=cpu_group)
    '''})
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    [doc] = json.loads(res.out)["files"]
    assert len(doc["plan"]["units"]) == 3


def test_a_script_that_exits_names_its_first_message_line_not_a_trailing_hint(tmp_path, cli):
    write_repo(tmp_path, {"model.py": MODEL, "train.py": '''
        import os
        import sys
        from torch.distributed.fsdp import fully_shard
        from model import GPT, GPTConfig

        ckpt = sys.argv[1] if len(sys.argv) > 1 else "checkpoints/base"
        if not os.path.isfile(os.path.join(ckpt, "model.pth")):
            print(f"checkpoint_dir {ckpt!r} has no model.pth.", file=sys.stderr)
            print("Download one first with:\\n  python download.py", file=sys.stderr)
            sys.exit(1)
        model = GPT(GPTConfig(n_layer=2))
        fully_shard(model)
    '''})
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "exited with status 1 before training started: checkpoint_dir 'checkpoints/base' has no model.pth." in res.err
