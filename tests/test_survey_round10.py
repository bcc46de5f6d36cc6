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


def _lint_json(cli, *argv, cwd):
    res = cli(*argv, "--no-cache", "--format", "json", cwd=cwd)
    assert res.code in (0, 1), res.err
    return json.loads(res.out)["files"][0]


@pytest.fixture
def handled(monkeypatch):
    monkeypatch.syspath_prepend(HANDLED)
    for var in ("R2_PROFILE", "R2_ENDPOINT_URL", "R2_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    yield HANDLED
    for name in [n for n in sys.modules if n.split(".")[0] == "olm"]:
        sys.modules.pop(name, None)


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
    monkeypatch.syspath_prepend(VIDEO)
    yield VIDEO
    for name in [n for n in sys.modules if n.split(".")[0] == "vidgen"]:
        sys.modules.pop(name, None)


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
