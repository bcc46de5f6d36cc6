"""The simulated node's Ray cluster (issue 15): RL frameworks built like verl start Ray from a plain `python -m` process
and wrap their models inside Ray actors, one per GPU, each told its rank in its ``runtime_env``. The replay runs the
first actor of each class in its own process (Ray need not be installed, and a real one is never started); the
oracle is real FSDP1 under the fake process group."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402

RL_PROJECT = {
    "pyproject.toml": '[project]\nname = "rlkit"\nversion = "0.1"\ndependencies = ["torch>=2.6", "ray[default]>=2.40"]\n',
    "rlkit/__init__.py": "",
    "rlkit/models.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.attn = nn.Linear(width, 3 * width)
                self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                return x + self.mlp(x)


        class PolicyLM(nn.Module):
            def __init__(self, vocab: int = 1000, width: int = 64, depth: int = 4):
                super().__init__()
                self.embed = nn.Embedding(vocab, width)
                self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
                self.head = nn.Linear(width, vocab, bias=False)

            def forward(self, tokens):
                x = self.embed(tokens)
                for block in self.blocks:
                    x = block(x)
                return self.head(x)
    ''',
    "rlkit/workers/__init__.py": "",
    "rlkit/workers/base.py": '''
        from __future__ import annotations

        import os

        import ray


        class Worker:
            """A worker of a group: its rank comes in the environment its actor was started with."""

            def __init__(self):
                self.rank = int(os.environ["RANK"])
                self.world_size = int(os.environ["WORLD_SIZE"])
                os.environ["LOCAL_RANK"] = ray.get_runtime_context().get_accelerator_ids()["GPU"][0]

            def get_node_ip(self):
                return ray.util.get_node_ip_address()
    ''',
    "rlkit/workers/fsdp_worker.py": '''
        from __future__ import annotations

        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from rlkit.models import Block, PolicyLM
        from rlkit.workers.base import Worker


        class ActorWorker(Worker):
            def __init__(self, config):
                super().__init__()
                self.config = config

            def init_model(self):
                if not dist.is_initialized():
                    dist.init_process_group("nccl")
                torch.cuda.set_device(int(__import__("os").environ["LOCAL_RANK"]))
                mesh = init_device_mesh("cuda", (self.world_size,), mesh_dim_names=("fsdp",))
                assert self.config.depth % 2 == 1 or self.config.allow_even, "depth must be odd for this recipe"
                model = PolicyLM(depth=self.config.depth)
                self.module = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_mesh=mesh,
                                   mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                                   device_id=torch.cuda.current_device(), use_orig_params=True)
                self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-6)
                # the rollout engine, built from the wrapped policy (a CUDA-only inference package, not here)
                from fastgen_engine import RolloutEngine

                self.rollout = RolloutEngine(self.module, tensor_parallel_size=1)
                return self.rank

            def update_policy(self, tokens):
                logits = self.module(tokens.cuda())
                logits.float().mean().backward()
                self.optimizer.step()
                return {"loss": 0.0}
    ''',
    "rlkit/controller.py": '''
        from __future__ import annotations

        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


        @ray.remote
        def master_addr_port():
            return ray.util.get_node_ip_address(), "29500"


        class ResourcePool:
            def __init__(self, n_gpus_per_node: int, nnodes: int):
                self.n_gpus_per_node, self.nnodes = n_gpus_per_node, nnodes

            def placement_groups(self):
                bundles = [{"GPU": 1, "CPU": 1}] * self.n_gpus_per_node
                pgs = [placement_group(bundles, strategy="STRICT_PACK") for _ in range(self.nnodes)]
                ray.get([pg.ready() for pg in pgs])
                return pgs


        class WorkerGroup:
            def __init__(self, pool: ResourcePool, worker_cls, *args):
                world = pool.n_gpus_per_node * pool.nnodes
                addr, port = ray.get(master_addr_port.remote())
                self.workers = []
                for pg in pool.placement_groups():
                    for local_rank in range(pool.n_gpus_per_node):
                        env = {"RANK": str(len(self.workers)), "WORLD_SIZE": str(world), "MASTER_ADDR": addr,
                               "MASTER_PORT": port}
                        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=local_rank)
                        self.workers.append(worker_cls.options(runtime_env={"env_vars": env},
                                                               scheduling_strategy=strategy).remote(*args))

            def execute_all(self, method: str, *args):
                return ray.get([getattr(w, method).remote(*args) for w in self.workers])
    ''',
    "rlkit/main_grpo.py": '''
        from __future__ import annotations

        import argparse

        import ray
        import torch

        from rlkit.controller import ResourcePool, WorkerGroup
        from rlkit.workers.fsdp_worker import ActorWorker


        @ray.remote(num_cpus=1)
        class TaskRunner:
            def run(self, config):
                pool = ResourcePool(config.n_gpus_per_node, config.nnodes)
                actors = WorkerGroup(pool, ray.remote(num_gpus=1)(ActorWorker), config)
                ranks = actors.execute_all("init_model")
                assert len(ranks) == config.n_gpus_per_node * config.nnodes
                for step in range(config.steps):
                    actors.execute_all("update_policy", torch.zeros(4, 16, dtype=torch.long))


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--n-gpus-per-node", type=int, default=8)
            parser.add_argument("--nnodes", type=int, default=1)
            parser.add_argument("--depth", type=int, default=3)
            parser.add_argument("--allow-even", action="store_true")
            parser.add_argument("--steps", type=int, default=100)
            config = parser.parse_args()
            if not ray.is_initialized():
                ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})
            runner = TaskRunner.remote()
            ray.get(runner.run.remote(config))


        if __name__ == "__main__":
            main()
    ''',
    "scripts/run_grpo.sh": '''
        #!/usr/bin/env bash
        set -x
        python3 -m rlkit.main_grpo --n-gpus-per-node 8 --nnodes 1 "$@" 2>&1 | tee grpo.log
    ''',
}


def test_an_rl_job_wrapping_inside_ray_actors_gets_the_plan_torch_builds(cli, tmp_path, monkeypatch):
    # the plain `python -m` driver starts Ray, a placement group of the node's 8 GPUs and one actor per GPU told its
    # rank in its runtime_env; rank 0's actor wraps the policy: world 8 (from the actor's environment), not 1
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, RL_PROJECT)
    res = cli("scripts/run_grpo.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    plan = f["plan"]
    assert plan["api"] == "fsdp1" and plan["origin"] != "suggested" and plan["world_size"] == 8
    monkeypatch.syspath_prepend(str(tmp_path))
    from rlkit.models import Block, PolicyLM

    real = fsdp1_units(lambda: PolicyLM(depth=3), world_size=8, auto_wrap_policy=ModuleWrapPolicy({Block}),
                       use_orig_params=True)
    assert [(u["module"], u["numel"], u["shard_numel"]) for u in plan["units"] if u["numel"]] == \
        [(r["module"], r["numel"], r["shard_numel"]) for r in real]
    assert {u["param_dtype"] for u in plan["units"]} == {"bfloat16"}
    # handed the wrapped policy after the wrap, the rollout engine's package decides nothing of the plan
    assert any("fastgen_engine" in n and "not used by the model" in n for n in f["notes"]), f["notes"]
    assert "ray" not in sys.modules or not str(getattr(sys.modules["ray"], "__file__", "")).startswith("<fsdp-lint")


def test_a_failure_inside_the_actor_is_the_cause_named_at_its_line(cli, tmp_path):
    # the actor's own assertion fails on a node too: `ray.get` raises it in the driver; the line names the actor's
    # file and line, not the driver's `ray.get`
    write_tree(tmp_path, RL_PROJECT)
    res = cli("scripts/run_grpo.sh", "--no-cache", "--", "--depth", "4", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "depth must be odd for this recipe" in line and "fsdp_worker.py:" in line, line


def test_a_placement_group_larger_than_the_node_is_refused_in_one_line(cli, tmp_path):
    # a real cluster waits for ever for GPUs it does not have; the simulated node is --gpus-per-node GPUs
    write_tree(tmp_path, RL_PROJECT)
    res = cli("scripts/run_grpo.sh", "--no-cache", "--gpus-per-node", "4", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "asks for 8 GPUs" in line and "one node of 4" in line, line


def test_the_simulated_ray_api(monkeypatch):
    # what the frameworks rely on: errors at `ray.get`, the actor class's name and methods, actors' own environment,
    # the actors the replay does not run answering as the first did, and nothing left behind
    from fsdp_lint.replay.ray_node.modules import install

    before = {k: v for k, v in sys.modules.items() if k == "ray" or k.startswith("ray.")}
    monkeypatch.delenv("RANK", raising=False)
    uninstall = install(8)
    try:
        import ray
        from ray.actor import ActorHandle

        @ray.remote
        def fails():
            raise ValueError("bad shard")

        ref = fails.remote()            # the task ran; its error waits for `ray.get`
        try:
            ray.get(ref)
            raise AssertionError("ray.get did not raise")
        except ValueError as exc:
            assert "bad shard" in str(exc)

        class Counter:
            def __init__(self):
                self.rank = int(os.environ["RANK"])
                os.environ["SEEN"] = "yes"
                self.calls = 0

            def bump(self):
                self.calls += 1
                return (self.rank, self.calls, os.environ.get("SEEN"))

        remote_counter = ray.remote(num_gpus=1)(Counter)
        assert type(remote_counter).__name__ == "ActorClass(Counter)" and "bump" in dir(remote_counter)
        handles = [remote_counter.options(runtime_env={"env_vars": {"RANK": str(r)}}).remote() for r in range(3)]
        assert all(isinstance(h, ActorHandle) for h in handles)
        assert ray.get([h.bump.remote() for h in handles]) == [(0, 1, "yes")] * 3
        assert "SEEN" not in os.environ and "RANK" not in os.environ      # the driver's environment is its own
        assert ray.get(handles[0].bump.remote()) == (0, 2, "yes")
        try:
            remote_counter()
            raise AssertionError("an actor class was instantiated directly")
        except TypeError as exc:
            assert ".remote()" in str(exc)
        try:
            import ray.data  # noqa: F401
            raise AssertionError("ray.data imported")
        except ImportError as exc:
            assert "is not part of the Ray cluster fsdp-lint simulates" in str(exc)
    finally:
        uninstall()
    assert {k: v for k, v in sys.modules.items() if k == "ray" or k.startswith("ray.")} == before


def test_python_m_of_an_installed_training_package_is_its_module(cli, tmp_path, monkeypatch):
    # `python -m verl.trainer.main_ppo ...` with the framework pip-installed: the launched file is the installed
    # module's (a package built on torch); `python -m pip install ...` on the line before is no launch
    site = tmp_path / "site"
    write_tree(site, {
        "rltrainer/__init__.py": "",
        "rltrainer/main.py": RL_PROJECT["rlkit/main_grpo.py"].replace("rlkit", "rltrainer"),
        "rltrainer/controller.py": RL_PROJECT["rlkit/controller.py"],
        "rltrainer/models.py": RL_PROJECT["rlkit/models.py"],
        "rltrainer/workers/__init__.py": "",
        "rltrainer/workers/base.py": RL_PROJECT["rlkit/workers/base.py"],
        "rltrainer/workers/fsdp_worker.py": RL_PROJECT["rlkit/workers/fsdp_worker.py"].replace("rlkit", "rltrainer"),
        "rltrainer-0.3.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: rltrainer\nVersion: 0.3.0\n"
                                               "Requires-Dist: accelerate\nRequires-Dist: ray[default]\n",
        "rltrainer-0.3.0.dist-info/top_level.txt": "rltrainer\n",
    })
    project = tmp_path / "recipe"
    write_tree(project, {"run.sh": '''
        set -e
        python -m pip install -r requirements.txt
        python3 -m rltrainer.main --n-gpus-per-node 8 --depth 3
    '''})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    res = cli("run.sh", "--no-cache", "--format", "json", cwd=str(project))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["path"].endswith(os.path.join("rltrainer", "main.py"))
    assert f["plan"]["api"] == "fsdp1" and f["plan"]["world_size"] == 8


PPO_MODELS = '''
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ff = nn.Linear(width, width)


class Policy(nn.Module):
    def __init__(self, depth: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(64) for _ in range(depth))
        self.head = nn.Linear(64, 1000)


class ValueModel(nn.Module):
    def __init__(self, depth: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(64) for _ in range(depth))
        self.score = nn.Linear(64, 1)


def wrap(model):
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.cuda.current_device())


dist.init_process_group("nccl")
critic = wrap(ValueModel(6))                       # the critic first, as PPO trainers initialise it
critic_optim = torch.optim.AdamW(critic.parameters(), lr=1e-5)
ref = wrap(Policy(3).requires_grad_(False))        # the frozen reference policy
actor = wrap(Policy(3))                            # the policy, last
actor_optim = torch.optim.AdamW(actor.parameters(), lr=1e-6)
'''


def test_of_several_trained_models_the_plan_is_the_last_wrapped_and_the_others_are_named(cli, tmp_path):
    # a PPO job wraps its critic, its reference policy and its actor (verl's order): two are trained; the plan is
    # the actor's (the last wrapped one an optimizer trains -- the critic has more parameters), the others named
    (tmp_path / "ppo.py").write_text(PPO_MODELS)
    res = cli("ppo.py", "-n", "8", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["class"] == "Policy"
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    namespace: dict = {}
    exec(compile(PPO_MODELS.split("dist.init_process_group")[0], "ppo_models", "exec"), namespace)
    real = fsdp1_units(lambda: namespace["Policy"](3), world_size=8,
                       auto_wrap_policy=ModuleWrapPolicy({namespace["Block"]}))
    assert [(u["module"], u["numel"]) for u in f["plan"]["units"] if u["numel"]] == \
        [(r["module"], r["numel"]) for r in real]
    note = next(n for n in f["notes"] if "models" in n)
    assert "the setup wrapped 3 models" in note and "ValueModel at ppo.py:32" in note and "Policy at ppo.py:32" in note


def test_a_project_that_only_probes_for_ray_gets_no_ray_when_it_is_not_installed(cli, tmp_path):
    # Ray as an optional extra (`pip install lmkit[ray]`), probed for: a node set up as the README says has no Ray,
    # so the probe fails and the Ray-only code is never reached (it was reached, and skipped, with a simulated Ray)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "lmkit"\nversion = "0.1"\ndependencies = ["torch"]\n'
                                             '[project.optional-dependencies]\nray = ["ray>=2.22"]\n')
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n"
        "try:\n    import ray\n    RAY = True\nexcept ImportError:\n    RAY = False\n\n"
        "if RAY:\n    import ray.data\n    rows = ray.data.read_json('data/')\n\n"
        "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\nfully_shard(model)\n")
    res = cli("train.py", "-n", "2", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["replay"]["skipped_statements"] == [] and not any("ray" in n for n in f["notes"]), f


def test_the_simulated_ray_never_outlives_a_recording(tmp_path):
    # `with fsdp_lint.record(...)` keeps the modules the block imported; the simulated node's Ray is not one of them
    # (the caller's process, and every later lint in it, would find a Ray that is not installed)
    import fsdp_lint

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "rl"\nversion = "0.1"\ndependencies = ["ray>=2.40"]\n')
    (tmp_path / "driver.py").write_text("")
    before = {k for k in sys.modules if k == "ray" or k.startswith("ray.")}
    with fsdp_lint.record(world_size=2, path=str(tmp_path / "driver.py")):
        import ray

        assert ray.is_initialized() is False and ray.get(ray.put(3)) == 3     # the node's Ray, in the block
    after = {k for k in sys.modules if k == "ray" or k.startswith("ray.")}
    assert after == before


RAY_TRAIN = {
    "pyproject.toml": '[project]\nname = "ftkit"\nversion = "0.1"\ndependencies = ["torch>=2.6", "ray[train]>=2.40"]\n',
    "ftkit/__init__.py": "",
    "ftkit/model.py": RL_PROJECT["rlkit/models.py"],
    "train_ray.py": '''
        from __future__ import annotations

        import argparse
        import functools

        import ray.train
        import ray.train.torch
        import torch
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        from torch.distributed.fsdp import MixedPrecision
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        from ftkit.model import Block, PolicyLM


        def train_loop_per_worker(config):
            model = PolicyLM(depth=config["depth"])
            policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
            model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs={
                "auto_wrap_policy": policy,
                "mixed_precision": MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            })
            optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
            for step in range(config["steps"]):
                loss = model(torch.zeros(2, 16, dtype=torch.long, device=ray.train.torch.get_device())).float().mean()
                loss.backward()
                optimizer.step()
                ray.train.report({"loss": loss.item()})


        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--num-workers", type=int, default=8)
            parser.add_argument("--depth", type=int, default=3)
            args = parser.parse_args()
            trainer = TorchTrainer(train_loop_per_worker,
                                   train_loop_config={"depth": args.depth, "lr": 1e-4, "steps": 10},
                                   scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=True),
                                   run_config=RunConfig(name="ft"))
            result = trainer.fit()
    ''',
}


def test_a_ray_train_job_gets_the_plan_of_its_workers(cli, tmp_path, monkeypatch):
    # Ray Train: `TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=N, use_gpu=True)).fit()` runs the loop as
    # rank 0 of N workers; `prepare_model(parallel_strategy="fsdp", parallel_strategy_kwargs=...)` is torch's FSDP1
    # with those arguments (Ray Train's own code), the world the scaling config's
    from oracle import fsdp1_units
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    import torch

    write_tree(tmp_path, RAY_TRAIN)
    res = cli("train_ray.py", "--no-cache", "--format", "json", "--", "--num-workers", "4", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    assert plan["api"] == "fsdp1" and plan["world_size"] == 4 and plan["origin"] != "suggested"
    monkeypatch.syspath_prepend(str(tmp_path))
    from ftkit.model import Block, PolicyLM

    real = fsdp1_units(lambda: PolicyLM(depth=3), world_size=4, auto_wrap_policy=ModuleWrapPolicy({Block}),
                       mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    assert [(u["module"], u["numel"], u["shard_numel"]) for u in plan["units"] if u["numel"]] == \
        [(r["module"], r["numel"], r["shard_numel"]) for r in real]
    assert {u["param_dtype"] for u in plan["units"]} == {"bfloat16"}


def test_a_driver_that_starts_its_cluster_with_rays_command_line(cli, tmp_path, monkeypatch):
    # `subprocess.run(["ray", "start", "--head"])`, then `ray status` read for the node's GPUs, then the placement group
    # through `ray.util.placement_group(...)` (a function, as ray.util imports it over its submodule) and the worker
    # mode read off `ray.WORKER_MODE`: the node's Ray command and API answer; nothing is started
    from oracle import fsdp1_units
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    tree = dict(RL_PROJECT)
    tree["rlkit/controller.py"] = tree["rlkit/controller.py"].replace(
        "                pgs = [placement_group(bundles, strategy=\"STRICT_PACK\") for _ in range(self.nnodes)]",
        "                pgs = [ray.util.placement_group(bundles, strategy=\"STRICT_PACK\") for _ in range(self.nnodes)]")
    tree["rlkit/main_grpo.py"] = tree["rlkit/main_grpo.py"].replace('''            if not ray.is_initialized():
                ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})''', '''            import re
            import subprocess

            subprocess.run(["ray", "start", "--head", "--num-gpus", str(config.n_gpus_per_node)], check=True)
            status = subprocess.run(["ray", "status"], check=True, capture_output=True, text=True).stdout
            gpus = float(re.search(r"/([0-9.]+) GPU", status).group(1))
            assert gpus >= config.n_gpus_per_node * config.nnodes, f"the cluster has {gpus} GPUs"
            ray.init(address="auto")
            assert ray.get_runtime_context().worker.mode != ray.WORKER_MODE      # the driver''')
    write_tree(tmp_path, tree)
    res = cli("scripts/run_grpo.sh", "--no-cache", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = json.loads(res.out)["files"][0]["plan"]
    monkeypatch.syspath_prepend(str(tmp_path))
    from rlkit.models import Block, PolicyLM

    real = fsdp1_units(lambda: PolicyLM(depth=3), world_size=8, auto_wrap_policy=ModuleWrapPolicy({Block}),
                       use_orig_params=True)
    assert plan["world_size"] == 8 and [(u["module"], u["numel"]) for u in plan["units"] if u["numel"]] == \
        [(r["module"], r["numel"]) for r in real]
