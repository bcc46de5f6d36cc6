"""Calls that start a training launch in another process: ``subprocess.run(["torchrun", ...])``,
``subprocess.call([sys.executable, "-m", "torch.distributed.run", ..., __file__])``, ``os.system("accelerate launch
...")``. A script run as plain ``python train.py`` that re-launches itself (or a worker module) under torchrun
builds its model in those processes: such a call matters for the plan as a wrap does (the replay follows the
launch it starts, `fsdp_lint.replay.subprocess_launches`), so it is never left out of the slice."""
from __future__ import annotations

import ast
from typing import Set

_PROCESS_CALLS = {"subprocess.run", "subprocess.call", "subprocess.Popen", "subprocess.check_call",
                  "subprocess.check_output", "os.system", "os.execv", "os.execvp", "os.execve", "os.execvpe",
                  "os.execl", "os.execlp", "run", "call", "Popen", "check_call", "check_output"}
_LAUNCHER_WORDS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "deepspeed")


def names_a_launcher(node: ast.AST) -> bool:
    """An expression holding a launcher's name (``["torchrun", "--nproc_per_node", n, path]``, an f-string)."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and any(w in n.value for w in _LAUNCHER_WORDS)
               for n in ast.walk(node))


def starts_a_launch(node: ast.Call, written: str, launcher_names: Set[str]) -> bool:
    """`node` (a call written `written`) runs a process whose command names a launcher, in its arguments or
    through a variable assigned one (`launcher_names`: ``cmd = ["torchrun", ...]``)."""
    if written not in _PROCESS_CALLS:
        return False
    args = list(node.args) + [k.value for k in node.keywords if k.arg in (None, "args")]
    return any(names_a_launcher(a) or any(isinstance(n, ast.Name) and n.id in launcher_names for n in ast.walk(a))
               for a in args)
