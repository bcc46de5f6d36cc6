"""Ray Train on the simulated node: ``TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=8,
use_gpu=True)).fit()`` runs the training function in the replay's process as rank 0 of `num_workers` workers, in the
environment Ray Train gives a worker (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` ...) with the process
group initialised for it, as Ray Train does before the function starts; ``ray.train.torch.prepare_model(model,
parallel_strategy="fsdp", parallel_strategy_kwargs=...)`` moves the model to the worker's GPU and wraps it with
torch's ``FullyShardedDataParallel(model, **parallel_strategy_kwargs)`` (``DistributedDataParallel`` for ``"ddp"``)
where the world is larger than one, as Ray Train's own code does. ``report``, checkpoints and data shards do nothing here."""
from __future__ import annotations

import inspect
import os
from typing import Any, Dict, Optional


class ScalingConfig:
    def __init__(self, num_workers: Optional[int] = None, use_gpu: bool = False, resources_per_worker=None,
                 placement_strategy: str = "PACK", trainer_resources=None, **_):
        self.num_workers = int(num_workers) if num_workers else 1
        self.use_gpu, self.resources_per_worker = bool(use_gpu), resources_per_worker or {}
        self.placement_strategy, self.trainer_resources = placement_strategy, trainer_resources


class _Config:
    """``RunConfig``, ``CheckpointConfig``, ``FailureConfig``, ``TorchConfig``, ``DataConfig``: what they are given."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)


RunConfig = type("RunConfig", (_Config,), {})
CheckpointConfig = type("CheckpointConfig", (_Config,), {})
FailureConfig = type("FailureConfig", (_Config,), {})
TorchConfig = type("TorchConfig", (_Config,), {})
DataConfig = type("DataConfig", (_Config,), {})


class Checkpoint:
    def __init__(self, path: str = "", filesystem=None):
        self.path = path

    @classmethod
    def from_directory(cls, path: str) -> "Checkpoint":
        return cls(path)

    def to_directory(self, path: Optional[str] = None) -> str:
        return path or self.path

    def as_directory(self):
        import contextlib

        return contextlib.nullcontext(self.path)


class Result:
    def __init__(self, metrics: Dict[str, Any]):
        self.metrics, self.checkpoint, self.error, self.path = metrics, None, None, ""


class _Context:
    """``ray.train.get_context()`` (and ``ray.air.session``): the worker's place in the world."""

    def get_world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    def get_world_rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def get_local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def get_local_world_size(self) -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def get_node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", "0"))

    def get_trial_name(self) -> str:
        return "fsdp-lint"

    get_experiment_name = get_trial_name

    def get_storage(self):
        return None


_CONTEXT = _Context()


def get_context() -> _Context:
    return _CONTEXT


def report(metrics: Optional[Dict[str, Any]] = None, checkpoint=None, **_) -> None:
    return None


def get_checkpoint():
    return None


def get_dataset_shard(name: Optional[str] = None):
    return None


class TorchTrainer:
    def __init__(self, train_loop_per_worker, *, train_loop_config=None, torch_config=None, scaling_config=None,
                 run_config=None, datasets=None, resume_from_checkpoint=None, **_):
        self.train_loop_per_worker, self.train_loop_config = train_loop_per_worker, train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.torch_config = torch_config

    def fit(self) -> Result:
        import torch.distributed as dist

        from fsdp_lint.replay.ray_node.cluster import _cluster

        from fsdp_lint.replay.frameworks import current_options
        from fsdp_lint.replay.records import WorldSizeFromScript

        world = self.scaling_config.num_workers
        if current_options().script_world and str(world) != os.environ.get("WORLD_SIZE"):
            # nothing gave the world size: Ray Train starts `num_workers` workers itself (as Lightning's devices=)
            raise WorldSizeFromScript(world, f"TorchTrainer(scaling_config=ScalingConfig(num_workers={world}))")
        per_node = max(1, min(world, int(_cluster().node_gpus))) if self.scaling_config.use_gpu else world
        worker = {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(per_node),
                  "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
        driver = dict(os.environ)
        os.environ.update(worker)
        try:
            if not dist.is_initialized():
                backend = getattr(self.torch_config, "backend", None) or \
                    ("nccl" if self.scaling_config.use_gpu else "gloo")
                dist.init_process_group(backend=backend, world_size=world, rank=0)
            takes = len(inspect.signature(self.train_loop_per_worker).parameters) > 0
            if takes:
                self.train_loop_per_worker(self.train_loop_config or {})
            else:
                self.train_loop_per_worker()
        finally:
            os.environ.clear()
            os.environ.update(driver)
        return Result({})


def get_device():
    import torch

    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def get_devices():
    return [get_device()]


def prepare_model(model, move_to_device=True, parallel_strategy: Optional[str] = "ddp",
                  parallel_strategy_kwargs: Optional[Dict[str, Any]] = None):
    """As Ray Train's: the model on the worker's device, wrapped with torch's DDP or FSDP where the world is larger
    than one (torch's classes looked up now: the replay records the wrap)."""
    import torch

    kwargs = dict(parallel_strategy_kwargs or {})
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if move_to_device:
        model = model.to(device)
    if parallel_strategy and _CONTEXT.get_world_size() > 1:
        if parallel_strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, **{"device_ids": [device], "output_device": device, **kwargs})
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, **kwargs)
    return model


def prepare_data_loader(data_loader, add_dist_sampler: bool = True, move_to_device: bool = True, **_):
    return data_loader


def prepare_optimizer(optimizer):
    return optimizer


def backward(tensor):
    tensor.backward()


def enable_reproducibility(seed: int = 0) -> None:
    return None


def accelerate(amp: bool = False) -> None:
    return None


def namespaces() -> Dict[str, Dict[str, Any]]:
    """The ``ray.train``, ``ray.train.torch`` and ``ray.air`` modules' names."""
    train = {"ScalingConfig": ScalingConfig, "RunConfig": RunConfig, "CheckpointConfig": CheckpointConfig,
             "FailureConfig": FailureConfig, "DataConfig": DataConfig, "Checkpoint": Checkpoint, "Result": Result,
             "report": report, "get_context": get_context, "get_checkpoint": get_checkpoint,
             "get_dataset_shard": get_dataset_shard}
    torch_names = {"TorchTrainer": TorchTrainer, "TorchConfig": TorchConfig, "prepare_model": prepare_model,
                   "prepare_data_loader": prepare_data_loader, "prepare_optimizer": prepare_optimizer,
                   "get_device": get_device, "get_devices": get_devices, "backward": backward,
                   "enable_reproducibility": enable_reproducibility, "accelerate": accelerate}
    session = {"report": report, "get_checkpoint": get_checkpoint, "get_dataset_shard": get_dataset_shard,
               "get_world_size": _CONTEXT.get_world_size, "get_world_rank": _CONTEXT.get_world_rank,
               "get_local_rank": _CONTEXT.get_local_rank, "get_local_world_size": _CONTEXT.get_local_world_size,
               "get_node_rank": _CONTEXT.get_node_rank}
    air = {k: train[k] for k in ("ScalingConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "Checkpoint",
                                 "Result")}
    return {"ray.train": train, "ray.train.torch": torch_names, "ray.air": air, "ray.air.session": session,
            "ray.air.config": dict(air)}
