"""Run a function in N CPU processes with the gloo backend, for tests that need real collectives.

``run_ranks(fn, *args, world_size=2, timeout=60)`` starts ``world_size`` processes (torch.multiprocessing),
initialises a gloo process group on a free loopback port in each, calls ``fn(rank, world_size, *args)``
and returns the list of the ranks' return values (rank order). The return values travel through
``torch.save``/``torch.load`` files, so tensors and plain data are fine.

Guarantees: no hang (one overall ``timeout``, and the process group's own collective timeout), no
orphan (every child is terminated, then killed, before ``run_ranks`` returns or raises), and a child's
exception comes back as ``RankError`` with that child's traceback. When one rank fails, the others
(usually blocked in a collective) are stopped at once instead of waiting for the timeout.

The default start method is ``fork``: the children inherit the already imported torch, which makes a
2-process run take a fraction of a second instead of a fresh ``import torch`` per child. ``fn`` must
be a module-level function when ``start_method="spawn"``.
"""
from __future__ import annotations

import datetime
import errno
import os
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankError", "free_port", "warm_up"]


class RankError(RuntimeError):
    """A rank raised, died, or the run timed out."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm_up() -> None:
    """Import what FSDP imports lazily at its first wrap (torch._dynamo: seconds), in the parent,
    so that forked children do not each pay for it."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401


def _child(rank: int, world_size: int, port: int, out_dir: str, collective_timeout: float,
           fn: Callable, args: tuple) -> None:
    result_path = os.path.join(out_dir, f"rank{rank}.pt")
    error_path = os.path.join(out_dir, f"rank{rank}.err")
    try:
        if os.path.exists("/sys/class/net/lo"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout))
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        tmp = result_path + ".tmp"
        torch.save(result, tmp)
        os.replace(tmp, result_path)
    except BaseException:  # noqa: BLE001 - report everything to the parent
        with open(error_path, "w") as fh:
            fh.write(traceback.format_exc())
        raise SystemExit(1)


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2.0)


def _address_in_use(text: str) -> bool:
    return "Address already in use" in text or f"errno: {errno.EADDRINUSE}" in text or "EADDRINUSE" in text


def run_ranks(fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 60.0,
              start_method: str = "fork", attempts: int = 2) -> List[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each in its own process
    in one gloo process group. Raises RankError (with the failing rank's traceback) if a rank raises or
    dies, or if the whole run takes longer than ``timeout`` seconds."""
    if start_method == "fork":
        warm_up()
    ctx = mp.get_context(start_method)
    last_error = None
    for _ in range(max(1, attempts)):
        with tempfile.TemporaryDirectory(prefix="fsdp_lint_gloo_") as out_dir:
            port = free_port()
            procs = [ctx.Process(target=_child, args=(r, world_size, port, out_dir, timeout, fn, args), daemon=True)
                     for r in range(world_size)]
            try:
                for p in procs:
                    p.start()
                failed = _wait(procs, out_dir, timeout)
            finally:
                _stop(procs)
            if failed is None:
                return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                        for r in range(world_size)]
            last_error = failed
            if not _address_in_use(failed):
                break
    raise RankError(last_error)


def _wait(procs, out_dir: str, timeout: float):
    """None when every rank finished cleanly, else a description of what went wrong."""
    deadline = time.monotonic() + timeout
    while True:
        errors = []
        for r, p in enumerate(procs):
            err = os.path.join(out_dir, f"rank{r}.err")
            if os.path.exists(err):
                # give the error file a moment to be complete
                p.join(1.0)
                with open(err) as fh:
                    errors.append(f"rank {r} raised:\n{fh.read()}")
            elif p.exitcode is not None and p.exitcode != 0:
                errors.append(f"rank {r} died with exit code {p.exitcode}")
        if errors:
            return "\n".join(errors)
        if all(p.exitcode == 0 for p in procs):
            missing = [r for r in range(len(procs)) if not os.path.exists(os.path.join(out_dir, f"rank{r}.pt"))]
            return None if not missing else f"ranks {missing} exited without a result"
        if time.monotonic() > deadline:
            return f"timed out after {timeout:.0f} s (ranks still running: " \
                   f"{[r for r, p in enumerate(procs) if p.exitcode is None]})"
        time.sleep(0.02)
