"""Smaller classes of setup code met on real launch commands (benchmarks/realworld.md): Hydra hiding the
error, module-level registrations (OmegaConf resolvers) the config reads later.

Oracles: the plan real torch builds for the same module (`torch.nn` parameter counts), Hydra's and
OmegaConf's own exceptions."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402

HYDRA_SPAWN = os.path.join(REPO, "fixtures", "repos", "hydra_spawn")


def test_hydra_does_not_hide_the_real_cause(cli):
    # a stale override (`datasets=` where the config has `train_datasets`): Hydra's own handler prints
    # "Set the environment variable HYDRA_FULL_ERROR=1" and exits 1; the line names Hydra's exception
    res = cli("train.py", "--world-size", "4", "--", "exp_name=sft", "datasets=[hh]", cwd=HYDRA_SPAWN)
    assert res.code == 2
    [line] = res.err.strip().splitlines()[:1]
    assert "ConfigCompositionException: Could not override 'datasets'" in line
    assert "HYDRA_FULL_ERROR" not in line


def test_a_config_interpolation_through_a_module_level_resolver_reaches_the_spawned_worker(cli):
    # `${make_run_dir:...}` needs the resolver registered at import; mp.spawn's worker reads it and
    # hands it to the trainer that wraps: the plan is the FSDP1 one the trainer builds
    res = cli("train.py", "--world-size", "4", "--format", "json", "--", "exp_name=sft", cwd=HYDRA_SPAWN)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["api"] == "fsdp1" and f["replay"]["skipped_statements"] == []
    assert [u["modules"] for u in f["plan"]["units"]] == [["blocks.0"], ["blocks.1"], ["blocks.2"], [""]]


def test_a_registration_the_plan_reads_through_the_config_is_not_left_out(cli, tmp_path):
    import torch.nn as nn

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "helpers.py").write_text("def width_of(n):\n    return int(n) * 16\n")
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom omegaconf import OmegaConf\nfrom torch.distributed.fsdp import fully_shard\n\n"
        "from helpers import width_of\n\n"
        "OmegaConf.register_new_resolver('width', width_of)\n"
        "cfg = OmegaConf.create({'width': '${width:4}'})\n"
        "model = nn.Sequential(nn.Linear(cfg.width, 8), nn.Linear(8, 8))\nfully_shard(model)\n")
    res = cli("train.py", "--world-size", "2", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    expected = sum(p.numel() for p in nn.Sequential(nn.Linear(64, 8), nn.Linear(8, 8)).parameters())
    assert sum(u["numel"] for u in json.loads(res.out)["files"][0]["plan"]["units"]) == expected


FABRIC_JOINT = os.path.join(REPO, "fixtures", "repos", "fabric_joint")


def test_fabric_joint_setup_of_a_model_built_under_fabric_device_plans_as_lightning_builds(monkeypatch):
    # `with fabric.device:` is cuda:0 on a node, so Lightning's check finds no meta parameters in the
    # optimizer of a joint `fabric.setup(model, optimizer)`; the plan is the one real Lightning builds
    from test_frameworks import assert_framework_plan_matches

    from fsdp_lint.config import Settings

    monkeypatch.chdir(FABRIC_JOINT)
    res = assert_framework_plan_matches(os.path.join(FABRIC_JOINT, "pretrain", "redpajama.py"),
                                        Settings(world_size=4), ["--devices", "4"])
    assert res.plan.framework == "lightning"
    assert [u.modules for u in res.plan.units] == [["h.0"], ["h.1"], ["h.2"], [""]]


def test_fabric_joint_setup_of_an_empty_init_model_is_refused_as_lightning_refuses_it(cli):
    # built under `fabric.init_module(empty_init=True)` the parameters are meta on a node too: Lightning
    # refuses the joint set-up there, and so does the lint
    res = cli("pretrain/redpajama.py", "--world-size", "4", "--", "--devices", "4", "--empty_init", cwd=FABRIC_JOINT)
    assert res.code == 2
    assert "The optimizer has references to the model's meta-device parameters" in res.err


def test_a_fabric_script_that_never_launches_is_linted_as_lightnings_cli_launches_it(monkeypatch):
    # `lightning run model --devices=8 ... FILE`: the CLI sets LT_CLI_USED and Fabric counts as launched;
    # a plain `python FILE` would stop at "you must call .launch() or use the CLI". The plan is the one
    # real Lightning builds on the same (simulated) launch
    from test_frameworks import assert_framework_plan_matches

    from fsdp_lint.config import Settings

    monkeypatch.chdir(FABRIC_JOINT)
    res = assert_framework_plan_matches(os.path.join(FABRIC_JOINT, "pretrain", "tinyllama_like.py"),
                                        Settings(world_size=8), ["--devices", "8"])
    assert res.plan.framework == "lightning" and res.plan.world_size == 8
    assert any("never calls `fabric.launch()`" in n and "lightning run model --devices=8" in n for n in res.notes)
    assert os.environ.get("LT_CLI_USED") is None          # the launcher's environment ends with the replay


def test_fabric_devices_per_node_on_a_larger_world_are_nodes_of_that_many(cli):
    # `--devices 8` on a world of 16: Lightning's launcher runs 8 processes on each of 2 nodes
    res = cli("pretrain/tinyllama_like.py", "--world-size", "16", "--format", "json", "--", "--devices", "8",
              cwd=FABRIC_JOINT)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 16
    assert any("--devices=8 --num-nodes=2" in n for n in f["notes"]), f["notes"]


PREPARED_TWICE = '''
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def prepare(model):
    # a framework's prepare step: a model that is already FSDP is handed back as it is
    if isinstance(model, FSDP):
        return model
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())


def main():
    model = prepare(Net())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = prepare(model)          # prepared again with the optimizer (transformers 4's Trainer)
    return model, optimizer


if __name__ == "__main__":
    main()
'''


def test_a_model_the_script_wrapped_is_fsdp_to_a_prepare_step_that_asks(cli, tmp_path):
    """transformers 4's Trainer prepares the model twice and accelerate skips a model that is already
    FSDP: the recorded wrap must answer isinstance as torch's wrapper does, or the plan doubles."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from oracle import fsdp1_units

    ns: dict = {}
    exec(compile(PREPARED_TWICE, "train.py", "exec"), ns)
    real = fsdp1_units(ns["Net"], world_size=4, auto_wrap_policy=ModuleWrapPolicy({ns["Block"]}))
    (tmp_path / "train.py").write_text(PREPARED_TWICE)
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    assert len(f["plan"]["units"]) == len(real) == 5
    assert sorted(u["module"] for u in f["plan"]["units"]) == sorted(u["module"] for u in real)


FABRIC_DEVICES = os.path.join(REPO, "fixtures", "repos", "fabric_devices", "examples")


def test_a_fabric_that_starts_its_own_processes_sets_the_world_size(cli):
    """``Fabric(devices=4)`` run as ``python train.py``: Lightning starts the 4 processes itself. With nothing
    else giving the world size, the plan is for 4 ranks (noted), not fsdp-lint's default 8 fitted as 2 nodes
    of 4; ``--world-size`` still decides when given."""
    res = cli("train.py", "--format", "json", cwd=os.path.join(FABRIC_DEVICES, "fsdp"))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert (f["plan"]["world_size"], f["plan"]["world_size_source"]) == (4, "Fabric(devices=4)")
    assert any(n.startswith("world size 4: the script's Fabric(devices=4) launches 4 processes") for n in f["notes"])
    given = cli("train.py", "--world-size", "8", "--format", "json", cwd=os.path.join(FABRIC_DEVICES, "fsdp"))
    assert json.loads(given.out)["files"][0]["plan"]["world_size"] == 8


def test_the_fabric_devices_world_plans_as_lightning_builds_it(monkeypatch):
    from test_frameworks import assert_framework_plan_matches

    from fsdp_lint.config import Settings

    path = os.path.join(FABRIC_DEVICES, "fsdp", "train.py")
    monkeypatch.chdir(os.path.dirname(path))
    res = assert_framework_plan_matches(path, Settings(world_size=4), [])
    assert res.plan.world_size == 4 and len(res.plan.units) == 5


def test_a_two_d_fabric_on_its_own_devices_builds_its_mesh(cli):
    """``ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)`` with ``devices=4``: Lightning
    refuses any other world, so the default of 8 made the lint fail where ``python train.py`` runs."""
    res = cli("train.py", "--format", "json", cwd=os.path.join(FABRIC_DEVICES, "tensor_parallel"))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["world_size"] == 4
    assert (plan["mesh"]["dim_names"], plan["mesh"]["shape"]) == (["data_parallel", "tensor_parallel"], [2, 2])


def test_a_trainer_on_a_device_list_is_that_many_ranks(cli, tmp_path):
    (tmp_path / "train.py").write_text(
        "import lightning as L\nimport torch.nn as nn\nfrom lightning.pytorch.strategies import FSDPStrategy\n\n\n"
        "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(64, 64)\n\n    def forward(self, x):\n        return self.lin(x)\n\n\n"
        "class Net(L.LightningModule):\n    def __init__(self):\n        super().__init__()\n"
        "        self.blocks = nn.Sequential(Block(), Block())\n\n"
        "    def training_step(self, batch, i):\n        return self.blocks(batch).sum()\n\n"
        "    def configure_optimizers(self):\n        import torch\n        return torch.optim.SGD(self.parameters(), lr=0.1)\n\n\n"
        "if __name__ == '__main__':\n"
        "    trainer = L.Trainer(accelerator='gpu', devices=[0, 1], strategy=FSDPStrategy(auto_wrap_policy={Block}))\n"
        "    trainer.fit(Net(), train_dataloaders=[])\n")
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert (plan["world_size"], plan["world_size_source"]) == (2, "Trainer(devices=[0, 1])")
