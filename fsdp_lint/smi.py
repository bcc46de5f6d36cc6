"""The simulated node's ``nvidia-smi``: the program that answers as the node's GPUs do, from a `fsdp_lint.gpus`
profile -- run by the replay (`fsdp_lint.replay.smi` puts it first on ``PATH``) and by the launch-script
reader (``GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)``).

Setup code and libraries ask ``nvidia-smi`` instead of torch (it does not initialise CUDA): accelerate's
``get_gpu_info`` (``--query-gpu=count,name --format=csv,noheader``) and driver check, litgpt's NVLink
check (``nvidia-smi topo -m``), scripts reading the GPUs' memory (``--query-gpu=memory.total``) or their
list (``-L``). This machine has no such tool, so each of those failed with ``FileNotFoundError`` and
the statement was skipped -- or a branch for a node without GPUs was taken. For the replay a folder
first on ``PATH`` holds an executable ``nvidia-smi`` that answers from the `fsdp_lint.gpus` profile
(the same GPUs ``torch.cuda`` reports: one per rank); the folder and ``PATH`` go back afterwards.
An AMD profile has no ``nvidia-smi`` (as its node has none).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from fsdp_lint import gpus

MiB = 1 << 20
# the minimum Linux driver of the CUDA toolkit the profiles report (CUDA 12.8 release notes, table 3)
_DRIVERS = {"12.8": "570.26"}

_SCRIPT = r'''
import sys

NODE = __NODE__


def value(field, i):
    total = NODE["memory_mib"]
    known = {
        "index": str(i), "name": NODE["name"], "uuid": NODE["uuids"][i], "count": str(NODE["count"]),
        "driver_version": NODE["driver"], "compute_cap": NODE["compute_cap"],
        "memory.total": (total, "MiB"), "memory.free": (total, "MiB"), "memory.used": (0, "MiB"),
        "memory.reserved": (0, "MiB"), "utilization.gpu": (0, "%"), "utilization.memory": (0, "%"),
        "pci.bus_id": "00000000:%02X:00.0" % (0x18 + i), "persistence_mode": "Enabled",
        "mig.mode.current": "Disabled", "gpu_name": NODE["name"], "gpu_uuid": NODE["uuids"][i],
    }
    return known.get(field.strip().lower(), "[N/A]")


def query(fields, fmt, ids):
    units = "nounits" not in fmt
    out = []
    if "noheader" not in fmt:
        heads = []
        for f in fields:
            v = value(f, 0)
            heads.append(f"{f} [{v[1]}]" if isinstance(v, tuple) and units else f)
        out.append(", ".join(heads))
    for i in ids:
        row = []
        for f in fields:
            v = value(f, i)
            row.append((f"{v[0]} {v[1]}" if units else str(v[0])) if isinstance(v, tuple) else v)
        out.append(", ".join(row))
    return out


def topo():
    n = NODE["count"]
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity"
    rows = [head]
    for i in range(n):
        cells = [" X " if i == j else NODE["link"] for j in range(n)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + "\t0-%d\t0" % (NODE["cpus"] - 1))
    return rows


def summary():
    rows = [f"| NVIDIA-SMI {NODE['driver']}    Driver Version: {NODE['driver']}    CUDA Version: {NODE['cuda']} |"]
    for i in range(NODE["count"]):
        rows.append(f"|   {i}  {NODE['name']}  On  | 0MiB / {NODE['memory_mib']}MiB | 0% Default |")
    rows.append("| No running processes found |")
    return rows


def main(argv):
    opts = {}
    rest = []
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            opts[k] = v
        else:
            rest.append(a)
    ids = list(range(NODE["count"]))
    for flag in ("-i", "--id"):
        if flag in rest and rest.index(flag) + 1 < len(rest):
            ids = [int(x) for x in rest[rest.index(flag) + 1].split(",") if x.strip().isdigit()]
    if "id" in opts:
        ids = [int(x) for x in opts["id"].split(",") if x.strip().isdigit()]
    if "query-gpu" in opts:
        lines = query(opts["query-gpu"].split(","), opts.get("format", ""), ids)
    elif "query-compute-apps" in opts:
        lines = [] if "noheader" in opts.get("format", "") else [opts["query-compute-apps"].replace(",", ", ")]
    elif "-L" in rest or "--list-gpus" in rest:
        lines = [f"GPU {i}: {NODE['name']} (UUID: {NODE['uuids'][i]})" for i in ids]
    elif rest[:1] == ["topo"]:
        lines = topo()
    else:
        lines = summary()
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


sys.exit(main(sys.argv[1:]))
'''


def _links(profile: gpus.GpuProfile) -> str:
    """``topo -m``'s cell between two GPUs: NVLink (``NV<links>``: 12 on an A100, 18 on Hopper and
    Blackwell boards) where the board connects every pair, else through the host (``SYS``)."""
    if not profile.peer_access:
        return "SYS"
    major = profile.capability[0]
    return "NV18" if major >= 9 else "NV12" if major == 8 else "NV6"


def node_description(profile: gpus.GpuProfile, count: int) -> dict:
    return {"name": profile.device_name, "count": count, "memory_mib": profile.memory_bytes // MiB,
            "uuids": [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(count)],
            "driver": _DRIVERS.get(profile.toolkit_version, "570.26"), "cuda": profile.toolkit_version,
            "compute_cap": "%d.%d" % tuple(profile.capability), "link": _links(profile),
            "cpus": os.cpu_count() or 1}


def program(profile: gpus.GpuProfile, count: int) -> str:
    """The text of the node's ``nvidia-smi`` (a Python program) for `count` GPUs of `profile`."""
    return _SCRIPT.replace("__NODE__", json.dumps(node_description(profile, count)))


def answer(profile: gpus.GpuProfile, count: int, args: Sequence[str]) -> Optional[str]:
    """What ``nvidia-smi ARGS`` prints on the node (None: an AMD node has no such tool, or it failed)."""
    if profile.vendor != "nvidia":
        return None
    try:
        done = subprocess.run([sys.executable, "-SE", "-c", program(profile, count), *args], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None
