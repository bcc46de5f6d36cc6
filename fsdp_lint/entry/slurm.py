"""A SLURM batch script's world: ``#SBATCH --nodes=4 --ntasks-per-node=8`` and ``srun [options] python
train.py``. srun starts one task per rank (the script reads ``SLURM_NTASKS``/``SLURM_PROCID``): the world is
srun's ``--ntasks``/``-n``, else ``--nodes`` x ``--ntasks-per-node``, its own options over the batch script's.
A ``srun ... torchrun`` line keeps torchrun's world (one torchrun per node, its ``--nproc_per_node`` each)."""
from __future__ import annotations

import re
import shlex
from typing import Dict, List, Optional

_DIRECTIVE = re.compile(r"^#SBATCH\s+(.*)$")
_KEYS = {"--nodes": "nodes", "-N": "nodes", "--ntasks-per-node": "ntasks_per_node", "--ntasks": "ntasks", "-n": "ntasks",
         "--gpus-per-node": "gpus_per_node", "--gres": "gpus_per_node"}
# what a node's shell counts its GPUs with from the variable SLURM sets (`GPUS_PER_NODE=$(echo
# "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | wc -l)`): the job's GPUs of the node (`--gres=gpu:8`)
VISIBLE_GPU_COUNT = re.compile(r"""\$\(\s*echo\s+"?\$\{?CUDA_VISIBLE_DEVICES\}?"?\s*\|\s*tr\s+(['"]),\1\s+(['"])\\n\2"""
                               r"""\s*\|\s*wc\s+-l\s*\)""")


def options(words: List[str]) -> Dict[str, int]:
    """The task counts among srun/sbatch option words (``--nodes=4``, ``-N 4``, ``--ntasks-per-node 8``)."""
    out: Dict[str, int] = {}
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name in _KEYS:
            if not eq and i + 1 < len(words):
                value, i = words[i + 1], i + 1
            if name == "--gres":        # `--gres=gpu:8`, `--gres=gpu:a100:8`
                value = value.split(":")[-1] if (value or "").startswith("gpu:") else ""
            count = re.match(r"\d+", value or "")
            if count:
                out[_KEYS[name]] = int(count.group(0))
        i += 1
    return out


def batch_directives(text: str) -> Dict[str, int]:
    """The ``#SBATCH`` task counts of a batch script."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        m = _DIRECTIVE.match(line.strip())
        if m:
            try:
                out.update(options(shlex.split(m.group(1), comments=True)))
            except ValueError:
                continue
    return out


def batch_environment(batch: Dict[str, int]) -> Dict[str, str]:
    """What SLURM sets in the batch script's own shell (``NUM_NODES=${SLURM_NNODES}`` above the srun line):
    the job's nodes and tasks, its first task's rank."""
    if not batch:
        return {}
    nodes = batch.get("nodes", 1)
    out = {"SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_PROCID": "0", "SLURM_NODEID": "0",
           "SLURM_LOCALID": "0"}
    counts = world([], batch)
    if counts is not None:
        out.update(SLURM_NTASKS=str(counts["world"]), SLURM_NPROCS=str(counts["world"]),
                   SLURM_NTASKS_PER_NODE=str(counts["per_node"]))
    if "gpus_per_node" in batch:
        out["SLURM_GPUS_ON_NODE"] = str(batch["gpus_per_node"])
    return out


def world(srun_words: List[str], batch: Dict[str, int]) -> Optional[Dict[str, int]]:
    """{"world", "nodes", "per_node"} of ``srun OPTIONS`` under the batch script's directives, or None when
    neither gives a count."""
    given = dict(batch, **options(srun_words))
    nodes = given.get("nodes", 1)
    if "ntasks" in given:
        total = given["ntasks"]
        per_node = max(1, total // max(1, nodes))
    elif "ntasks_per_node" in given:
        per_node = given["ntasks_per_node"]
        total = per_node * nodes
    else:
        return None
    return {"world": total, "nodes": nodes, "per_node": per_node}


def environment(counts: Dict[str, int]) -> Dict[str, str]:
    """What srun sets for rank 0's task."""
    return {"SLURM_NTASKS": str(counts["world"]), "SLURM_NPROCS": str(counts["world"]),
            "SLURM_NNODES": str(counts["nodes"]), "SLURM_JOB_NUM_NODES": str(counts["nodes"]),
            "SLURM_NTASKS_PER_NODE": str(counts["per_node"]), "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0"}
