"""Round 10 of the real-launch survey (benchmarks/realworld.md, "Round 10"): what a GPU node does that
the simulated node did otherwise. Each fixture is written in the idiom the survey met; the oracle is
real Python / real torch running the same code."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402

HANDLED = os.path.join(REPO, "fixtures", "repos", "handled_probe")


def checkout(monkeypatch, root: str, package: str):
    """A fixture repository as `pip install -e .` leaves it: its package importable (and forgotten after)."""
    monkeypatch.syspath_prepend(root)
    yield root
    for name in [n for n in sys.modules if n.split(".")[0] == package]:
        sys.modules.pop(name, None)


def _lint_json(cli, *argv, cwd, script_args=()):
    res = cli(*argv, "--no-cache", "--format", "json", *(("--", *script_args) if script_args else ()), cwd=cwd)
    assert res.code in (0, 1), res.err
    return json.loads(res.out)["files"][0]


@pytest.fixture
def handled(monkeypatch):
    for var in ("R2_PROFILE", "R2_ENDPOINT_URL", "R2_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    yield from checkout(monkeypatch, HANDLED, "olm")


def test_a_failure_the_scripts_own_except_catches_by_name_reaches_it(cli, handled):
    # `if name is None: raise OlmEnvironmentError(...)` inside a helper, caught by the caller's
    # `except OlmEnvironmentError: return torch.bfloat16`; and a KeyError of os.environ inside an `if`,
    # caught by `except KeyError: pass`. Skipping either statement as "failed here" changed the
    # script's control flow: the plan had float32 (the wrap never ran) where the job runs bf16.
    from olm.precision import param_dtype, reduce_dtype

    real_param, real_reduce = param_dtype(), reduce_dtype()     # the oracle: the helpers as Python runs them
    f = _lint_json(cli, "scripts/train.py", "-n", "8", cwd=handled)
    units = f["plan"]["units"]
    assert [u["module"] for u in units] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", ""]
    assert {u["param_dtype"] for u in units} == {str(real_param).replace("torch.", "")} == {"bfloat16"}
    assert {u["reduce_dtype"] for u in units} == {str(real_reduce).replace("torch.", "")} == {"float32"}
    # handled by the script, so not a setup statement that "failed here"
    assert not any("OlmEnvironmentError" in n or "KeyError" in n for n in f.get("notes", [])), f.get("notes")


def test_a_handler_that_raises_again_or_a_blanket_one_does_not_take_the_failure(tmp_path, cli):
    # `except KeyError: raise ConfigError(...)` ends the script on a node as well, and `except Exception`
    # around main() is a logger: there the replay skips the failing statement as before (a file this
    # machine lacks), and the plan is built.
    (tmp_path / "train.py").write_text('''
import json, os
import torch, torch.nn as nn
from torch.distributed.fsdp import fully_shard

class ConfigError(Exception):
    pass

def load_cluster(path):
    try:
        if os.path.exists("/etc/cluster"):
            return json.load(open("/etc/cluster"))
        return json.load(open(path))        # the cluster's file, not here
    except KeyError:
        raise ConfigError(path)

def main():
    cluster = load_cluster("/mnt/cluster.json")
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
    model.cluster_name = cluster["name"]
    for layer in model:
        fully_shard(layer)
    fully_shard(model)

try:
    main()
except Exception as e:
    print("failed", e)
''')
    f = _lint_json(cli, "train.py", "-n", "4", cwd=str(tmp_path))
    assert [u["module"] for u in f["plan"]["units"]] == ["0", "1", "2", ""]
    assert any("FileNotFoundError" in n for n in f.get("notes", [])), f.get("notes")


VIDEO = os.path.join(REPO, "fixtures", "repos", "video_coord")


@pytest.fixture
def video(monkeypatch):
    yield from checkout(monkeypatch, VIDEO, "vidgen")


def test_a_launch_script_built_from_bash_arrays_on_a_node_of_coordinated_groups(cli, video):
    # examples/finetune/finetune.sh passes its arguments as "${parallel_args[@]}" "${training_args[@]}" ...
    # of arrays written over several lines (comments between elements, `+=`); the package's vLLM-style
    # coordinators make a gloo CPU group beside each device group and assert it is not NCCL, probe which
    # ranks share the node through shared memory and an all_reduce of a rank-indexed tensor, and size the
    # HSDP shard group by it; a GPU memory monitor indexes torch.cuda.memory_stats() at setup. On one node
    # of 8 GPUs: mesh (replicate 1, shard 8), as real FSDP2 builds it on that mesh.
    from oracle_nd import fsdp2_nd
    from vidgen.models.dit import VideoDiT

    f = _lint_json(cli, "examples/finetune/finetune.sh", cwd=video)
    plan = f["plan"]
    assert plan["api"] == "fsdp2" and plan["world_size"] == 8
    assert plan["mesh"]["shape"] == [1, 8] and plan["mesh"]["dim_names"] == ["replicate", "shard"]
    assert f.get("notes") == [] and not f.get("replay", {}).get("skipped_statements"), (f.get("notes"), f.get("replay"))
    # each array element one word, as bash gives them (a quoted element with a space stays one word)
    assert f["args"] == ["--num_gpus", "8", "--hsdp_shard_dim", "-1", "--output_dir", "checkpoints/dit_finetune",
                         "--train_batch_size", "1", "--learning_rate", "5e-5", "--mixed_precision", "bf16",
                         "--data_path", "data/crush-smol/latents", "--tracker_project_name", "vidgen finetune"]

    def wrap(model, mesh):
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    real = fsdp2_nd(VideoDiT, wrap, world_size=8, rank=0, mesh_shape=(1, 8), mesh_dim_names=("replicate", "shard"))
    assert [u["module"] for u in plan["units"]] == [g["modules"][0] for g in real]
    for unit, group in zip(plan["units"], real):
        assert unit["shard_group_size"] == 8 and unit["replicate_group_size"] == 1
        local = {p["fqn"]: p["local_shape"] for p in unit["params"]}
        assert local == {p["fqn"]: p["local_shape"] for p in group["params"]}
        assert unit["param_dtype"] == "bfloat16" and unit["reduce_dtype"] == "float32"


def test_the_simulated_node_answers_group_backends_memory_counters_and_rank_indexed_reductions(tmp_path, cli):
    # each answer as a GPU node gives it: get_backend of a gloo group is gloo (of the world: the backend
    # init_process_group was given), an initialised device's memory_stats has its counters, and
    # `t[rank] = 1; all_reduce(t)` holds a 1 from every rank
    (tmp_path / "probe.py").write_text('''
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.fsdp import fully_shard

def probe():
    dist.init_process_group("cpu:gloo,cuda:nccl")
    cpu = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    dev = dist.new_group(list(range(dist.get_world_size())))
    seen = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    seen[dist.get_rank(group=cpu)] = 1
    dist.all_reduce(seen, group=cpu)
    stats = torch.cuda.memory_stats()
    return (dist.get_backend(cpu), dist.get_backend(dev), dist.get_backend(), seen.tolist(),
            stats["active_bytes.all.peak"], stats["num_ooms"])

answers = probe()
assert answers == ("gloo", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", [1, 1, 1, 1], 0, 0), answers
model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])
for layer in model:
    fully_shard(layer)
fully_shard(model)
''')
    f = _lint_json(cli, "probe.py", "-n", "4", cwd=str(tmp_path))
    assert [u["module"] for u in f["plan"]["units"]] == ["0", "1", "2", ""]
    assert f.get("notes") == [], f.get("notes")


TUNER = os.path.join(REPO, "fixtures", "repos", "tuner_cli")
FULL_ARGS = ("--output_dir", "out", "--fsdp_enable", "--optimizer", "adamw", "--data_backend_config", "d.json")


@pytest.fixture
def tuner(monkeypatch):
    yield from checkout(monkeypatch, TUNER, "tuner")


def test_a_script_whose_own_parser_reports_and_returns_names_what_it_reported(cli, tuner):
    # the README's command lacks two required arguments; the toolkit's parser logs its error and returns
    # None, and the script ends without a model. The only module built on the way is an activation made as
    # a default argument when the codec module was imported: that is no model of the setup's (a suggested
    # plan for a PReLU, exit 0, before)
    res = cli("tuner/train.py", "-n", "2", "--no-cache", "--", "--output_dir", "out", "--fsdp_enable", cwd=tuner)
    assert res.code == 2, res.out
    assert res.err.splitlines()[0] == (
        "fsdp-lint: error: tuner/train.py: the script ran to its end without building a model or reaching its wrap "
        "code; it reported: train.py: error: the following arguments are required: --optimizer, --data_backend_config")


def test_with_its_arguments_the_plan_is_the_wrap_it_runs_and_docstrings_stay(cli, tuner):
    # the registry imports a pipeline whose __call__ is decorated with diffusers' replace_example_docstring,
    # which splits the function's docstring: the replay keeps docstrings as Python does
    from oracle import fsdp2_groups
    from tuner.models.pipeline import UNetPipeline
    from tuner.models.unet import UNet

    assert "Examples" in UNetPipeline.__call__.__doc__
    f = _lint_json(cli, "tuner/train.py", "-n", "2", cwd=tuner, script_args=FULL_ARGS)
    assert f.get("notes") == [], f.get("notes")

    def wrap(model, mesh):
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    real = fsdp2_groups(UNet, world_size=2, apply=wrap)
    units = f["plan"]["units"]
    assert [u["module"] for u in units] == [g["modules"][0] for g in real] == ["blocks.0", "blocks.1", "blocks.2",
                                                                           "blocks.3", ""]
    for unit, group in zip(units, real):
        assert {p["fqn"]: p["local_shape"] for p in unit["params"]} == \
            {p["fqn"]: p["local_shape"] for p in group["params"]}
    assert {u["param_dtype"] for u in units} == {"bfloat16"}


def test_an_import_guard_that_exits_names_the_failure_it_was_handling(cli, tuner):
    # `except Exception: print("pip install fastresize"); exit(1)` at import: stdout is the script's, the
    # cause is the ImportError being handled (before: "exited with status 1 before training started")
    res = cli("tuner/train_images.py", "-n", "2", "--no-cache", "--", *FULL_ARGS, cwd=tuner)
    assert res.code == 2, res.out
    assert res.err.splitlines()[0] == (
        "fsdp-lint: error: tuner/train_images.py: the script exited with status 1 before training started, handling "
        "tuner/imaging/load.py:2: ModuleNotFoundError: No module named 'fastresize'")


def test_a_script_whose_setup_never_reaches_its_wrap_or_training_is_no_plan(tmp_path, cli):
    # an installed training library wraps in its train module's constructor (olmo-core style); the argument
    # the script hands it is left at its default because the statement reading it failed on a file the node
    # has and this machine lacks, so the constructor fails before its wrap and training is never reached:
    # that is the cause, with the first failure (before: a suggested plan of the model, exit 0)
    lib = tmp_path / "venv" / "lib" / "site-packages" / "trainlib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("""
from torch.distributed.fsdp import fully_shard


class TrainModule:
    def __init__(self, model, steps):
        self.warmup = int(0.1 * steps)
        for block in model:
            fully_shard(block)
        fully_shard(model)
        self.model, self.steps = model, steps

    def fit(self):
        for step in range(self.steps):
            pass
""")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("""
import json
import torch.nn as nn
from trainlib import TrainModule


class Tower(nn.Module):
    def __init__(self, width=32, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def __iter__(self):
        return iter(self.layers)


def read_steps(path):
    with open(path) as fh:
        return json.load(fh)["steps"]


def main():
    model = Tower()
    steps = None
    steps = read_steps("/mnt/shared/run/schedule.json")
    module = TrainModule(model, steps)
    module.fit()


if __name__ == "__main__":
    main()
""")
    site = str(tmp_path / "venv" / "lib" / "site-packages")
    sys.path.insert(0, site)
    try:
        res = cli("train.py", "-n", "4", "--no-cache", cwd=str(repo))
    finally:
        sys.path.remove(site)
        sys.modules.pop("trainlib", None)
    assert res.code == 2, res.out
    assert res.err.splitlines()[0] == (
        "fsdp-lint: error: train.py: the setup never reached its wrap code or its training: train.py:25: TypeError: "
        "unsupported operand type(s) for *: 'float' and 'NoneType' (failed here and skipped; the first setup "
        "statement that failed: train.py:24: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/mnt/shared/run/schedule.json'; 2 later setup statements failed too)"), res.err


def test_a_module_missing_from_a_namespace_package_names_its_own_distribution(tmp_path, cli):
    # `google` is a namespace package several distributions fill: google.api_core (installed) imports
    # google.protobuf, which is protobuf's -- not "another version of googleapis-common-protos"
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "google" / "api_core").mkdir(parents=True)
    (site / "google" / "api_core" / "__init__.py").write_text("")
    (site / "google" / "api_core" / "exceptions.py").write_text(
        "from google.protobuf import message\n\n\nclass NotFound(Exception):\n    pass\n")
    dist_info = site / "googleapis_common_protos-1.76.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: googleapis-common-protos\nVersion: 1.76.0\n")
    (dist_info / "top_level.txt").write_text("google\n")
    (dist_info / "RECORD").write_text("google/api_core/__init__.py,,\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("""
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from google.api_core.exceptions import NotFound


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))


def main():
    model = Net()
    retry_on = (NotFound,) + NotFound.__mro__
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


if __name__ == "__main__":
    main()
""")
    sys.path.insert(0, str(site))
    try:
        f = _lint_json(cli, "train.py", "-n", "2", cwd=str(repo))
    finally:
        sys.path.remove(str(site))
        for name in [n for n in sys.modules if n == "google" or n.startswith("google.")]:
            sys.modules.pop(name, None)
    notes = " ".join(f.get("notes", []))
    assert "`google.protobuf` is not installed here: pip install protobuf" in notes, notes
    assert "googleapis-common-protos" not in notes, notes


def test_a_console_script_whose_function_the_module_lacks_is_named_as_broken(cli, tuner):
    # pyproject.toml declares tuner-train = "tuner.train:main", and tuner/train.py keeps its logic under
    # `if __name__ == "__main__"` with no main(): the installed command fails with ImportError on a node
    res = cli("scripts/finetune.sh", "--no-cache", cwd=tuner)
    assert res.code == 2, res.out
    assert res.err.splitlines()[0] == (
        "fsdp-lint: error: scripts/finetune.sh: line 3 runs `tuner-train`, the project's command (tuner.train:main), but "
        "tuner/train.py defines no `main`: the command fails there on a node too (ImportError: cannot import name "
        "'main'); lint the file as `python tuner/train.py` runs it, or fix the entry point")


FABRIC = os.path.join(REPO, "fixtures", "repos", "fabric_fp8", "examples", "fabric", "model_parallel")


@pytest.fixture
def fabric_example(monkeypatch):
    monkeypatch.syspath_prepend(FABRIC)
    yield FABRIC
    for name in ("model", "parallelism"):
        sys.modules.pop(name, None)


def test_a_frameworks_own_launch_check_is_reported_not_skipped(cli, fabric_example):
    # ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1) on a node of 8 GPUs: Lightning's
    # launch refuses it (the oracle: Lightning's own mesh check with those sizes); skipping that failure
    # reported its consequence, "Accessing the device mesh before processes have initialized", a line later
    from lightning.fabric.strategies.model_parallel import _setup_device_mesh
    import torch

    with pytest.raises(RuntimeError) as real:
        _setup_device_mesh(4, 1, 8, torch.device("cpu"))
    res = cli("train.py", "--no-cache", cwd=fabric_example)
    assert res.code == 2, res.out
    assert res.err.splitlines()[0] == (f"fsdp-lint: error: train.py:18: setup code failed on the meta device: "
                                       f"RuntimeError: {real.value}")


def test_a_node_of_four_gpus_is_a_world_of_four_where_no_world_is_given(cli, fabric_example):
    # `python train.py` on a node of 4 GPUs: Fabric's devices="auto" are the node's 4 (before: a world of 8 by
    # default, and Lightning's "You requested gpu: [0, 1, 2, 3, 4, 5, 6, 7]"); the plan is the one real
    # Lightning builds at 4 ranks
    from test_frameworks import assert_framework_plan_matches
    from fsdp_lint.config import Settings

    f = _lint_json(cli, "train.py", "--gpus-per-node", "4", cwd=fabric_example)
    assert f["plan"]["world_size"] == 4 and f["plan"]["mesh"]["shape"] == [4, 1]
    real = assert_framework_plan_matches(os.path.join(fabric_example, "train.py"), Settings(world_size=4, gpus_per_node=4))
    assert [u["module"] for u in f["plan"]["units"]] == [u.modules[0] for u in real.plan.units] == \
        ["layers.0", "layers.1", "layers.2", "layers.3", ""]


def test_a_failure_inside_a_contextmanager_region_is_not_swallowed_at_its_yield(cli, video):
    # `with region("load_modules"): self.modules = {...load the model...}` where region is the project's
    # @contextmanager: the load's failure is thrown into the generator at its `yield`; skipping it there
    # swallowed it, the `with` carried on, and the replay reported the consequence two statements later
    # ('NoneType' object has no attribute 'blocks')
    res = cli("vidgen/training/train_pipeline.py", "--no-cache", "--", "--model_path", "org/vidgen-small", cwd=video)
    assert res.code == 2, res.out
    line = res.err.splitlines()[0]
    assert line.startswith("fsdp-lint: error: vidgen/training/train_pipeline.py: vidgen/pipeline.py:23: "), line
    assert "org/vidgen-small/config.json" in line, line
    # with the model's folder the plan is the one the script wraps
    f = _lint_json(cli, "vidgen/training/train_pipeline.py", cwd=video,
                   script_args=("--model_path", "checkpoints/vidgen-small"))
    assert [u["module"] for u in f["plan"]["units"]] == ["blocks.0", "blocks.1", "blocks.2", ""]


def test_a_launch_script_reads_its_own_folder_as_bash_gives_it(tmp_path, cli):
    # VALIDATION_FILE="$(dirname "$0")/validation.json", ROOT=$(cd "$(dirname "$0")/.." && pwd) style idioms
    folder = tmp_path / "examples" / "finetune"
    folder.mkdir(parents=True)
    (folder / "validation.json").write_text("{}")
    (tmp_path / "train.py").write_text('''
import argparse, os
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
parser = argparse.ArgumentParser()
parser.add_argument("--validation_dataset_file", required=True)
parser.add_argument("--script", required=True)
args = parser.parse_args()
assert os.path.exists(args.validation_dataset_file), args.validation_dataset_file
assert args.script.endswith("finetune.sh"), args.script
model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
for layer in model:
    fully_shard(layer)
fully_shard(model)
''')
    (folder / "finetune.sh").write_text('''#!/bin/bash
VALIDATION_DATASET_FILE="$(dirname "$0")/validation.json"
torchrun --nproc_per_node 2 train.py --validation_dataset_file $VALIDATION_DATASET_FILE --script "$0"
''')
    f = _lint_json(cli, "examples/finetune/finetune.sh", cwd=str(tmp_path))
    assert f["args"] == ["--validation_dataset_file", "examples/finetune/validation.json",
                         "--script", "examples/finetune/finetune.sh"]
    assert f["plan"]["world_size"] == 2


def test_a_model_built_as_a_torch_container_subclass_is_a_model(tmp_path, cli):
    # `class Tower(nn.Sequential)` in a model file with no FSDP use was screened out as "no nn.Module"
    (tmp_path / "tower.py").write_text('''
import torch.nn as nn


class Tower(nn.Sequential):
    def __init__(self, width=32, depth=4):
        super().__init__(*[nn.Linear(width, width) for _ in range(depth)])
''')
    import torch.nn as nn

    f = _lint_json(cli, "tower.py", "-n", "4", cwd=str(tmp_path))
    real = sum(p.numel() for p in nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)]).parameters())
    assert f["model"]["class"] == "Tower" and f["model"]["numel"] == real

