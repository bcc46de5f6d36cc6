"""The simulated node's ``nvidia-smi`` on the replay's ``PATH``: what setup code reads from the tool answers as the
node's GPUs.

Setup code and libraries ask ``nvidia-smi`` instead of torch (it does not initialise CUDA): accelerate's
``get_gpu_info`` (``--query-gpu=count,name --format=csv,noheader``) and driver check, litgpt's NVLink
check (``nvidia-smi topo -m``), scripts reading the GPUs' memory (``--query-gpu=memory.total``) or their
list (``-L``). This machine has no such tool, so each of those failed with ``FileNotFoundError`` and
the statement was skipped -- or a branch for a node without GPUs was taken. For the replay a folder
first on ``PATH`` holds an executable ``nvidia-smi`` (`fsdp_lint.smi`) that answers from the `fsdp_lint.gpus`
profile (the same GPUs ``torch.cuda`` reports: one per rank); the folder and ``PATH`` go back afterwards.
An AMD profile has no ``nvidia-smi`` (as its node has none).
"""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from typing import Callable

from fsdp_lint import gpus
from fsdp_lint.smi import program


def install(profile: gpus.GpuProfile, count: int) -> Callable[[], None]:
    """Put the node's ``nvidia-smi`` first on ``PATH``; the returned function takes it away again (the
    sandbox restores ``os.environ`` itself)."""
    if profile.vendor != "nvidia":
        return lambda: None
    folder = tempfile.mkdtemp(prefix="fsdp-lint-node-")
    path = os.path.join(folder, "nvidia-smi")
    body = program(profile, count)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!{sys.executable} -SE\n{body}")
    os.chmod(path, stat.S_IRWXU)
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    return lambda: shutil.rmtree(folder, ignore_errors=True)
