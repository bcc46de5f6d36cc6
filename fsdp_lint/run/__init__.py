"""`run`: confirm the static findings in a short real FSDP1/FSDP2 session (DESIGN §8).

``confirm(results, settings, opts)`` runs every linted file for real and marks each finding
``confirmed`` True/False (None: the run could not tell) with an ``evidence`` string:

* processes (``launch``): ``--nproc`` ranks started with ``torch.multiprocessing`` (fork on CPU, spawn
  for CUDA), rendezvous through a TCPStore that fsdp-lint itself hosts on a free loopback port (no
  port race); NCCL on GPUs, gloo on CPU. Under ``torchrun`` (``torchrun``: ``RANK``/``WORLD_SIZE``/
  ``MASTER_ADDR`` set) nothing is spawned: this process is one rank, rank 0 writes the report, the
  others return None;
* in every rank (``session``) the file's own setup code is replayed with the real FSDP APIs
  (``replay(real=True)``): model built for real with the same seed on every rank, freezing, dtype
  changes, wrap calls and optimizers as the file has them (the plan's units when the file has no wrap
  code; AdamW when it builds no optimizer); then ``--steps`` forward/backward/step iterations on
  synthetic inputs (``inputs``) that differ per rank;
* evidence (``evidence``): the exception torch raises and where (wrap, forward, backward, optimizer
  step); parameters that differ across ranks after the steps, tied weights that are no longer equal;
  optimizers holding tensors that are not the model's parameters after wrapping; all-gathers and
  reduce-scatters counted per step (``collectives``: a dispatch mode over the ``c10d`` ops) and peak
  memory per rank, beside the static estimate. An error or a divergence no rule predicted becomes a
  finding of its own (code ``RUN``).

Never hang, never leak: the whole run has one deadline (``--run-timeout``); every process group has a
timeout beyond it; a rank that is late is killed with all the others and named with its last phase;
children die with fsdp-lint (``PR_SET_PDEATHSIG``, own process groups killed on every exit path);
nothing is written to disk.
"""
from __future__ import annotations

import time
from typing import Optional

from fsdp_lint.run.launch import confirm_spawn
from fsdp_lint.run.spec import RunError, RunOptions, check_options, check_plan, parse_input_shape, under_torchrun
from fsdp_lint.run.torchrun import confirm_torchrun

__all__ = ["RunError", "RunOptions", "confirm", "parse_input_shape"]


def confirm(results, settings, opts: RunOptions) -> Optional[dict]:
    """Run every linted file for real and attach evidence to its findings.

    Returns the run summary (rank 0 / the launching process) or None (other torchrun ranks).
    Raises RunError when the run cannot be carried out."""
    t0 = time.monotonic()
    check_options(opts)
    runnable = [r for r in results if not r.skipped and r.plan is not None and r.tree is not None]
    for res in runnable:
        check_plan(res, settings)
    if under_torchrun():
        return confirm_torchrun(runnable, settings, opts, t0)
    from fsdp_lint.process.reaper import RunGuard  # issue 10: what the ranks start dies with the run, even on SIGKILL

    with RunGuard():
        return confirm_spawn(runnable, settings, opts, t0)
