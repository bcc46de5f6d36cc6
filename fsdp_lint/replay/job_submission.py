"""Launchers that submit the training function as a cluster job (submitit's ``executor.submit(fn, ...)``).

On a cluster the callable is pickled, sent to SLURM and run by every task of the job with the
job's environment (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ...). The simulated node is
such a cluster: ``AutoExecutor`` finds SLURM there, and a submission runs the callable in this
process as task 0 of a job of `world_size` tasks, with that environment and the job process's command
line (``submitit.core._submit FOLDER``) while it runs. Nothing is pickled or queued; the report notes
that the submitted job was linted."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Callable, Dict

from fsdp_lint.process.environ import environ_set

Patch = Callable[[Any, str, Any], None]


def slurm_env(world_size: int, gpus_per_node: int, nodes: Any = None) -> Dict[str, str]:
    """The environment SLURM gives task 0 of a job of `world_size` tasks (`nodes` of them, if the
    executor's parameters say so and they divide the world; else nodes of `gpus_per_node` tasks)."""
    if not (isinstance(nodes, int) and nodes > 0 and world_size % nodes == 0):
        per = max(1, min(gpus_per_node, world_size))
        nodes = -(-world_size // per)
    per_node = max(1, world_size // nodes)
    nodelist = "node0" if nodes == 1 else f"node[0-{nodes - 1}]"
    return {
        "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "fsdp-lint",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(world_size), "SLURM_NPROCS": str(world_size),
        "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_GPUS_ON_NODE": str(per_node), "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURMD_NODENAME": "node0",
    }


def _job_world(params: Dict[str, Any], rec) -> None:
    """The job's tasks (``nodes`` x ``tasks_per_node``) are the world when nothing else gave it (``python -m
    pkg.submit --nodes 4`` with no launcher): the replay starts again on that world, as for Lightning."""
    from fsdp_lint.replay.frameworks import current_options
    from fsdp_lint.replay.records import WorldSizeFromScript

    nodes, per_node = params.get("nodes"), params.get("ntasks_per_node", params.get("tasks_per_node"))
    if not (isinstance(nodes, int) and isinstance(per_node, int) and nodes > 0 and per_node > 0):
        return
    if getattr(current_options(), "script_world", False) and nodes * per_node != rec.world_size:
        raise WorldSizeFromScript(nodes * per_node, f"submitit job (nodes={nodes}, tasks_per_node={per_node})")


class SubmittedJob:
    """What ``executor.submit`` returns: the job that ran (its result, if it returned)."""

    job_id = "1"

    def __init__(self, result: Any = None):
        self._result = result

    def result(self) -> Any:
        return self._result

    def results(self) -> list:
        return [self._result]

    def done(self, force_check: bool = False) -> bool:
        return True

    def wait(self) -> None:
        return None

    def state(self) -> str:
        return "COMPLETED"

    def cancel(self, check: bool = True) -> None:
        return None

    @property
    def paths(self):
        return None


def _install_elastic_launch(rec, patch: Patch) -> None:
    """torch's programmatic torchrun (``elastic_launch(LaunchConfig(nproc_per_node=4, ...), entrypoint=main)(args)``):
    its workers run `entrypoint` with torchrun's environment; the replay runs it here as worker 0, the launch's
    workers the world where nothing else gave one (a binary entry point, a command line, is left to torch)."""
    import torch.distributed.launcher as launcher
    import torch.distributed.launcher.api as api

    from fsdp_lint.replay.frameworks import current_options
    from fsdp_lint.replay.records import WorldSizeFromScript

    real = api.elastic_launch

    class elastic_launch:       # noqa: N801 - torch's name
        def __init__(self, config, entrypoint, *more):
            self._config, self._entrypoint, self._real = config, entrypoint, real(config, entrypoint, *more)

        def __call__(self, *args):
            if not callable(self._entrypoint):
                return self._real(*args)
            per_node, nodes = int(self._config.nproc_per_node), int(self._config.max_nodes)
            world, shown = per_node * nodes, f"elastic_launch(LaunchConfig(nproc_per_node={per_node}, max_nodes={nodes}))"
            if getattr(current_options(), "script_world", False) and world != rec.world_size:
                raise WorldSizeFromScript(world, shown)
            notes = rec.__dict__.setdefault("framework_notes", [])
            text = f"the script starts its workers with {shown}: linted as worker 0 of {world}, run in this process"
            if text not in notes:
                notes.append(text)
            env = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": str(world),
                   "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                   "TORCHELASTIC_RUN_ID": str(self._config.run_id)}
            with environ_set(env):
                return {0: self._entrypoint(*args)}

    patch(api, "elastic_launch", elastic_launch)
    patch(launcher, "elastic_launch", elastic_launch)


def install(rec, patch: Patch) -> None:
    """Patch torch's elastic_launch, and submitit (when it is installed), so that a launched job runs here."""
    _install_elastic_launch(rec, patch)
    if importlib.util.find_spec("submitit") is None:
        return
    import submitit
    from submitit.core import core

    def run(executor, fn, args, kwargs):
        params = getattr(getattr(executor, "_executor", executor), "parameters", None) or {}
        _job_world(params, rec)
        env = slurm_env(rec.world_size, getattr(rec, "gpus_per_node", None) or 8, params.get("nodes"))
        notes = rec.__dict__.setdefault("framework_notes", [])
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        text = (f"the script submits `{name}` as a cluster job (submitit): linted as task 0 of that SLURM job "
                f"(SLURM_PROCID=0, SLURM_NTASKS={env['SLURM_NTASKS']}, {env['SLURM_JOB_NUM_NODES']} node(s)), "
                f"run in this process")
        if text not in notes:
            notes.append(text)
        # the job's process is `python -u -m submitit.core._submit FOLDER` (what `sys.argv[1]` is to a job
        # that reads its folder from there), with the folder in SUBMITIT_FOLDER
        folder = getattr(getattr(executor, "_executor", executor), "folder", None)
        argv = [os.path.join(os.path.dirname(core.__file__), "_submit.py"), str(folder)] if folder is not None \
            else list(sys.argv)
        saved = sys.argv
        sys.argv = argv
        try:
            with environ_set({**env, **({"SUBMITIT_FOLDER": str(folder)} if folder is not None else {})}):
                return SubmittedJob(fn(*args, **kwargs))
        finally:
            sys.argv = saved

    def submit(self, fn, *args, **kwargs):
        return run(self, fn, args, kwargs)

    def map_array(self, fn, *iterable):
        # a job array: each job is a training of its own; the first is the one linted
        first = next(zip(*iterable), None)
        return [run(self, fn, tuple(first or ()), {})]

    def submit_array(self, fns):
        return [run(self, fns[0], (), {})] if fns else []

    patch(core.Executor, "submit", submit)
    patch(core.Executor, "map_array", map_array)
    patch(core.Executor, "submit_array", submit_array)
    # the simulated node is a SLURM cluster node: `srun` is there, so AutoExecutor picks the slurm
    # executor and SlurmExecutor accepts the node (submitit's `affinity`: 2 with srun, -1 without)
    patch(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
