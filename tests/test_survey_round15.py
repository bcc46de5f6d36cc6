"""Round 15 of the real-launch survey (benchmarks/realworld.md, "Round 15") and the classes left open by round
14. Each fixture is written in the idiom met; the oracle is real torch, python or the library itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import run_subprocess, write_tree  # noqa: E402




def _assert_shard_grad_op_units_match_torch(cli, tmp_path, monkeypatch, name: str) -> None:
    """The lint of train.py is FSDP1 SHARD_GRAD_OP and its units are those real torch builds from the same file's
    `build()` with `ModuleWrapPolicy({Block})`."""
    import importlib.util

    from oracle import fsdp1_units
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["api"] == "fsdp1" and plan["origin"] != "suggested" and plan["sharding_strategy"] == "SHARD_GRAD_OP"
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location(name, tmp_path / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    real = fsdp1_units(mod.build, world_size=8, auto_wrap_policy=ModuleWrapPolicy({mod.Block}),
                       sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert [(u["module"], u["numel"]) for u in plan["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]


# a helper asks `dist.is_initialized()` before the script initialised the world (a world of 1 on a node: the
# usual `get_world_size()` of utility modules) and after it; the replay answered True before the init too
WORLD_BEFORE_INIT = {
    "train.py": '''
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from utils.dist import world_size

        BEFORE = world_size()
        dist.init_process_group("nccl")
        AFTER = world_size()
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(BEFORE + AFTER)]).cuda()
        model = FSDP(model, device_id=torch.cuda.current_device())
    ''',
    "utils/__init__.py": "",
    "utils/dist.py": '''
        import torch.distributed as dist


        def world_size() -> int:
            if not dist.is_available() or not dist.is_initialized():
                return 1
            return dist.get_world_size()
    ''',
}


def test_is_initialized_is_false_until_the_script_initialises_the_world(cli, tmp_path):
    write_tree(tmp_path, WORLD_BEFORE_INIT)
    # the oracle: a process that has not called init_process_group is not initialised
    probe = run_subprocess(["-c", "import torch.distributed as d; print(d.is_initialized())"])
    assert probe.stdout.strip() == "False"
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    import torch.nn as nn

    per_layer = sum(p.numel() for p in nn.Linear(64, 64).parameters())
    assert f["model"]["numel"] == (1 + 4) * per_layer


def test_a_mesh_initialises_the_world_for_is_initialized(cli, tmp_path):
    # init_device_mesh initialises the default group itself (torch's own code): afterwards a node answers True
    write_tree(tmp_path, {"train.py": '''
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cuda", (4,))
        n = dist.get_world_size() if dist.is_initialized() else 1
        model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(n)])
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    '''})
    res = cli("train.py", "-n", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert len([u for u in f["plan"]["units"] if u["module"].isdigit()]) == 4


# the project subclasses an output class of the transformers it pins; the installed transformers lacks it, so
# `python` stops at the import. fsdp-lint stands in for the name and the replay failed later, inside another
# library: the one-line error named only the later failure (VeOmni)
ABSENT_NAME = {
    "pyproject.toml": '''
        [project]
        name = "pkg"
        version = "0.1"
        dependencies = ["torch", "transformers==5.9.0"]
    ''',
    "pkg/__init__.py": "",
    "pkg/outputs.py": '''
        from transformers.modeling_outputs import CausalLMOutputWithPast, OutputRemovedSinceThePin


        class MyOutput(OutputRemovedSinceThePin):
            pass
    ''',
    "pkg/model.py": '''
        import json

        import torch.nn as nn

        import pkg.outputs  # noqa: F401


        class Net(nn.Module):
            def __init__(self, d=64, n=4):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
                self.extra = json.loads("[1, 2")
    ''',
    "train.py": '''
        from torch.distributed.fsdp import fully_shard

        from pkg.model import Net

        model = Net()
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
    ''',
}


def test_a_later_failure_names_the_absent_name_stood_in_before_it(cli, tmp_path):
    import transformers

    write_tree(tmp_path, ABSENT_NAME)
    node = run_subprocess(["train.py"], cwd=str(tmp_path))
    assert "ImportError: cannot import name 'OutputRemovedSinceThePin'" in node.stderr
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "pkg/model.py:13" in line and "JSONDecodeError" in line
    assert "before it, pkg/outputs.py:2: cannot import name 'OutputRemovedSinceThePin'" in line
    assert f"transformers {transformers.__version__}; pyproject.toml asks for transformers==5.9.0" in line


# the config is read by one statement (its file is not here: skipped), then converted with a helper of a package
# that is not installed; the next line failed on the unbound name and the error blamed only the package (ROLL)
UNBOUND_AFTER_SKIP = {
    "train.py": '''
        import json

        import torch.nn as nn
        from dacite_not_installed_here import from_dict
        from torch.distributed.fsdp import fully_shard


        def main():
            with open("configs/run/cfg.json") as f:
                cfg = json.load(f)
            conf = from_dict(data_class=dict, data=cfg)
            model = nn.Sequential(*[nn.Linear(conf["dim"], conf["dim"]) for _ in range(4)])
            for m in model:
                fully_shard(m)
            fully_shard(model)


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_name_left_unbound_by_a_skipped_statement_names_that_statement_and_the_package(cli, tmp_path):
    write_tree(tmp_path, UNBOUND_AFTER_SKIP)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert line.startswith("fsdp-lint: error: train.py:10:"), line
    assert "FileNotFoundError" in line and "configs/run/cfg.json" in line
    assert "train.py:12: UnboundLocalError" in line
    assert "`dacite_not_installed_here` is not installed here" in line


# a Ray-style driver started once per node with plain `python` reads WORLD_SIZE (default 1) as the number of nodes;
# the launch script exports it for a single node. No launcher overrides a plain `python`'s variables: the
# process sees the script's export, as bash gives it (ROLL)
DRIVER = {
    "run.sh": '''
        #!/bin/bash
        export WORLD_SIZE=1
        export RANK=0
        python driver.py --config cfg.yaml
    ''',
    "driver.py": '''
        import os
        import sys

        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        nodes = int(os.getenv("WORLD_SIZE", "1"))
        if nodes != 1:
            sys.exit(f"waiting for {nodes} nodes to join")
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
        for m in model:
            fully_shard(m)
        fully_shard(model)
    ''',
}


def test_a_plain_python_launch_sees_the_process_variables_its_script_exports(cli, tmp_path):
    write_tree(tmp_path, DRIVER)
    # the oracle: bash gives the exported variable to the plain python process
    seen = subprocess.run(["bash", "-c", "export WORLD_SIZE=1; python -c 'import os; print(os.environ[\"WORLD_SIZE\"])'"],
                          capture_output=True, text=True)
    assert seen.stdout.strip() == "1"
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 1
    assert len(f["plan"]["units"]) == 5
    # torchrun sets its own WORLD_SIZE over the script's export: the launch's world stays torchrun's
    (tmp_path / "run.sh").write_text("#!/bin/bash\nexport WORLD_SIZE=1\ntorchrun --nproc_per_node 4 driver.py\n")
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code == 2 and "waiting for 4 nodes to join" in res.err


# a model's snapshot at a pinned revision, read by the project (cosmos-reason1's `snapshot_download(repo, revision=)`
# then its config.json): the miss named neither the repository nor the revision
SNAPSHOT = '''
import json
import os

import torch.nn as nn
from huggingface_hub import snapshot_download
from torch.distributed.fsdp import fully_shard

REVISION = "3210bec0495fdc7a8d3dbb8d58da5711eab4b423"
path = snapshot_download("org/some-model", revision=REVISION, cache_dir=os.environ.get("MODEL_CACHE"))
with open(os.path.join(path, "config.json")) as f:
    width = json.load(f)["hidden_size"]
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])
for m in model:
    fully_shard(m)
fully_shard(model)
'''


def test_a_model_snapshot_not_here_is_named_with_its_revision_and_its_configs_suffice(cli, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SNAPSHOT)
    hf_home = tmp_path / "hf"
    monkeypatch.setenv("MODEL_CACHE", str(hf_home / "hub"))     # the script's own cache folder setting
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "train.py:10:" in line
    rev = "3210bec0495fdc7a8d3dbb8d58da5711eab4b423"
    assert (f"`hf download org/some-model --include '*.json' --include '*.model' --include '*.txt' --include '*.tiktoken' "
            f"--include '*.py' --revision {rev}`") in line
    # what that command leaves in the cache (the snapshot folder of the revision, its configs) is enough
    snap = hf_home / "hub" / "models--org--some-model" / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"hidden_size": 32}))
    from huggingface_hub import snapshot_download

    assert snapshot_download("org/some-model", revision=rev, cache_dir=str(hf_home / "hub"),
                             local_files_only=True) == str(snap)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    import torch.nn as nn

    built = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])    # what the script builds from the cached width
    assert json.loads(res.out)["files"][0]["model"]["numel"] == sum(p.numel() for p in built.parameters())


# a training command run as plain `python train.py` that re-launches itself under torchrun with the process count of
# its config when torchrun's variables are not there, and trains when they are (SpecForge's `train` entry, launchers
# of the `if "RANK" not in os.environ: subprocess.call([sys.executable, "-m", "torch.distributed.run", ...])` kind)
SELF_LAUNCH = {
    "pyproject.toml": '[project]\nname = "draftkit"\nversion = "0.1"\n',
    "run.sh": '''
        #!/bin/bash
        python scripts/train.py --config configs/draft.json
    ''',
    "configs/draft.json": '{"nproc_per_node": 4, "layers": 3, "width": 128}\n',
    "scripts/train.py": '''
        from __future__ import annotations

        import json
        import os
        import subprocess
        import sys

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

        from draftkit.launch import under_torchrun  # noqa: E402


        def main(argv: list[str]) -> int:
            cfg = json.load(open(argv[argv.index("--config") + 1]))
            if not under_torchrun(cfg["nproc_per_node"]):
                cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg['nproc_per_node']}",
                       os.path.abspath(__file__), *argv]
                return subprocess.call(cmd)
            from draftkit.trainer import build
            build(cfg)
            return 0


        if __name__ == "__main__":
            sys.exit(main(sys.argv[1:]))
    ''',
    "draftkit/__init__.py": "",
    "draftkit/launch.py": '''
        import os


        def under_torchrun(nproc: int) -> bool:
            if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
                return False
            if int(os.environ["WORLD_SIZE"]) != nproc:
                raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but the config asks for {nproc} processes")
            return True
    ''',
    "draftkit/trainer.py": '''
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


        def build(cfg):
            dist.init_process_group("nccl")
            model = nn.Sequential(*[nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])])
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model:
                fully_shard(layer, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            return torch.optim.AdamW(model.parameters())
    ''',
}


def test_a_script_that_relaunches_itself_under_torchrun_is_linted_as_that_launch(cli, tmp_path):
    write_tree(tmp_path, SELF_LAUNCH)
    # the oracle of the premise: torchrun gives its workers RANK/WORLD_SIZE/LOCAL_RANK, a plain python has none
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nprint([k in os.environ for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    plain = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env)
    assert plain.stdout.strip() == "[False, False, False]"
    launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", str(probe)],
                              capture_output=True, text=True, env=env, timeout=120)
    assert launched.stdout.strip() == "[True, True, True]", launched.stderr
    # before: the plain python got torchrun's variables (world 8), and the script's own check refused them
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["path"].endswith("scripts/train.py")
    assert f["plan"]["world_size"] == 4
    assert [u["module"] for u in f["plan"]["units"]] == ["0", "1", "2", ""]
    assert any("torch.distributed.run --nproc_per_node=4" in n and "linted that launch" in n for n in f["notes"])
    # the same plan as the launch it starts, linted directly
    direct = cli("scripts/train.py", "-n", "4", "--no-cache", "--format", "json", "--", "--config",
                 "configs/draft.json", cwd=str(tmp_path))
    assert direct.code in (0, 1), direct.err
    assert json.loads(direct.out)["files"][0]["plan"]["units"] == f["plan"]["units"]


# FSDP chosen on the accelerate command line, no config file (OmniGen2's and PixArt's launch lines): the options were
# dropped and the plan was a suggestion (fsdp2, no wrap code) with exit 0; accelerate's own parser reads them now
ACCELERATE_FLAGS = {
    "train.py": '''
        import torch
        import torch.nn as nn
        from accelerate import Accelerator


        class Block(nn.Module):
            def __init__(self, d=128):
                super().__init__()
                self.ff = nn.Linear(d, d)

            def forward(self, x):
                return x + self.ff(x)


        class Net(nn.Module):
            def __init__(self, n=6):
                super().__init__()
                self.embed = nn.Embedding(100, 128)
                self.blocks = nn.ModuleList(Block() for _ in range(n))


        def main():
            accelerator = Accelerator()
            model = accelerator.prepare(Net())
            optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4))


        if __name__ == "__main__":
            main()
    ''',
    "flags.sh": '''
        #!/bin/bash
        accelerate launch --use_fsdp --fsdp_sharding_strategy=SHARD_GRAD_OP --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \\
          --fsdp_transformer_layer_cls_to_wrap Block --fsdp_use_orig_params true --mixed_precision bf16 \\
          --num_machines=1 --num_processes=4 train.py
    ''',
    "config.sh": '''
        #!/bin/bash
        accelerate launch --config_file fsdp.yaml train.py
    ''',
    "fsdp.yaml": '''
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        fsdp_config:
          fsdp_sharding_strategy: SHARD_GRAD_OP
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_transformer_layer_cls_to_wrap: Block
          fsdp_use_orig_params: true
        mixed_precision: bf16
        num_machines: 1
        num_processes: 4
    ''',
}


def test_accelerate_fsdp_options_on_the_launch_line_are_read_by_accelerate(cli, tmp_path):
    write_tree(tmp_path, ACCELERATE_FLAGS)
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    # the oracle: accelerate's own launcher gives the same FSDP environment for the flags and for the config
    def env_of(words):
        before = dict(os.environ)
        try:
            args, _, _ = _validate_launch_command(launch_command_parser().parse_args([*words, "train.py"]))
            return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith("FSDP_") or k.startswith("ACCELERATE_")}
        finally:
            os.environ.clear()
            os.environ.update(before)

    flags = ["--use_fsdp", "--fsdp_sharding_strategy=SHARD_GRAD_OP", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
             "--fsdp_transformer_layer_cls_to_wrap", "Block", "--fsdp_use_orig_params", "true", "--mixed_precision",
             "bf16", "--num_processes=4"]
    by_flags, by_config = env_of(flags), env_of(["--config_file", str(tmp_path / "fsdp.yaml")])
    assert by_flags["ACCELERATE_USE_FSDP"] == "true" and by_flags["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block"
    assert {k: by_flags[k] for k in by_config if k.startswith("FSDP_")} == {k: v for k, v in by_config.items()
                                                                          if k.startswith("FSDP_")}
    plans = []
    for script in ("flags.sh", "config.sh"):
        res = cli(script, "--no-cache", "--format", "json", cwd=str(tmp_path))
        assert res.code in (0, 1), res.err
        plans.append(json.loads(res.out)["files"][0]["plan"])
    flagged, configured = plans
    assert flagged["framework"] == configured["framework"] and flagged["api"] == "fsdp1"
    assert flagged["world_size"] == 4 and flagged["sharding_strategy"] == "SHARD_GRAD_OP"
    assert [u["module"] for u in flagged["units"]] == [f"blocks.{i}" for i in range(6)] + [""]
    assert flagged["units"] == configured["units"]


# a prefetching/bucketing wrapper makes its iterator in its constructor (`self.iterator = iter(loader)`), after the
# model is built and before it is wrapped; the replay took `iter(loader)` for training and suggested a plan, exit 0
# (Pyramid-Flow's bucket loader). Training starts with the first batch drawn
BUCKETEER = {
    "data/__init__.py": "",
    "data/buckets.py": '''
        import torch
        from torch.utils.data import DataLoader, Dataset


        class Toy(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                return torch.randn(32)


        class Bucketeer:
            def __init__(self, loader):
                self.iterator = iter(loader)

            def __iter__(self):
                return self

            def __next__(self):
                return next(self.iterator)


        def make_loader(batch_size=4):
            return Bucketeer(DataLoader(Toy(), batch_size=batch_size))
    ''',
    "train.py": '''
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from data.buckets import make_loader


        class Block(nn.Module):
            def __init__(self, d=32):
                super().__init__()
                self.ff = nn.Linear(d, d)

            def forward(self, x):
                return x + self.ff(x)


        def build():
            return nn.Sequential(*[Block() for _ in range(4)])


        def main():
            dist.init_process_group("nccl")
            model = build()
            loader = make_loader()
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                         mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device_id=torch.cuda.current_device())
            optimizer = torch.optim.AdamW(model.parameters())
            for batch in loader:
                model(batch.cuda()).sum().backward()
                optimizer.step()


        if __name__ == "__main__":
            main()
    ''',
}


def test_an_iterator_made_in_a_constructor_is_not_training(cli, tmp_path, monkeypatch):
    write_tree(tmp_path, BUCKETEER)
    _assert_shard_grad_op_units_match_torch(cli, tmp_path, monkeypatch, "bucket_train")


def test_a_batch_drawn_before_the_unreached_wrap_is_named_not_planned(cli, tmp_path):
    # the first batch drawn before the file's wrap code ran: a suggested plan for the model built on the way passed
    # as the job's (exit 0); now the lint names what stopped it and the wrap code it did not reach
    files = dict(BUCKETEER)
    files["train.py"] = BUCKETEER["train.py"].replace(
        "loader = make_loader()", "loader = make_loader()\n            with torch.no_grad():\n                model(next(loader))")
    write_tree(tmp_path, files)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "iteration over a DataLoader" in line and "before the wrap code in train.py ran" in line, line


# a probe run with the same python whose stdout the setup parses (py-cpuinfo's `cpuinfo.py --json`, a project's
# `tools/gpu_layout.py --json`): not the training launch; it runs as on a node and the plan is the script's
PROBE = {
    "tools/__init__.py": "",
    "tools/layout.py": '''
        import json

        print(json.dumps({"replicas": 2}))
    ''',
    "train.py": '''
        import json
        import os
        import subprocess
        import sys

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        HERE = os.path.dirname(os.path.abspath(__file__))


        def layout():
            out = subprocess.check_output([sys.executable, os.path.join(HERE, "tools", "layout.py"), "--json"])
            return json.loads(out)


        def main():
            replicas = layout()["replicas"]
            mesh = init_device_mesh("cuda", (replicas, dist.get_world_size() // replicas), mesh_dim_names=("rep", "shard"))
            model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_python_probe_whose_output_the_setup_reads_runs_as_on_a_node(cli, tmp_path):
    write_tree(tmp_path, PROBE)
    probe = subprocess.run([sys.executable, str(tmp_path / "tools" / "layout.py"), "--json"], capture_output=True,
                           text=True)
    assert json.loads(probe.stdout) == {"replicas": 2}      # what the node's subprocess prints
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["mesh"]["shape"] == [2, 4], plan["mesh"]
    assert not any("linted that launch" in n for n in json.loads(res.out)["files"][0]["notes"])


# a generic trainer in a project package runs the whole job in `__call__` (process group, `self.setup_models()`
# that the entry's subclass wraps, the optimizer); the entry runs `core = MyCore(...); core()`. The instance call
# was not seen to reach the wrap, and `os.environ.get(...)` on the constructor's line was matched by name to the
# package's unrelated `get` method that freezes: the replay ended before `core()`, a suggested plan, exit 0
# (StableCascade's WarpCore)
INSTANCE_CALL = {
    "pyproject.toml": '[project]\nname = "warp"\nversion = "0.1"\n',
    "core/__init__.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        import torch.nn as nn


        class FaceEncoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)

            def get(self, image):
                self.requires_grad_(False)
                return self.proj(image)


        class WarpCore:
            def __init__(self, device: torch.device):
                self.device = device

            def setup_models(self) -> nn.Module:
                raise NotImplementedError

            def __call__(self):
                dist.init_process_group("nccl")
                model = self.setup_models()
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                self.train(model, optimizer)

            def train(self, model, optimizer):
                for step in range(10):
                    model(torch.randn(2, 64, device=self.device)).sum().backward()
                    optimizer.step()
    ''',
    "train.py": '''
        import os

        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from core import WarpCore


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(64, 64)

            def forward(self, x):
                return self.l(x)


        def build():
            return nn.Sequential(*[Block() for _ in range(4)])


        class MyCore(WarpCore):
            def setup_models(self):
                return FSDP(build(), auto_wrap_policy=ModuleWrapPolicy([Block]), device_id=self.device,
                            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))


        if __name__ == "__main__":
            core = MyCore(device=torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))))
            core()
    ''',
}


def test_an_instance_whose_call_builds_and_wraps_the_model_is_followed(cli, tmp_path, monkeypatch):
    write_tree(tmp_path, INSTANCE_CALL)
    _assert_shard_grad_op_units_match_torch(cli, tmp_path, monkeypatch, "warp_train")


# the wrap and optimizer builders are registered at import as a train spec (`register_train_spec(TrainSpec(
# parallelize_fn=parallelize, ...))`, torchtitan's and flame's idiom); `main` looks the spec up and calls
# `spec.parallelize_fn(model)`: the registration was taken for the last statement that matters, "no model found"
REGISTRY = {
    "pyproject.toml": '[project]\nname = "flamish"\nversion = "0.1"\n',
    "flamish/__init__.py": "",
    "flamish/registry.py": '''
        from __future__ import annotations

        from dataclasses import dataclass
        from typing import Callable

        _SPECS: dict[str, "TrainSpec"] = {}


        @dataclass
        class TrainSpec:
            name: str
            parallelize_fn: Callable
            build_optimizers_fn: Callable


        def register_train_spec(spec: TrainSpec) -> None:
            _SPECS[spec.name] = spec


        def get_train_spec(name: str) -> TrainSpec:
            return _SPECS[name]
    ''',
    "flamish/models/__init__.py": '''
        import torch

        from flamish.models.parallelize import parallelize
        from flamish.registry import TrainSpec, register_train_spec


        def build_optimizers(model):
            return torch.optim.AdamW(model.parameters())


        register_train_spec(TrainSpec(name="mlp", parallelize_fn=parallelize, build_optimizers_fn=build_optimizers))
    ''',
    "flamish/models/parallelize.py": '''
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        import torch


        def parallelize(model):
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model:
                fully_shard(layer, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            return model
    ''',
    "train.py": '''
        import argparse

        import torch
        import torch.nn as nn

        import flamish.models  # noqa: F401  (registers the specs)
        from flamish.registry import get_train_spec


        def main(args):
            torch.distributed.init_process_group("nccl")
            spec = get_train_spec(args.model)
            model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(args.layers)])
            spec.parallelize_fn(model)
            optimizer = spec.build_optimizers_fn(model)
            for _ in range(10):
                model(torch.randn(4, 64, device="cuda")).sum().backward()
                optimizer.step()


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--model", default="mlp")
            parser.add_argument("--layers", type=int, default=5)
            main(parser.parse_args())
    ''',
}


def test_wrap_functions_registered_in_a_spec_are_followed(cli, tmp_path, monkeypatch):
    from oracle import fsdp2_groups

    write_tree(tmp_path, REGISTRY)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "--layers", "3", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["origin"] != "suggested"
    monkeypatch.syspath_prepend(str(tmp_path))
    from flamish.models.parallelize import parallelize
    import torch.nn as nn

    real = fsdp2_groups(lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]), world_size=8,
                        apply=lambda model, mesh: parallelize(model))
    assert [u["module"] for u in plan["units"]] == [",".join(g["modules"]) for g in real]
    assert plan["units"][0]["param_dtype"] == "bfloat16" and plan["units"][0]["reduce_dtype"] == "float32"


# one policy set written for a family of models (`{Block, MBlock}`: Samba's attention and Mamba blocks; Bagel's
# variants): torch wraps each model's own blocks and ignores the other class; FSD103 was an error (exit 1)
FAMILY_SET = '''
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(64, 64)

    def forward(self, x):
        return self.attn(x)


class MBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = nn.Linear(64, 64)

    def forward(self, x):
        return self.mixer(x)


def build(mamba: bool = False):
    return nn.Sequential(*[(MBlock() if mamba else Block()) for _ in range(4)], nn.Linear(64, 8))


model = FSDP(build(), auto_wrap_policy=ModuleWrapPolicy({Block, MBlock}), device_id=torch.cuda.current_device())
'''


def test_a_class_of_a_family_set_the_model_lacks_is_info_not_an_error(cli, tmp_path):
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    (tmp_path / "train.py").write_text(FAMILY_SET)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.out
    f = json.loads(res.out)["files"][0]
    [finding] = [x for x in f["findings"] if x["code"] == "FSD103"]
    assert finding["severity"] == "info" and "`MBlock`" in finding["message"] and "`Block`" in finding["message"]
    # the oracle: torch wraps the four Blocks (MBlock matches nothing, silently)
    src = FAMILY_SET.split("model = FSDP(")[0]
    ns: dict = {}
    exec(compile(src, str(tmp_path / "train.py"), "exec"), ns)
    real = fsdp1_units(ns["build"], world_size=8, auto_wrap_policy=ModuleWrapPolicy({ns["Block"], ns["MBlock"]}))
    assert [(u["module"], u["numel"]) for u in f["plan"]["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]
    # a policy whose every class is missing is still the error it was
    (tmp_path / "train.py").write_text(FAMILY_SET.replace("ModuleWrapPolicy({Block, MBlock})", "ModuleWrapPolicy({MBlock})"))
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code == 1
    assert [x["severity"] for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD103"] == ["error"]


# a Python launcher builds accelerate's command line and runs it with os.system (PixArt's DMD launcher): the model is
# built by that launch; it was "no model found"
OS_SYSTEM = {
    "train.py": ACCELERATE_FLAGS["train.py"],
    "scripts/run.py": '''
        import argparse
        import os

        parser = argparse.ArgumentParser()
        parser.add_argument("--np", type=int, default=2)
        args = parser.parse_args()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cmd = (f"accelerate launch --use_fsdp --fsdp_sharding_strategy=2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP "
               f"--fsdp_transformer_layer_cls_to_wrap Block --num_processes={args.np} {root}/train.py")
        os.system(cmd)
    ''',
    "launch.sh": '''
        #!/bin/bash
        python scripts/run.py --np 4
    ''',
    "direct.sh": '''
        #!/bin/bash
        accelerate launch --use_fsdp --fsdp_sharding_strategy=2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \\
          --fsdp_transformer_layer_cls_to_wrap Block --num_processes=4 train.py
    ''',
}


def test_a_launch_run_with_os_system_is_followed(cli, tmp_path):
    write_tree(tmp_path, OS_SYSTEM)
    res = cli("launch.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    followed = json.loads(res.out)["files"][0]
    assert any("accelerate launch --use_fsdp" in n and "linted that launch" in n for n in followed["notes"])
    res = cli("direct.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    direct = json.loads(res.out)["files"][0]["plan"]
    assert followed["plan"]["world_size"] == direct["world_size"] == 4
    assert followed["plan"]["sharding_strategy"] == direct["sharding_strategy"] == "SHARD_GRAD_OP"
    assert followed["plan"]["units"] == direct["units"] and len(direct["units"]) == 7


# Lightning's Trainer(devices=4) run as plain `python train.py` from a launch script: Lightning's own launcher
# re-runs the script for local ranks 1-3 and goes on as rank 0. With no torchrun variables, torch's
# `is_torchelastic_launched()` must say False (it said True, and Lightning read the missing LOCAL_RANK)
LIGHTNING_PLAIN = {
    "run.sh": '''
        #!/bin/bash
        python train.py
    ''',
    "train.py": '''
        import lightning as L
        import torch
        import torch.nn as nn
        from lightning.pytorch.strategies import FSDPStrategy


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(64, 64)

            def forward(self, x):
                return self.l(x)


        class Lit(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(*[Block() for _ in range(4)])

            def training_step(self, batch, i):
                return self.blocks(batch).sum()

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters())


        if __name__ == "__main__":
            trainer = L.Trainer(devices=4, strategy=FSDPStrategy(auto_wrap_policy={Block}), max_steps=2)
            trainer.fit(Lit(), torch.utils.data.DataLoader(torch.randn(64, 64), batch_size=4))
    ''',
}


def test_lightning_run_as_plain_python_from_a_launch_script_launches_its_own_ranks(cli, tmp_path):
    write_tree(tmp_path, LIGHTNING_PLAIN)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
    probe = subprocess.run([sys.executable, "-c", "import torch.distributed as d; from lightning.fabric.plugins.environments "
                            "import TorchElasticEnvironment as T; print(d.is_torchelastic_launched(), T.detect())"],
                           capture_output=True, text=True, env=env)
    assert probe.stdout.split() == ["False", "False"], probe.stderr
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    direct = cli("train.py", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert direct.code in (0, 1), direct.err
    assert plan["world_size"] == 4 and plan["framework"] == "lightning"
    assert plan["units"] == json.loads(direct.out)["files"][0]["plan"]["units"]


# after the training launch, the launch script converts the last checkpoint (flame's `python -m ...convert_dcp_to_hf
# --step N`); torch.distributed.checkpoint raises its CheckpointException -- a BaseException -- for the checkpoint
# this machine does not have. It was an internal error and exit 2 beside the training launch's plan
CONVERT_AFTER = {
    "run.sh": '''
        #!/bin/bash
        torchrun --nproc_per_node 8 train.py
        python tools/convert.py --step 100
    ''',
    "train.py": '''
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    ''',
    "tools/convert.py": '''
        import argparse

        import torch.distributed.checkpoint.format_utils as formats

        parser = argparse.ArgumentParser()
        parser.add_argument("--step", type=int)
        args = parser.parse_args()
        formats.dcp_to_torch_save(f"exp/checkpoint/step-{args.step}", "exp/model.pt")
    ''',
}


def test_a_conversion_after_training_that_fails_is_a_note_beside_the_plan(cli, tmp_path):
    write_tree(tmp_path, CONVERT_AFTER)
    node = run_subprocess(["tools/convert.py", "--step", "100"], cwd=str(tmp_path))
    assert "CheckpointException" in node.stderr       # what the node prints: the checkpoint is not there
    from torch.distributed.checkpoint.api import CheckpointException

    assert not issubclass(CheckpointException, Exception)
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert len(json.loads(res.out)["files"][0]["plan"]["units"]) == 3
    assert "fsdp-lint: note: tools/convert.py:" in res.err and "CheckpointException" in res.err
    assert "internal error" not in res.err


# a one-GPU run started as plain `python train.py` gives itself the env:// rendezvous values in a helper (SpecForge's
# `_bootstrap_single_process_env()`: a free port, RANK/WORLD_SIZE=1) and reads them back. The helper binds nothing, so
# it was left out of the slice (KeyError: 'WORLD_SIZE'); and the world it sets is the job's world
SELF_RENDEZVOUS = {
    "run.sh": '''
        #!/bin/bash
        python train.py
    ''',
    "train.py": '''
        import os
        import socket

        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard


        def _bootstrap_single_process_env() -> None:
            if "RANK" in os.environ:
                return
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(port)})


        def main():
            _bootstrap_single_process_env()
            world = int(os.environ["WORLD_SIZE"])
            dist.init_process_group("gloo")
            assert dist.get_world_size() == world
            model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
            for layer in model:
                fully_shard(layer)
            fully_shard(model)


        if __name__ == "__main__":
            main()
    ''',
}


def test_a_plain_python_run_that_sets_its_own_rendezvous_runs_on_its_own_world(cli, tmp_path):
    write_tree(tmp_path, SELF_RENDEZVOUS)
    # the oracle: torch's own env:// rendezvous in the plain process gives the world the helper set
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    probe = subprocess.run([sys.executable, "-c", "import runpy, torch.distributed as d; runpy.run_path('train.py', "
                            "run_name='__main__'); print(d.get_world_size())"], cwd=str(tmp_path), capture_output=True,
                           text=True, env=env, timeout=120)
    assert probe.stdout.strip().splitlines()[-1] == "1", probe.stderr
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 1 and len(f["plan"]["units"]) == 4
    assert any("init_process_group (world 1" in n for n in f["notes"])


# a frozen target head reads the two tensors it needs from the target model's safetensors by their checkpoint names
# (`if k in f.keys(): f.get_tensor(k)`, SpecForge's TargetEmbeddingsAndHead); with the file not here, the stand-in's
# keys were the head's own names, none matched, and the script's own check raised
HEAD_KEYS = '''
import sys

import torch
import torch.nn as nn
from safetensors import safe_open
from torch.distributed.fsdp import fully_shard

KEYS = ["model.embed_tokens.weight", "lm_head.weight"]


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(100, 16)
        self.lm_head = nn.Linear(16, 100, bias=False)


head = Head()
found = {}
with safe_open(sys.argv[1], framework="pt") as f:
    for k in KEYS:
        if k in f.keys():
            found[k] = f.get_tensor(k)
missing = sorted(set(KEYS) - set(found))
if missing:
    raise RuntimeError(f"Required target weight tensors were not loaded: {missing}")
assert found["model.embed_tokens.weight"].shape == head.embed_tokens.weight.shape
head.requires_grad_(False)
draft = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
for layer in draft:
    fully_shard(layer)
fully_shard(draft)
'''


def test_a_stand_in_checkpoints_keys_answer_the_checkpoint_names_of_the_models_tensors(cli, tmp_path):
    from safetensors.torch import save_file
    import torch

    (tmp_path / "train.py").write_text(HEAD_KEYS)
    # the oracle: the real file with those names loads both tensors
    save_file({"model.embed_tokens.weight": torch.zeros(100, 16), "lm_head.weight": torch.zeros(100, 16)},
              str(tmp_path / "real.safetensors"))
    node = run_subprocess(["train.py", "real.safetensors"], cwd=str(tmp_path))
    assert "Required target" not in node.stderr
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "ckpt/model.safetensors",
              cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert len(f["plan"]["units"]) == 4
    assert any("stands in as the model's own state dict" in n for n in f["notes"])


# a model config file that IS here, of a model type a package registers (flame's configs/transformer_340M.json, whose
# `transformer` type flash-linear-attention registers at import): transformers refuses it on a node without that
# package too; fsdp-lint said the hub config was not downloaded
LOCAL_CONFIG = '''
import sys

from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

config = AutoConfig.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_config(config)
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
'''


def test_a_config_file_that_is_here_is_refused_with_transformers_words_not_as_a_download(cli, tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "gla.json").write_text(json.dumps({"model_type": "gla_registered_elsewhere",
                                                              "hidden_size": 64}))
    (tmp_path / "train.py").write_text(LOCAL_CONFIG)
    node = run_subprocess(["train.py", "configs/gla.json"], cwd=str(tmp_path))
    assert "does not recognize this architecture" in node.stderr
    res = cli("train.py", "-n", "8", "--no-cache", "--", "configs/gla.json", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "does not recognize this architecture" in line and "never downloads" not in line, line


# a skipped statement that also calls a stand-in of a package not installed (flame's data pipeline on fla's and
# torchtitan's stand-ins): deciding what the statement hands on read the stand-in class's `__code__` -- a property --
# and the lint crashed
STAND_IN_IN_SKIPPED = '''
import argparse

import torch.nn as nn
from not_installed_datakit import build_loader
from torch.distributed.fsdp import fully_shard

args = argparse.Namespace(path="data/train.txt", layers=3)
build_loader(args, open(args.path).read())
model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(args.layers)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
'''


def test_a_skipped_statement_calling_a_stand_in_is_skipped_as_any_other(cli, tmp_path):
    (tmp_path / "train.py").write_text(STAND_IN_IN_SKIPPED)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert len(f["plan"]["units"]) == 4
    assert any("FileNotFoundError" in n for n in f["notes"]), f["notes"]
