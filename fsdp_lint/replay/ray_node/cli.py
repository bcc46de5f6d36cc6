"""The simulated node's ``ray`` command: a driver that starts or checks its cluster with Ray's command line
(``subprocess.run("ray start --head ...")``, ``ray status``) finds it, as a node with Ray installed has it. It
starts nothing: ``start``/``stop`` succeed, ``status`` reports the node -- one node with the node's GPUs, the
cluster the replay's own Ray simulates (`fsdp_lint.replay.ray_node`). A folder first on ``PATH`` holds it for the
replay (the sandbox restores ``os.environ``), removed afterwards."""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from typing import Callable

_SCRIPT = r'''
import sys

GPUS = __GPUS__
args = sys.argv[1:]
if args[:1] == ["status"]:
    print("======== Autoscaler status ========")
    print("Node status\n" + "-" * 63 + "\nActive:\n 1 node_" + "0" * 55 + "1\nPending:\n (no pending nodes)")
    print("Recent failures:\n (no failures)\n\nResources\n" + "-" * 63 + "\nUsage:")
    print(f" 0.0/{max(8, 8 * GPUS)}.0 CPU\n 0.0/{GPUS}.0 GPU\n 0B/1.00TiB memory\n 0B/128.00GiB object_store_memory")
    print("\nDemands:\n (no resource demands)")
elif args[:1] == ["start"]:
    print("Ray runtime started.")
elif args[:1] in (["--version"], ["version"]):
    print("ray, version __VERSION__")
sys.exit(0)
'''


def install(node_gpus: int, version: str) -> Callable[[], None]:
    """Put the node's ``ray`` command first on ``PATH``; the returned function removes it."""
    folder = tempfile.mkdtemp(prefix="fsdp-lint-ray-")
    path = os.path.join(folder, "ray")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!{sys.executable} -SE\n" + _SCRIPT.replace("__GPUS__", str(int(node_gpus)))
                 .replace("__VERSION__", version))
    os.chmod(path, stat.S_IRWXU)
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    return lambda: shutil.rmtree(folder, ignore_errors=True)
