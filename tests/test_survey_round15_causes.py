"""Round 15 of the real-launch survey: the one-line cause a failed lint reports. Each fixture is written in
the idiom met (a package, helpers in other modules, argv); the oracle is python, real torch or the library."""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import run_subprocess, write_tree  # noqa: E402




def _error(res) -> str:
    lines = [ln for ln in res.err.splitlines() if ln.startswith("fsdp-lint: error:")]
    assert len(lines) == 1, res.err
    return lines[0]


def _line_of(path, text: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)


# -- 1. two failures that only share the config object are no chain -------------------------------------------
# a tracker needs a login here and is skipped; its next statement (a library logger handed `vars(args)`) fails on
# the unbound tracker (the project's helper handed `args` sets a run name on it); the model's hub config is not here on its own account. The error named the tracker as the
# cause, the hub config as what "it would have set up" (Bagel, Infinity and two more)
SHARED_ARGS = {
    "pyproject.toml": '''
        [project]
        name = "trk"
        version = "0.1"
    ''',
    "trk/__init__.py": "",
    "trk/tracking.py": '''
        from __future__ import annotations


        class Tracker:
            def __init__(self, project: str):
                raise RuntimeError("No API key configured. Use `tracker login` to log in.")

            def log_config(self, config: dict) -> None:
                pass


        def start_tracking(args) -> Tracker:
            tracker = Tracker(args.project)
            args.run_name = f"{args.project}-{tracker.run_id}"
            return tracker
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse
        import json
        import os

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers import AutoConfig, AutoModelForCausalLM

        from trk.tracking import start_tracking


        def main():
            p = argparse.ArgumentParser()
            p.add_argument("--llm_path", default="acme/never-downloaded-0.5B")
            p.add_argument("--project", default="demo")
            p.add_argument("--out", default="runs/none/here")
            args = p.parse_args()
            dist.init_process_group("nccl")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            tracker = start_tracking(args)
            tracker.log_config(vars(args))
            with open(os.path.join(args.out, "args.json"), "w") as fh:
                json.dump(vars(args), fh)
            config = AutoConfig.from_pretrained(args.llm_path)
            model = AutoModelForCausalLM.from_config(config)
            layer_cls = type(model.model.layers[0])
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({layer_cls}), device_id=torch.cuda.current_device())


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_missing_hub_config_is_its_own_cause_not_the_skipped_trackers(cli, tmp_path, monkeypatch):
    write_tree(tmp_path, SHARED_ARGS)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    at = _line_of(tmp_path / "train.py", "AutoConfig.from_pretrained(")
    assert f"train.py:{at}:" in line and "acme/never-downloaded-0.5B" in line, line
    assert "No API key" not in line and "used later" not in line, line


# a library function handed the config only reads it (json.dump(vars(args)), a logger's update): a later failure
# of the script's own model code is the script's, not a consequence of the skipped dump
SHARED_ARGS_OWN_BUG = {
    **SHARED_ARGS,
    "trk/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self, dim: int, layers: int):
                super().__init__()
                self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
                self.head = nn.Linear(dim, "vocab")
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse
        import json
        import os

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from trk.model import Net


        def main():
            p = argparse.ArgumentParser()
            p.add_argument("--dim", type=int, default=64)
            p.add_argument("--layers", type=int, default=2)
            p.add_argument("--out", default="runs/none/here")
            args = p.parse_args()
            dist.init_process_group("nccl")
            json.dump(vars(args), open(os.path.join(args.out, "args.json"), "w"))
            model = Net(args.dim, args.layers)
            model = FSDP(model, device_id=torch.cuda.current_device())


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_library_call_handed_the_config_is_no_cause_of_the_scripts_own_failure(cli, tmp_path):
    write_tree(tmp_path, SHARED_ARGS_OWN_BUG)
    # the oracle: python fails building the model with the output folder there (as on a node)
    os.makedirs(tmp_path / "runs/none/here")
    real = run_subprocess(["-c", "import sys; sys.path.insert(0, '.'); from trk.model import Net; Net(64, 2)"],
                          cwd=str(tmp_path))
    failing = re.findall(r'File ".*trk/model.py", line (\d+)', real.stderr)[-1]
    os.rmdir(tmp_path / "runs/none/here")
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert f"trk/model.py:{failing}: TypeError" in line, line
    assert "FileNotFoundError" not in line and "used later" not in line, line


# -- 3. a stand-in blamed only where the failing line reads what it gave -----------------------------------------
# a dataclass DTO annotates a field with a class of a package not installed here (`effnet: torchvision.transforms
# .Compose = EXPECTED`, StableCascade); a SLURM launch reads its local rank, unset here. The error blamed the
# package for the rank's `int(None)`
STANDIN_ANNOTATION = {
    "cascade/__init__.py": "",
    "cascade/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, dim: int = 128):
                super().__init__()
                self.proj = nn.Linear(dim, dim)


        class Net(nn.Module):
            def __init__(self, depth: int = 4):
                super().__init__()
                self.blocks = nn.ModuleList(Block() for _ in range(depth))
    ''',
    "train.py": '''
        import os
        from dataclasses import dataclass

        import fancy_augment_lib
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from cascade.model import Block, Net


        @dataclass(frozen=True)
        class Extras:
            transforms: fancy_augment_lib.Compose = None


        def main(device):
            dist.init_process_group("nccl")
            torch.cuda.set_device(device)
            model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy([Block]), device_id=device)


        if __name__ == "__main__":
            main(torch.device(int(os.environ.get("SLURM_LOCALID"))))
    ''',
}


def test_a_stand_in_only_annotated_is_not_blamed_for_an_unrelated_failure(cli, tmp_path, monkeypatch):
    write_tree(tmp_path, STANDIN_ANNOTATION)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    # the oracle: python, with the package there, fails on the same line for the same reason
    site = tmp_path / "site"
    write_tree(site, {"fancy_augment_lib/__init__.py": "class Compose:\n    pass\n"})
    env = {"PYTHONPATH": str(site), "SLURM_LOCALID": ""}
    real = run_subprocess(["-c", "import os; os.environ.pop('SLURM_LOCALID'); import runpy; "
                                 "runpy.run_path('train.py', run_name='__main__')"], cwd=str(tmp_path), env=env)
    assert "TypeError: int() argument must be" in real.stderr, real.stderr
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    at = _line_of(tmp_path / "train.py", 'int(os.environ.get("SLURM_LOCALID"))')
    assert f"train.py:{at}:" in line and "TypeError: int() argument must be" in line, line
    assert "fancy_augment_lib" not in line and "pip install" not in line, line


def test_a_check_of_what_a_stand_in_gave_still_names_the_package(cli, tmp_path):
    # the same file, the check reading the stand-in's value through an assignment: the package is the cause
    files = dict(STANDIN_ANNOTATION)
    files["train.py"] = files["train.py"].replace(
        '''            main(torch.device(int(os.environ.get("SLURM_LOCALID"))))''',
        '''            urls = fancy_augment_lib.expand_urls("shards-{0000..0127}.tar")
            num_shards = len(urls)
            assert num_shards % 8 == 0, f"{num_shards} shards do not divide among the ranks"
            main(torch.device(0))''')
    write_tree(tmp_path, files)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "fancy_augment_lib" in line and "pip install fancy-augment-lib" in line, line


# -- 4. what only follows from a skipped data-only tokenizer is skipped, asserts included --------------------------
# AQLM's finetune: the tokenizer (a hub id in argv) feeds only the data; the script checks it has an eos token and
# pads with it. The tokenizer is not here and is skipped; its `assert` failed on the unbound name and ended the lint
TOKENIZER_ASSERT = {
    "ftune/__init__.py": "",
    "ftune/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, dim: int):
                super().__init__()
                self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))


        class LM(nn.Module):
            def __init__(self, dim: int = 64, depth: int = 3):
                super().__init__()
                self.embed = nn.Embedding(1000, dim)
                self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
    ''',
    "finetune.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import transformers
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from ftune.model import LM, Block


        def main():
            p = argparse.ArgumentParser()
            p.add_argument("tokenizer")
            args = p.parse_args()
            torch.distributed.init_process_group("nccl")
            tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
            assert tokenizer.eos_token_id is not None
            tokenizer.pad_token = tokenizer.eos_token
            model = FSDP(LM(), auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())
            opt = torch.optim.Adam(model.parameters())


        if __name__ == "__main__":
            main()
    ''',
}


def test_an_assert_on_a_skipped_data_only_tokenizer_is_skipped_too(cli, tmp_path, monkeypatch):
    import json

    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, TOKENIZER_ASSERT)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.syspath_prepend(str(tmp_path))
    res = cli("finetune.py", "-n", "8", "--no-cache", "--format", "json", "--", "acme/never-downloaded-tok",
              cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    skipped = f["replay"]["skipped_statements"]
    assert any("acme/never-downloaded-tok" in s["error"] for s in skipped), f
    assert _line_of(tmp_path / "finetune.py", "assert tokenizer.eos_token_id") in [s["line"] for s in skipped]
    # the oracle: real FSDP1 wraps the model the tokenizer never touched
    from ftune.model import LM, Block

    real = fsdp1_units(LM, world_size=8, auto_wrap_policy=ModuleWrapPolicy({Block}))
    assert [(u["module"], u["numel"]) for u in f["plan"]["units"] if u["numel"]] == \
        [(r["module"], r["numel"]) for r in real]


def test_the_scripts_own_failing_assert_still_stops_the_lint(cli, tmp_path, monkeypatch):
    # an assert that fails on its own (no skipped statement behind it) is the script's, as on a node
    files = dict(TOKENIZER_ASSERT)
    files["finetune.py"] = files["finetune.py"].replace(
        "            assert tokenizer.eos_token_id is not None\n",
        "            assert tokenizer.eos_token_id is not None\n"
        "            assert args.tokenizer.startswith(\"local/\"), \"tokenizers come from local/ folders\"\n")
    write_tree(tmp_path, files)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    res = cli("finetune.py", "-n", "8", "--no-cache", "--", "acme/never-downloaded-tok", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "tokenizers come from local/ folders" in line, line


# -- 6. a missing checkpoint that holds a pickled module decides the model ---------------------------------------
# AQLM saves the quantized model one pickled nn.Module per layer and loads them back into the layer list. The
# stand-in state dict was assigned as a child module and the error said torch refuses it "on a GPU node too"
PICKLED_LAYERS = {
    "qlm/__init__.py": "",
    "qlm/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, dim: int = 64):
                super().__init__()
                self.fc = nn.Linear(dim, dim)


        class QuantBlock(nn.Module):
            def __init__(self, dim: int = 64, groups: int = 4):
                super().__init__()
                self.codes = nn.Parameter(__import__("torch").zeros(dim, dim // groups), requires_grad=False)
                self.scales = nn.Linear(dim, dim, bias=False)


        class Net(nn.Module):
            def __init__(self, depth: int = 3):
                super().__init__()
                self.layers = nn.ModuleList(Block() for _ in range(depth))
    ''',
    "qlm/loading.py": '''
        from __future__ import annotations

        import os

        import torch


        def load_quantized(model, load_path: str):
            for i in range(len(model.layers)):
                model.layers[i] = torch.load(os.path.join(load_path, f"{i}.pth"), weights_only=False)
            return model
    ''',
    "finetune.py": '''
        from __future__ import annotations

        import sys

        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from qlm.loading import load_quantized
        from qlm.model import Net, QuantBlock


        def main(load_path):
            torch.distributed.init_process_group("nccl")
            model = load_quantized(Net(), load_path)
            model = FSDP(model, auto_wrap_policy=lambda module, recurse, **_: recurse or isinstance(module, QuantBlock),
                         device_id=torch.cuda.current_device(), use_orig_params=True)


        if __name__ == "__main__":
            main(sys.argv[1])
    ''',
}


def test_a_missing_pickled_module_checkpoint_is_named_as_what_decides_the_model(cli, tmp_path, monkeypatch):
    import json

    import torch
    from oracle import fsdp1_units

    write_tree(tmp_path, PICKLED_LAYERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from qlm.loading import load_quantized
    from qlm.model import Net, QuantBlock

    # the oracle: with the files there, real torch loads the pickled modules into the model FSDP wraps -- what the
    # files hold (QuantBlock, not Block) is the model
    (tmp_path / "quantized").mkdir()
    for i in range(3):
        torch.save(QuantBlock(), tmp_path / "quantized" / f"{i}.pth")
    real = fsdp1_units(lambda: load_quantized(Net(), str(tmp_path / "quantized")), world_size=8, use_orig_params=True,
                       auto_wrap_policy=lambda module, recurse, **_: recurse or isinstance(module, QuantBlock))
    res = cli("finetune.py", "-n", "8", "--no-cache", "--format", "json", "--", "quantized", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    units = json.loads(res.out)["files"][0]["plan"]["units"]
    assert [(u["module"], u["numel"]) for u in units if u["numel"]] == [(r["module"], r["numel"]) for r in real]

    # without them, nothing stands in for the modules: the missing file is named, never torch nor a node
    for i in range(3):
        os.remove(tmp_path / "quantized" / f"{i}.pth")
    res = cli("finetune.py", "-n", "8", "--no-cache", "--", "quantized", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    at = _line_of(tmp_path / "qlm/loading.py", "model.layers[i] = torch.load(")
    assert f"qlm/loading.py:{at}: `quantized/0.pth` is not on this machine" in line, line
    assert "GPU node" not in line and "StandInStateDict" not in line, line


def test_a_missing_pickled_module_used_at_the_top_level_is_not_skipped(cli, tmp_path):
    # the module's own method called on what the file held (freezing a pickled encoder): a tolerant statement
    # skipped the stand-in's AttributeError and planned a model without the encoder
    files = dict(PICKLED_LAYERS)
    files["finetune.py"] = '''
        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from qlm.model import Net

        torch.distributed.init_process_group("nccl")
        encoder = torch.load("ckpts/encoder.pt", weights_only=False)
        encoder.requires_grad_(False)
        model = FSDP(nn.ModuleDict({"encoder": encoder, "net": Net()}), device_id=torch.cuda.current_device())
    '''
    write_tree(tmp_path, files)
    res = cli("finetune.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "`ckpts/encoder.pt` is not on this machine" in line and "`.requires_grad_` used" in line, line


def test_a_missing_pickled_object_that_is_no_module_is_still_skipped(cli, tmp_path):
    # a pickled training-arguments object (`training_args.bin`) read for a setting the plan does not use: skipped,
    # as any file this machine lacks
    files = dict(PICKLED_LAYERS)
    files["finetune.py"] = '''
        import torch
        from torch.distributed.fsdp import fully_shard

        from qlm.model import Net

        torch.distributed.init_process_group("nccl")
        train_args = torch.load("ckpts/training_args.bin", weights_only=False)
        lr = train_args.learning_rate
        model = Net()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    '''
    write_tree(tmp_path, files)
    res = cli("finetune.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert "skipped" in res.out and "learning_rate" in res.out, res.out


# -- 5. pytest's skip of a module whose package is missing is the script's own stop --------------------------------
# torchao's benchmarks: `except ImportError: pytest.skip(..., allow_module_level=True)` (a BaseException) was
# reported as "internal error: Skipped: ..."
PYTEST_SKIP = {
    "benchmarks/__init__.py": "",
    "benchmarks/models.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Expert(nn.Module):
            def __init__(self, dim: int = 64):
                super().__init__()
                self.w = nn.Linear(dim, dim)
    ''',
    "benchmarks/bench_moe_fsdp.py": '''
        from __future__ import annotations

        import pytest
        import torch
        from torch.distributed.fsdp import fully_shard

        try:
            from titan_not_here.models.moe import MoE
        except ImportError:
            pytest.skip("torchtitan not installed, skipping MoE tests.", allow_module_level=True)


        def main():
            torch.distributed.init_process_group("nccl")
            fully_shard(MoE())


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_module_level_pytest_skip_on_a_missing_package_names_the_import(cli, tmp_path):
    write_tree(tmp_path, PYTEST_SKIP)
    # the oracle: python stops there with pytest's Skipped, raised while handling the failed import
    real = run_subprocess(["benchmarks/bench_moe_fsdp.py"], cwd=str(tmp_path))
    assert real.returncode != 0 and "Skipped: torchtitan not installed" in real.stderr
    assert "No module named 'titan_not_here'" in real.stderr
    res = cli("benchmarks/bench_moe_fsdp.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    at = _line_of(tmp_path / "benchmarks/bench_moe_fsdp.py", "from titan_not_here")
    assert f"bench_moe_fsdp.py:{at}: `titan_not_here` is not installed here" in line, line
    assert "torchtitan not installed, skipping MoE tests." in line and "internal error" not in res.err, line


def test_pytest_importorskip_names_the_import_too(cli, tmp_path):
    files = dict(PYTEST_SKIP)
    files["benchmarks/bench_moe_fsdp.py"] = files["benchmarks/bench_moe_fsdp.py"].replace(
        '''        try:
            from titan_not_here.models.moe import MoE
        except ImportError:
            pytest.skip("torchtitan not installed, skipping MoE tests.", allow_module_level=True)
''', '''        moe = pytest.importorskip("titan_not_here.models.moe")
        MoE = moe.MoE
''')
    write_tree(tmp_path, files)
    res = cli("benchmarks/bench_moe_fsdp.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "`titan_not_here" in line and "pytest.skip" in line and "internal error" not in res.err, line


# -- 2. an explicit online mode is disabled too ---------------------------------------------------------------------
# Bagel: `wandb.init(mode="offline" if args.wandb_offline else "online")` beat the lint's WANDB_MODE=disabled and
# asked for a login. The tracker below behaves as wandb does: an explicit mode beats WANDB_MODE, and an online run
# needs an API key
FAKE_WANDB = {
    "wandb/__init__.py": '''
        import os


        class UsageError(Exception):
            pass


        class _Config(dict):
            def update(self, d=None, **kw):
                dict.update(self, vars(d) if hasattr(d, "__dict__") else (d or {}), **kw)


        config = _Config()
        modes = []


        def login(key=None, **kwargs):
            if not (key or os.environ.get("WANDB_API_KEY")):
                raise UsageError("No API key configured. Use `wandb login` to log in.")
            return True


        def init(project=None, mode=None, settings=None, **kwargs):
            mode = mode or (settings or {}).get("mode") or os.environ.get("WANDB_MODE", "online")
            modes.append(mode)
            if mode == "online" and not os.environ.get("WANDB_API_KEY"):
                raise UsageError("No API key configured. Use `wandb login` to log in.")
            return object()
    ''',
}
WANDB_ONLINE = {
    "bagelish/__init__.py": "",
    "bagelish/model.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, d: int = 64):
                super().__init__()
                self.ff = nn.Linear(d, d)

            def forward(self, x):
                return self.ff(x)
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        import wandb
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from bagelish.model import Block

        if __name__ == "__main__":
            p = argparse.ArgumentParser()
            p.add_argument("--wandb_offline", action="store_true")
            p.add_argument("--layers", type=int, default=3)
            args = p.parse_args()
            dist.init_process_group("nccl")
            if dist.get_rank() == 0:
                wandb.init(project="demo", mode="offline" if args.wandb_offline else "online")
                wandb.config.update(vars(args))
            layers = args.layers if wandb.modes == ["disabled"] else 1      # (what the tracker was asked for)
            model = FSDP(nn.Sequential(*[Block() for _ in range(layers)]), auto_wrap_policy=ModuleWrapPolicy({Block}),
                         device_id=torch.cuda.current_device())
    ''',
}


def test_an_explicit_online_tracker_mode_is_disabled_in_a_lint(cli, tmp_path, monkeypatch):
    import json

    site = tmp_path / "site"
    write_tree(site, FAKE_WANDB)
    write_tree(tmp_path, WANDB_ONLINE)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    # the oracle: python, with WANDB_MODE=disabled, still asks for the login the explicit mode wants
    real = run_subprocess(["-c", "import wandb; wandb.init(project='demo', mode='online')"],
                          env={"PYTHONPATH": str(site), "WANDB_MODE": "disabled"}, cwd=str(tmp_path))
    assert "No API key configured" in real.stderr
    for argv in ([], ["--wandb_offline"]):
        res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", *argv, cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        f = json.loads(res.out)["files"][0]
        assert f["replay"]["skipped_statements"] == [], f["replay"]
        assert len([u for u in f["plan"]["units"] if u["numel"]]) == 3


# -- 7. the distribution the repository's requirements name, once ----------------------------------------------------
# Infinity parses its arguments with typed-argument-parser, whose import name is `tap` (PyPI's `tap` is another
# package); the error said `pip install tap`, twice
TAP_ARGS = {
    "requirements.txt": "torch\ntyped-argument-parser>=1.8\n",
    "infinity_ish/__init__.py": "",
    "infinity_ish/arg_util.py": '''
        from tap import Tap


        class Args(Tap):
            depth: int = 4
            width: int = 64
    ''',
    "train.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from infinity_ish.arg_util import Args

        if __name__ == "__main__":
            args = Args().parse_args()
            dist.init_process_group("nccl")
            model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.depth)])
            model = FSDP(model, device_id=torch.cuda.current_device())
    ''',
}


def test_a_missing_import_names_the_distribution_the_requirements_declare_once(cli, tmp_path):
    write_tree(tmp_path, TAP_ARGS)
    # the oracle: python fails on the import itself
    real = run_subprocess(["train.py"], cwd=str(tmp_path))
    assert "No module named 'tap'" in real.stderr
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "pip install typed-argument-parser" in line and "pip install tap" not in line, line
    assert line.count("which could not be imported") == 1 and line.count("pip install") == 1, line


# -- 8. no library drift note on a file that is not here ------------------------------------------------------------
# OmniGen2/Bagel: the config is read from a path the launch script fills in ($model_path/llm_config.json); the error
# added "(requirements.txt asks for transformers==4.44.0; installed here: ...)", which no version explains
DRIFT_MISSING_FILE = {
    "requirements.txt": "torch\ntransformers==4.44.0\n",
    "omni/__init__.py": "",
    "omni/build.py": '''
        from __future__ import annotations

        import os

        from transformers import Qwen2Config, Qwen2ForCausalLM


        def build_llm(model_path: str):
            config = Qwen2Config.from_json_file(os.path.join(model_path, "llm_config.json"))
            return Qwen2ForCausalLM(config)
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from omni.build import build_llm

        p = argparse.ArgumentParser()
        p.add_argument("--model_path", default="$model_path")
        args = p.parse_args()
        dist.init_process_group("nccl")
        model = FSDP(build_llm(args.model_path), device_id=torch.cuda.current_device())
    ''',
}


def test_a_missing_file_gets_no_library_drift_note(cli, tmp_path):
    import transformers
    from packaging.requirements import Requirement

    # the premise: the pin excludes the installed transformers (else there is no note to leave out)
    assert not Requirement("transformers==4.44.0").specifier.contains(transformers.__version__)
    write_tree(tmp_path, DRIFT_MISSING_FILE)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "$model_path/llm_config.json" in line and "FileNotFoundError" in line, line
    assert "asks for transformers" not in line, line


def test_a_library_api_drift_keeps_its_note(cli, tmp_path):
    # the control: a keyword transformers 4.44 took (deprecated) and the installed one refuses is the drift's doing
    files = dict(DRIFT_MISSING_FILE)
    files["omni/build.py"] = files["omni/build.py"].replace(
        '''            config = Qwen2Config.from_json_file(os.path.join(model_path, "llm_config.json"))''',
        '''            config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256)''').replace(
        "return Qwen2ForCausalLM(config)", "return AutoModelForCausalLM.from_config(config, use_flash_attention_2=False)").replace(
        "from transformers import Qwen2Config, Qwen2ForCausalLM", "from transformers import AutoModelForCausalLM, Qwen2Config")
    write_tree(tmp_path, files)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = _error(res)
    assert "requirements.txt asks for transformers==4.44.0" in line, line
