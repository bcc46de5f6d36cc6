"""A framework's own checks of how it is launched: what they refuse, they refuse on a GPU node too.

``fabric.launch()`` with ``ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1)`` on a
node of 8 GPUs raises in Lightning's ``setup_environment`` ("... multiplied should equal the world
size (8)"); skipping it as a failure of the simulated node left the strategy without its mesh, and the
replay reported the consequence (``Accessing the device mesh before processes have initialized``) at the
next line. A failure raised by Lightning or accelerate code while the framework sets up its processes,
devices and mesh is the script's (or its launch's) error, unless it is about what the simulated node
lacks (the meta device, CUDA, the fake process group, storage)."""
from __future__ import annotations

import os

# the framework's methods that set up its processes, devices and mesh
_SETUP = frozenset({"launch", "setup_environment", "_setup_distributed", "_setup_device_mesh", "_init_deepspeed",
                    "_prepare_fsdp", "_init_process_group", "__init__"})
_FRAMEWORKS = (os.sep + "lightning" + os.sep, os.sep + "lightning_fabric" + os.sep,
               os.sep + "pytorch_lightning" + os.sep, os.sep + "accelerate" + os.sep)
_SIMULATION_WORDS = ("meta", "cuda", "fake", "storage", "nccl")
_FRAMEWORK_CLASSES = ("Fabric", "Strategy", "Accelerator", "Trainer", "Connector")


def raised_by_framework_launch(exc: BaseException) -> bool:
    """`exc` was raised inside Lightning or accelerate while one of their objects set up its processes,
    devices or mesh, and it is not about the simulated node."""
    if not isinstance(exc, Exception) or any(w in str(exc).lower() for w in _SIMULATION_WORDS):
        return False
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if not frames or not _in_framework(frames[-1].f_code.co_filename):
        return False        # raised by the project, torch or fsdp-lint's simulation
    for frame in frames:
        if not _in_framework(frame.f_code.co_filename) or frame.f_code.co_name not in _SETUP:
            continue
        owner = frame.f_locals.get("self")
        if owner is not None and any(c in type(owner).__name__ for c in _FRAMEWORK_CLASSES):
            return True
    return False


def _in_framework(path: str) -> bool:
    path = os.path.abspath(path)
    return ("site-packages" in path or "dist-packages" in path) and any(f in path for f in _FRAMEWORKS)
