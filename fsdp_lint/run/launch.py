"""Launching and cleaning up ranks: fsdp-lint starts ``--nproc`` processes for one file, hosts their
rendezvous, watches them against the deadline and kills every one of them (and what they started)
on every exit path."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any, List

from fsdp_lint.run.evidence import apply_evidence, run_summary
from fsdp_lint.run.failures import at_frame, describe_exception
from fsdp_lint.run.session import rank_main
from fsdp_lint.run.spec import PG_TIMEOUT_MARGIN_S, RunError, RunOptions, check_host_memory, display_path, spec_for, td


_GRACE_S = 8.0            # how long the other ranks get to report once one rank raised
_CPU_START_METHOD = "fork"


def _choose_device(opts: RunOptions, ranks: int) -> str:
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if opts.device == "cuda":
        if have < ranks:
            raise RunError(f"--device cuda needs {ranks} GPU{'s' if ranks != 1 else ''}, found {have}"
                           f" (use --nproc {have} or --device cpu)" if have else
                           "--device cuda: no CUDA GPU is available (use --device cpu)")
        return "cuda"
    if opts.device == "auto" and have >= ranks:
        return "cuda"
    return "cpu"


def confirm_spawn(runnable, settings, opts: RunOptions, t0: float) -> dict:
    ranks = opts.nproc
    device = _choose_device(opts, ranks)
    backend = "nccl" if device == "cuda" else "gloo"
    deadline = t0 + opts.timeout
    if device == "cpu":
        check_host_memory(runnable, ranks)
    files = []
    failed = []
    for res in runnable:
        spec = spec_for(res, settings, opts)
        try:
            if time.monotonic() >= deadline:
                raise RunError(f"no time left for this file within --run-timeout {opts.timeout:g} s")
            per_rank = launch_ranks(spec, ranks, backend, device, deadline, opts)
        except RunError as exc:
            failed.append(f"{display_path(res.path)}: {exc}" if len(runnable) > 1 else str(exc))
            for f in res.findings:
                f.confirmed, f.evidence = None, f"not run: {exc}"
            continue
        files.append(apply_evidence(res, per_rank, spec, ranks, opts))
    summary = run_summary(files, backend, device, ranks, opts, "spawn", t0)
    if failed:
        raise RunError("; ".join(failed), summary=summary)
    return summary


def launch_ranks(spec: dict, ranks: int, backend: str, device: str, deadline: float, opts: RunOptions) -> List[dict]:
    """Start `ranks` processes for one file, watch them, and return each rank's report."""
    import multiprocessing.connection as mpc

    import torch.distributed as dist
    import torch.multiprocessing as tmp

    method = os.environ.get("FSDP_LINT_START_METHOD") or ("spawn" if device == "cuda" else _CPU_START_METHOD)
    if method not in tmp.get_all_start_methods():
        method = "spawn"
    if method != "spawn":
        _preimport()
    ctx = tmp.get_context(method)
    procs: List[Any] = []
    conns: List[Any] = []
    store = None
    state = [{"phase": "starting", "order": 0, "result": None, "compare": None, "done": False, "crash": None,
              "closed": False} for _ in range(ranks)]
    try:
        for rank in range(ranks):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            # not daemonic: a rank may start processes of its own (a data loader's workers); it is
            # killed with its whole process group below, and by the kernel if fsdp-lint dies
            p = ctx.Process(target=_child_entry, name=f"fsdp-lint-rank{rank}", daemon=False,
                            args=(rank, ranks, spec, child_conn, backend, device, _wall_deadline(deadline),
                                  opts.debug, os.getpid()))
            p.start()
            child_conn.close()
            procs.append(p)
            conns.append(parent_conn)
        # the store is created after the fork (no thread in the parent at fork time) and lives here,
        # so a rank that dies does not take the rendezvous with it
        remaining = max(1.0, deadline - time.monotonic())
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=td(remaining + PG_TIMEOUT_MARGIN_S),
                              wait_for_workers=False)
        for c in conns:
            c.send(("go", store.port))
        first_error_at = None
        while True:
            for rank, p in enumerate(procs):
                st = state[rank]
                if not p.is_alive() and not st["done"] and not st["closed"]:
                    _drain(conns[rank], st)
                    st["closed"] = True
            if all(st["done"] or st["closed"] for st in state):
                break
            # a rank that ends without "done" crashed: nobody stops ranks before this loop ends
            crashed = [r for r, st in enumerate(state) if st["crash"] is not None
                       or (st["closed"] and not st["done"])]
            if crashed:
                raise _with_cause(RunError(_describe_crash(crashed[0], state[crashed[0]], procs[crashed[0]])),
                                  _crash_cause(state[crashed[0]], procs[crashed[0]]))
            results = [st["result"] for st in state]
            if any(r is not None and r.get("setup_error") for r in results):
                r = next(r for r in results if r is not None and r.get("setup_error"))
                raise _with_cause(RunError(r["setup_error"]), r.get("setup_cause"))
            erred = [r for r in results if r is not None and r.get("error")]
            if erred:
                if all(r is not None for r in results):
                    break               # every rank reported; nobody will compare
                first_error_at = first_error_at or time.monotonic()
                if time.monotonic() - first_error_at > _GRACE_S:
                    break               # the others are stuck behind the failed rank
            now = time.monotonic()
            if now >= deadline:
                late = [st for st in state if not st["done"] and not st["closed"]] or state
                raise _with_cause(RunError(describe_timeout(state, opts.timeout)),
                                  {"type": "timeout", "message": f"did not finish within {opts.timeout:g} s",
                                   "phase": late[0]["phase"], "frame": None})
            waitables = [c for c, st in zip(conns, state) if not st["closed"]]
            waitables += [p.sentinel for p, st in zip(procs, state) if not st["closed"]]
            for ready in mpc.wait(waitables, timeout=min(0.5, max(0.01, deadline - now))):
                for rank, c in enumerate(conns):
                    if c is ready:
                        _receive(c, state[rank])
    except KeyboardInterrupt:
        _terminate(procs)
        raise
    finally:
        _terminate(procs)
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()
        del store
    out = []
    for rank, st in enumerate(state):
        rep = dict(st["result"] or {"rank": rank, "error": None, "unfinished": True})
        rep["last_phase"] = st["phase"]
        if st["result"] is None:
            rep["unfinished"] = True
            rep["cause"] = _describe_crash(rank, st, procs[rank]) if rank < len(procs) else None
            rep["crash"] = _crash_cause(st, procs[rank]) if rank < len(procs) else None
        if st["compare"] is not None:
            rep["compare"] = st["compare"]
        out.append(rep)
    return out


def _wall_deadline(monotonic_deadline: float) -> float:
    return time.time() + (monotonic_deadline - time.monotonic())


def _preimport() -> None:
    """Import what every rank needs once, before forking (children inherit it)."""
    import torch.distributed.fsdp  # noqa: F401
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

    with contextlib.suppress(Exception):
        import torch._dynamo  # noqa: F401  (torch imports it lazily under function modes)

    import fsdp_lint.replay  # noqa: F401
    import fsdp_lint.entry.source  # noqa: F401


def _receive(conn, st: dict) -> None:
    try:
        while conn.poll():
            msg = conn.recv()
            _apply_message(msg, st)
    except (EOFError, OSError):
        st["closed"] = True
    except Exception:
        st["closed"] = True


def _drain(conn, st: dict) -> None:
    with contextlib.suppress(Exception):
        _receive(conn, st)


def _apply_message(msg, st: dict) -> None:
    kind = msg[0]
    if kind == "phase":
        st["phase"], st["order"] = msg[1], msg[2]
    elif kind == "result":
        st["result"] = msg[1]
    elif kind == "compare":
        st["compare"] = msg[1]
    elif kind == "done":
        st["done"] = True
    elif kind == "crash":
        st["crash"] = msg[1]


def _terminate(procs) -> None:
    """Kill every rank and whatever it started; reap them."""
    for p in procs:
        if p.pid is None:
            continue
        with contextlib.suppress(Exception):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            if p.is_alive():
                p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=10)


def _describe_crash(rank: int, st: dict, proc) -> str:
    crash = st["crash"]
    if crash:
        return (f"rank {rank} failed in phase '{crash.get('phase') or st['phase']}': {crash['type']}: "
                f"{crash['message']}{at_frame(crash)}")
    code = proc.exitcode
    how = f"was killed by signal {_signal_name(-code)}" if code is not None and code < 0 else f"exited with code {code}"
    return f"rank {rank} {how} during phase '{st['phase']}'; all ranks were stopped"


def _crash_cause(st: dict, proc) -> dict:
    """A dead rank's cause as data: the exception it reported (type, message, phase, frame), or how
    the process ended and in which phase."""
    crash = st["crash"]
    if crash:
        return {"type": crash["type"], "message": crash["message"], "phase": crash.get("phase") or st["phase"],
                "frame": crash.get("frame")}
    code = proc.exitcode
    how = f"killed by signal {_signal_name(-code)}" if code is not None and code < 0 else f"exited with code {code}"
    return {"type": "killed" if code is not None and code < 0 else "exited", "message": how, "phase": st["phase"],
            "frame": None}


def _with_cause(err: RunError, cause) -> RunError:
    err.cause = cause
    return err


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def describe_timeout(state: List[dict], timeout: float) -> str:
    late = [(r, st) for r, st in enumerate(state) if not st["done"] and not st["closed"]]
    if not late:
        late = [(r, st) for r, st in enumerate(state) if not st["done"]]
    least = min(st["order"] for _, st in late)
    culprits = [(r, st) for r, st in late if st["order"] == least]
    waiting = [(r, st) for r, st in late if st["order"] != least]
    names = ", ".join(str(r) for r, _ in culprits)
    msg = (f"rank{'s' if len(culprits) > 1 else ''} {names} did not finish within {timeout:g} s "
           f"(last phase: {culprits[0][1]['phase']})")
    if waiting:
        msg += "; waiting for it: " + ", ".join(f"rank {r} in {st['phase']}" for r, st in waiting)
    return msg + "; all ranks were stopped"


class _PipeReporter:
    def __init__(self, conn, rank: int):
        self.conn = conn
        self.rank = rank
        self.last_phase = "starting"

    def phase(self, name: str, order: int) -> None:
        self.last_phase = name
        self._send(("phase", name, order))

    def result(self, data: dict) -> None:
        self._send(("result", data))

    def compare(self, data: dict) -> None:
        self._send(("compare", data))

    def done(self) -> None:
        self._send(("done",))

    def crash(self, data: dict) -> None:
        self._send(("crash", data))

    def _send(self, msg) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(msg)


def _child_entry(rank, ranks, spec, conn, backend, device, wall_deadline, debug, parent_pid) -> None:
    """Body of a spawned/forked rank process."""
    with contextlib.suppress(Exception):
        os.setpgid(0, 0)
    _die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(3)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not debug:
        _silence_fds()
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
                       "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0", "NODE_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1"})
    rep = _PipeReporter(conn, rank)
    code = 0
    try:
        remaining = lambda: max(1.0, wall_deadline - time.time())  # noqa: E731
        if not conn.poll(remaining()):
            os._exit(4)
        msg = conn.recv()
        port = msg[1]
        os.environ["MASTER_PORT"] = str(port)
        import torch
        import torch.distributed as dist

        if device == "cuda":
            torch.cuda.set_device(rank)
        else:
            # a forked child inherits the parent's OpenMP pool in a broken state: once the parent has
            # run a parallel CPU op, the first parallel op in the child deadlocks (as in DataLoader
            # workers). One intra-op thread per rank avoids the pool and shares the cores fairly.
            torch.set_num_threads(1)
            from fsdp_lint.run.compat import cpu_streams

            cpu_streams()              # FSDP2's stream events on a CPU rank (torch 2.6 lacks them)
        if os.path.exists("/sys/class/net/lo"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # all ranks are on this host
        if dist.is_initialized():      # a process group the parent had (fork): not ours to use
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        rep.phase("init", 1)
        if backend == "fake":
            # --simulate: one process, rank 0 of the plan's world under the fake process group
            from fsdp_lint.run.simulated_rank import simulate_rank

            simulate_rank(spec, rep, remaining)
            rep.done()
            return
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=td(remaining() + PG_TIMEOUT_MARGIN_S))
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=ranks,
                                timeout=td(remaining() + PG_TIMEOUT_MARGIN_S))
        dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
        rank_main(spec, rank, ranks, dev, rep, store, "fsdp_lint/0", remaining)
        rep.done()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        rep.crash(describe_exception(exc, rep.last_phase))
        code = 1
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(code)


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _silence_fds() -> None:
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
