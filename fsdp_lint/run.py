"""`run`: confirm the static findings in a short real FSDP1/FSDP2 session (DESIGN §8).

``confirm(results, settings, opts)`` runs every linted file for real and marks each finding
``confirmed`` True/False (None: the run could not tell) with an ``evidence`` string:

* processes: ``--nproc`` ranks started with ``torch.multiprocessing`` (fork on CPU, spawn for CUDA),
  rendezvous through a TCPStore that fsdp-lint itself hosts on a free loopback port (no port race);
  NCCL on GPUs, gloo on CPU. Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set) nothing
  is spawned: this process is one rank, rank 0 writes the report, the others return None;
* in every rank the file's own setup code is replayed with the real FSDP APIs
  (``replay(real=True)``): model built for real with the same seed on every rank, freezing, dtype
  changes, wrap calls and optimizers as the file has them (the plan's units when the file has no wrap
  code; SGD when it builds no optimizer); then ``--steps`` forward/backward/step iterations on
  synthetic inputs that differ per rank;
* evidence: the exception torch raises and where (wrap, forward, backward, optimizer step);
  parameters that differ across ranks after the steps, tied weights that are no longer equal;
  optimizers holding tensors that are not the model's parameters after wrapping; all-gathers and
  reduce-scatters counted per step (a dispatch mode over the ``c10d`` ops) and peak memory per rank,
  beside the static estimate. An error or a divergence no rule predicted becomes a finding of its
  own (code ``RUN``).

Never hang, never leak: the whole run has one deadline (``--run-timeout``); every process group has a
timeout beyond it; a rank that is late is killed with all the others and named with its last phase;
children die with fsdp-lint (``PR_SET_PDEATHSIG``, own process groups killed on every exit path);
nothing is written to disk.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

RUN_CODE = "RUN"
RUN_NAME = "run-error"

# findings torch turns into an exception, and words its messages use
_EXCEPTION_CODES = ("FSD105", "FSD201", "FSD203", "FSD204", "FSD302", "FSD401")
_KEYWORDS = {
    "FSD105": re.compile(r"container|does not implement forward|not iterable|modulelist|moduledict|"
                         r"has no attribute 'forward'", re.I),
    "FSD201": re.compile(r"requires_grad", re.I),
    "FSD203": re.compile(r"dtype", re.I),
    "FSD204": re.compile(r"\bint\d*\b|integer|floating|dtype|requires_grad", re.I),
    "FSD302": re.compile(r"already been applied|only be applied|more than once|invariant", re.I),
    "FSD401": re.compile(r"shared|tied", re.I),
}
_DIVERGENCE_CODES = ("FSD301", "FSD502")
_COST_CODES = ("FSD101", "FSD102", "FSD103", "FSD104", "FSD202", "FSD601")

_GRACE_S = 8.0            # how long the other ranks get to report once one rank raised
_PG_TIMEOUT_MARGIN_S = 30.0
_CPU_START_METHOD = "fork"


@dataclass
class RunOptions:
    nproc: int = 2
    steps: int = 2
    device: str = "auto"                  # "auto" | "cpu" | "cuda"
    input_shape: Optional[str] = None     # "2,128"
    input_dtype: Optional[str] = None     # "float" | "long" | "bfloat16" | "half"
    timeout: float = 300.0                # seconds for the whole run
    debug: bool = False


class RunError(Exception):
    """The run could not be carried out (one line; exit code 2). `summary`: what the run did for
    the files it could run (the report still shows it)."""

    def __init__(self, message: str, summary: Optional[dict] = None):
        super().__init__(message)
        self.summary = summary


# ============================================================================================
# the entry point
# ============================================================================================
def confirm(results, settings, opts: RunOptions) -> Optional[dict]:
    """Run every linted file for real and attach evidence to its findings.

    Returns the run summary (rank 0 / the launching process) or None (other torchrun ranks).
    Raises RunError when the run cannot be carried out."""
    t0 = time.monotonic()
    _check_options(opts)
    runnable = [r for r in results if not r.skipped and r.plan is not None and r.tree is not None]
    for res in runnable:
        _check_plan(res, settings)
    if _under_torchrun():
        return _confirm_torchrun(runnable, settings, opts, t0)
    from fsdp_lint.reaper import RunGuard  # issue 10: what the ranks start dies with the run, even on SIGKILL

    with RunGuard():
        return _confirm_spawn(runnable, settings, opts, t0)


def _under_torchrun() -> bool:
    return all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _check_options(opts: RunOptions) -> None:
    if opts.steps < 1:
        raise RunError(f"--steps must be at least 1, got {opts.steps}")
    if not opts.timeout or opts.timeout <= 0:
        raise RunError(f"--run-timeout must be positive, got {opts.timeout:g}")
    if opts.nproc < 1:
        raise RunError(f"--nproc must be at least 1, got {opts.nproc}")
    parse_input_shape(opts.input_shape)


def parse_input_shape(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    if text is None:
        return None
    parts = [d.strip() for d in re.split(r"[,x]", text.strip())]
    dims = tuple(int(d) for d in parts) if all(d.isdigit() for d in parts) else ()
    if not dims or any(d < 1 for d in dims):
        raise RunError(f"--input-shape must be positive integers separated by commas (e.g. 2,128), got {text!r}")
    return dims


def _check_plan(res, settings) -> None:
    """The run applies the file's own wrap code; overrides of it cannot be run."""
    plan = res.plan
    name = os.path.basename(res.path)
    if plan.origin == "file":
        if settings.wrap:
            raise RunError(f"{name}: --run applies the file's own wrap code; drop --wrap to run it")
        if settings.api and settings.api != _file_api(res):
            raise RunError(f"{name}: --run applies the file's own wrap code ({_file_api(res)}); drop --api {settings.api}")
        if settings.use_orig_params is not None and plan.api == "fsdp1":
            raise RunError(f"{name}: --run applies the file's own wrap code with its own use_orig_params; "
                           f"drop --{'' if settings.use_orig_params else 'no-'}use-orig-params")


def _file_api(res) -> Optional[str]:
    return res.plan.api


# ============================================================================================
# what every rank needs (plain data: it crosses process boundaries)
# ============================================================================================
def _spec_for(res, settings, opts: RunOptions, seed: int = 0) -> dict:
    plan, tree, layout = res.plan, res.tree, res.layout
    return {
        "path": os.path.abspath(res.path),
        "model": settings.model,
        "steps": opts.steps,
        "input_shape": parse_input_shape(opts.input_shape),
        "input_dtype": opts.input_dtype,
        "seed": seed,
        "params": list(tree.params),
        "tied": [p.all_fqns for p in tree.params.values() if p.aliases],
        "api": plan.api,
        "apply_plan": plan.origin in ("default", "cli"),
        "units": [list(u.modules) for u in plan.units],
        "use_orig_params": bool(plan.use_orig_params),
        "debug": opts.debug,
    }


def _static_costs(res) -> dict:
    lay = res.layout
    return {
        "world_size": lay.world_size,
        "all_gathers_per_step": lay.all_gathers_per_step,
        "reduce_scatters_per_step": lay.reduce_scatters_per_step,
        "all_reduces_per_step": sum(u.all_reduces_per_step for u in lay.units),
        "all_gather_bytes_per_step": sum(u.all_gather_bytes * u.all_gathers_per_step for u in lay.units),
        "reduce_scatter_bytes_per_step": sum(u.reduce_scatter_bytes * u.reduce_scatters_per_step for u in lay.units),
        "memory_per_rank_bytes": lay.memory.per_rank_bytes,
    }


def _model_bytes(res) -> int:
    return sum(p.numel * p.itemsize for p in res.tree.params.values())


def _check_host_memory(runnable, ranks_here: int) -> None:
    avail = _available_memory()
    if not avail:
        return
    for res in runnable:
        need = _model_bytes(res) * ranks_here * 2
        if need > avail * 0.8:
            name = os.path.basename(res.path)
            raise RunError(
                f"{name}: building the model for real takes about {_human_bytes(_model_bytes(res))} per rank "
                f"(x{ranks_here} ranks here) and this machine has {_human_bytes(avail)} available; --run is "
                f"for small configurations: pass --model {name}:Class(num_layers=2, ...) for a smaller variant")


def _available_memory() -> Optional[int]:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# ============================================================================================
# spawn mode: fsdp-lint starts the ranks
# ============================================================================================
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


def _confirm_spawn(runnable, settings, opts: RunOptions, t0: float) -> dict:
    ranks = opts.nproc
    device = _choose_device(opts, ranks)
    backend = "nccl" if device == "cuda" else "gloo"
    deadline = t0 + opts.timeout
    if device == "cpu":
        _check_host_memory(runnable, ranks)
    files = []
    failed = []
    for res in runnable:
        spec = _spec_for(res, settings, opts)
        try:
            if time.monotonic() >= deadline:
                raise RunError(f"no time left for this file within --run-timeout {opts.timeout:g} s")
            per_rank = _launch(spec, ranks, backend, device, deadline, opts)
        except RunError as exc:
            failed.append(f"{_display(res.path)}: {exc}" if len(runnable) > 1 else str(exc))
            for f in res.findings:
                f.confirmed, f.evidence = None, f"not run: {exc}"
            continue
        files.append(_apply_evidence(res, per_rank, spec, ranks, opts))
    summary = _summary(files, backend, device, ranks, opts, "spawn", t0)
    if failed:
        raise RunError("; ".join(failed), summary=summary)
    return summary


def _summary(files, backend, device, ranks, opts, mode, t0) -> dict:
    findings = [f for fs in files for f in fs.pop("_findings", [])]
    return {
        "backend": backend, "device": device, "ranks": ranks, "steps": opts.steps, "mode": mode,
        "wall_time_s": round(time.monotonic() - t0, 1),
        "confirmed": sum(1 for f in findings if f.confirmed is True),
        "not_confirmed": sum(1 for f in findings if f.confirmed is False),
        "undetermined": sum(1 for f in findings if f.confirmed is None),
        "files": files,
    }


def _launch(spec: dict, ranks: int, backend: str, device: str, deadline: float, opts: RunOptions) -> List[dict]:
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
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=_td(remaining + _PG_TIMEOUT_MARGIN_S),
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
                raise RunError(_describe_crash(crashed[0], state[crashed[0]], procs[crashed[0]]))
            results = [st["result"] for st in state]
            if any(r is not None and r.get("setup_error") for r in results):
                r = next(r for r in results if r is not None and r.get("setup_error"))
                raise RunError(r["setup_error"])
            erred = [r for r in results if r is not None and r.get("error")]
            if erred:
                if all(r is not None for r in results):
                    break               # every rank reported; nobody will compare
                first_error_at = first_error_at or time.monotonic()
                if time.monotonic() - first_error_at > _GRACE_S:
                    break               # the others are stuck behind the failed rank
            now = time.monotonic()
            if now >= deadline:
                raise RunError(_describe_timeout(state, opts.timeout))
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
        if st["compare"] is not None:
            rep["compare"] = st["compare"]
        out.append(rep)
    return out


def _td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=max(1.0, seconds))


def _wall_deadline(monotonic_deadline: float) -> float:
    return time.time() + (monotonic_deadline - time.monotonic())


def _preimport() -> None:
    """Import what every rank needs once, before forking (children inherit it)."""
    import torch.distributed.fsdp  # noqa: F401
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401

    with contextlib.suppress(Exception):
        import torch._dynamo  # noqa: F401  (torch imports it lazily under function modes)

    import fsdp_lint.replay  # noqa: F401
    import fsdp_lint.source  # noqa: F401


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
                f"{crash['message']}{_at(crash)}")
    code = proc.exitcode
    how = f"was killed by signal {_signal_name(-code)}" if code is not None and code < 0 else f"exited with code {code}"
    return f"rank {rank} {how} during phase '{st['phase']}'; all ranks were stopped"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def _describe_timeout(state: List[dict], timeout: float) -> str:
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


# ============================================================================================
# a rank
# ============================================================================================
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
        if os.path.exists("/sys/class/net/lo"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # all ranks are on this host
        if dist.is_initialized():      # a process group the parent had (fork): not ours to use
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        rep.phase("init", 1)
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=_td(remaining() + _PG_TIMEOUT_MARGIN_S))
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=ranks,
                                timeout=_td(remaining() + _PG_TIMEOUT_MARGIN_S))
        dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
        _rank_main(spec, rank, ranks, dev, rep, store, "fsdp_lint/0", remaining)
        rep.done()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        rep.crash(_describe_exception(exc, rep.last_phase))
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


class _Phases:
    def __init__(self, rep):
        self.rep = rep
        self.name = "starting"

    def __call__(self, name: str, order: int) -> None:
        self.name = name
        self.rep.phase(name, order)


def _rank_main(spec: dict, rank: int, ws: int, device, rep, store, prefix: str, remaining) -> None:
    """One rank's run: build and wrap for real, train a few steps, compare across ranks.

    Sends its report through `rep` (result, then compare); never raises for what the user's code
    does -- only for fsdp-lint's own failures."""
    import torch

    out: Dict[str, Any] = {"rank": rank, "error": None, "setup_error": None, "steps_done": 0,
                           "collectives": [], "notes": []}
    phase = _Phases(rep)
    with contextlib.suppress(Exception):
        import torch._dynamo

        torch._dynamo.config.disable = True      # compilation is not what --run checks
    model = optimizers = None
    try:
        with _user_code_io(spec["debug"]):
            model, optimizers, info, example_fn = _build(spec, ws, device, phase, out, remaining)
        if model is not None:
            out.update(info)
            with _user_code_io(spec["debug"]):
                _train(spec, rank, ws, device, model, optimizers, phase, out, example_fn)
    finally:
        rep.result(out)
    ok = out["error"] is None and out["setup_error"] is None and model is not None
    # everyone's status through the store: collectives only when every rank finished its steps
    store.set(f"{prefix}/status/{rank}", "ok" if ok else "error")
    keys = [f"{prefix}/status/{r}" for r in range(ws)]
    try:
        store.wait(keys, _td(remaining()))
        statuses = [store.get(k).decode() for k in keys]
    except Exception:
        return
    if not all(s == "ok" for s in statuses):
        return
    phase("compare", 10_000)
    with _user_code_io(spec["debug"]):
        rep.compare(_compare(spec, rank, ws, device, model, out))


@contextlib.contextmanager
def _user_code_io(debug: bool):
    import warnings

    if debug:
        yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _build(spec, ws, device, phase, out, remaining):
    """Replay the file's setup code with the real FSDP; returns (model, optimizers, info)."""
    import torch

    from fsdp_lint.replay import ModelTarget, ReplayError, replay
    from fsdp_lint.source import SourceError, read_source

    phase("build and wrap", 2)
    try:
        facts = read_source(spec["path"])
        target = ModelTarget.parse(spec["model"]) if spec["model"] else None
    except (SourceError, ReplayError) as exc:
        out["setup_error"] = str(exc)
        return None, None, {}, None
    torch.manual_seed(spec["seed"])
    try:
        result = replay(facts, ws, target=target, real=True, timeout=remaining(), device=device)
    except ReplayError as exc:
        cause = exc.__cause__
        if cause is None:
            out["setup_error"] = f"replaying the setup code for real failed: {exc}"
        else:
            out["error"] = _describe_exception(cause, _build_phase(cause))
        return None, None, {}, None
    except Exception as exc:  # noqa: BLE001 - torch raised while the file's code ran
        out["error"] = _describe_exception(exc, _build_phase(exc))
        return None, None, {}, None
    model = result.model
    info: Dict[str, Any] = {}
    if spec["apply_plan"] and not result.wrap_calls:
        try:
            model = _apply_plan(spec, model, ws, device)
        except Exception as exc:  # noqa: BLE001
            out["error"] = _describe_exception(exc, "wrap")
            return None, None, {}, None
        optimizer_calls = []
    else:
        optimizer_calls = [o for o in result.optimizers if getattr(o, "obj", None) is not None]
    if str(next((p.device for p in model.parameters()), device)) == "meta":
        out["setup_error"] = ("the model is still on the meta device after the setup code ran; "
                              "--run needs a file that materialises it (to_empty + init)")
        return None, None, {}, None
    model_params = list(model.parameters())
    ids = {id(p) for p in model_params}
    optimizers = []
    opt_info = []
    for call in optimizer_calls:
        held = [p for g in call.obj.param_groups for p in g["params"]]
        opt_info.append({"cls": call.cls, "path": call.pos.path, "line": call.pos.line, "held": len(held),
                         "held_of_model": sum(1 for p in held if id(p) in ids),
                         "model_params": len(model_params)})
        optimizers.append(call.obj)
    if not optimizers:
        trainable = [p for p in model_params if p.requires_grad]
        if trainable:
            optimizers = [torch.optim.SGD(trainable, lr=1e-2)]
        info["optimizer"] = "SGD(lr=1e-2) (the file builds none)" if trainable else None
    else:
        info["optimizer"] = ", ".join(f"{o['cls']} (line {o['line']})" for o in opt_info)
    info["optimizers"] = opt_info
    return model, optimizers, info, _find_example_inputs(getattr(result, "namespace", None), model)


def _build_phase(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if any(_in_fsdp(f.filename) for f in frames):
        return "wrap"
    return "setup code"


def _in_fsdp(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return "/torch/distributed/" in norm


def _apply_plan(spec, model, ws, device):
    """The file has no wrap code: apply the plan's units (children first, then the root)."""
    if spec["api"] == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        root = None
        for modules in spec["units"]:
            fqn = modules[0]
            if fqn == "":
                root = FSDP(model, device_id=device, use_orig_params=spec["use_orig_params"])
                continue
            parent_fqn, _, name = fqn.rpartition(".")
            parent = model.get_submodule(parent_fqn) if parent_fqn else model
            setattr(parent, name, FSDP(getattr(parent, name), device_id=device,
                                       use_orig_params=spec["use_orig_params"]))
        return root if root is not None else model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (ws,))
    for modules in spec["units"]:
        mods = [model.get_submodule(m) if m else model for m in modules]
        fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh)
    return model


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def _find_example_inputs(namespace, model):
    if isinstance(namespace, dict) and callable(namespace.get("example_inputs")):
        return namespace["example_inputs"]
    for cls in type(_inner(model)).__mro__:
        for attr in ("forward", "__init__"):
            fn = cls.__dict__.get(attr)
            glob = getattr(fn, "__globals__", None)
            if isinstance(glob, dict) and callable(glob.get("example_inputs")) \
                    and not glob.get("__name__", "").startswith(("torch", "fsdp_lint")):
                return glob["example_inputs"]
    return None


def _class_name(model) -> str:
    """The user's class name (FSDP2 swaps in a `FSDP<Name>` subclass)."""
    cls = type(_inner(model))
    for c in cls.__mro__:
        if not c.__module__.startswith("torch.distributed") and not (
                c.__name__.startswith("FSDP") and c.__module__ == cls.__module__ and c is cls and len(c.__bases__) > 1):
            return c.__name__
    return cls.__name__


def _inner(model):
    """The user's root module inside an FSDP1 wrapper."""
    seen = 0
    while hasattr(model, "_fsdp_wrapped_module") and seen < 8:
        model = model._fsdp_wrapped_module
        seen += 1
    return model


_DTYPES = {"float": "float32", "long": "int64", "bfloat16": "bfloat16", "half": "float16"}


def _make_inputs(spec, model, device, rank: int, step: int, example_fn):
    """(args, kwargs, description) for one step; raises _InputError when nothing fits."""
    import torch

    torch.manual_seed(10_007 * (rank + 1) + step)     # different data on every rank and step
    if example_fn is not None:
        value = example_fn()
        args, kwargs = _as_call(value)
        moved = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return [moved(a) for a in args], {k: moved(v) for k, v in kwargs.items()}, "example_inputs()"
    first = _first_layer(model, spec["params"])
    float_dtype = _float_dtype(first if first is not None and any(
        p.is_floating_point() for p in first.parameters(recurse=False)) else model)
    if spec["input_shape"]:
        shape = spec["input_shape"]
        dtype = getattr(torch, _DTYPES[spec["input_dtype"] or "float"])
        if not dtype.is_floating_point:
            emb = next((m for m in _inner(model).modules() if isinstance(m, torch.nn.Embedding)), None)
            high = emb.num_embeddings if emb is not None else 2
            t = torch.randint(0, high, shape, device=device, dtype=dtype)
        else:
            t = torch.randn(shape, device=device, dtype=dtype)
        return [t], {}, f"--input-shape {','.join(map(str, shape))} ({str(dtype).replace('torch.', '')})"
    nn = torch.nn
    if spec["input_dtype"] and first is not None and not isinstance(first, nn.Embedding):
        float_dtype = getattr(torch, _DTYPES[spec["input_dtype"]])
    b, s = 2, 16
    if isinstance(first, nn.Embedding):
        t = torch.randint(0, first.num_embeddings, (b, s), device=device)
        return [t], {}, f"token ids [{b}, {s}] < {first.num_embeddings} (first layer: Embedding)"
    if isinstance(first, nn.Linear):
        t = torch.randn(b, s, first.in_features, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {first.in_features}] (first layer: Linear)"
    if isinstance(first, nn.MultiheadAttention):
        t = torch.randn(b, s, first.embed_dim, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {first.embed_dim}] (first layer: MultiheadAttention)"
    norm_types = tuple(c for c in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if c is not None)
    if isinstance(first, norm_types) and first.normalized_shape:
        dims = tuple(first.normalized_shape)
        t = torch.randn(b, s, *dims, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {', '.join(map(str, dims))}] (first layer: {type(first).__name__})"
    for conv, spatial in ((nn.Conv1d, (64,)), (nn.Conv2d, (32, 32)), (nn.Conv3d, (16, 16, 16))):
        if isinstance(first, conv):
            t = torch.randn(b, first.in_channels, *spatial, device=device, dtype=float_dtype)
            return [t], {}, f"float [{b}, {first.in_channels}, {', '.join(map(str, spatial))}] (first layer: {conv.__name__})"
    what = type(first).__name__ if first is not None else "no layer with parameters"
    raise _InputError(
        f"cannot infer inputs for {_class_name(model)} (first layer: {what}); pass "
        f"--input-shape D0,D1,... (with --input-dtype long for token ids) or define example_inputs() "
        f"in the model file")


class _InputError(Exception):
    pass


def _as_call(value):
    if isinstance(value, dict):
        return [], dict(value)
    if isinstance(value, (tuple, list)):
        return list(value), {}
    return [value], {}


def _float_dtype(model):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _first_layer(model, params=()):
    """The first leaf module (no children) that holds parameters, in definition order: read from
    the static tree's parameter order (FSDP1 unregisters the parameters it flattens)."""
    for fqn in params:
        m = _resolve_module(model, fqn.rpartition(".")[0])
        if m is not None and not any(True for _ in m.children()):
            return m
    for m in _inner(model).modules():
        name = type(m).__name__
        if name.startswith("FullyShardedDataParallel") or list(m.children()):
            continue
        if any(True for _ in m.parameters(recurse=False)) or hasattr(m, "_fsdp_wrapped_module"):
            return m
        # FSDP1 replaced the registered parameters: still a layer of a known kind
        import torch.nn as nn

        if isinstance(m, (nn.Embedding, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm)):
            return m
    return None


# --------------------------------------------------------------------------------------------
# training steps
# --------------------------------------------------------------------------------------------
def _train(spec, rank, ws, device, model, optimizers, phase, out, example_fn) -> None:
    counter = _comm_counter()
    before = _local_fingerprints(model)
    _reset_peak(device)
    inferred = example_fn is None and not spec["input_shape"]
    for step in range(1, spec["steps"] + 1):
        base = 10 * step
        phase(f"inputs (step {step})", base + 1)
        try:
            args, kwargs, how = _make_inputs(spec, model, device, rank, step, example_fn)
        except _InputError as exc:
            out["setup_error"] = str(exc)
            return
        except Exception as exc:  # noqa: BLE001 - example_inputs() itself failed
            if example_fn is not None:
                out["setup_error"] = f"example_inputs() raised {type(exc).__name__}: {_one_line(str(exc))}"
                return
            raise
        out["inputs"] = how
        out["inputs_inferred"] = inferred
        if step == 1:
            bad = _signature_problem(model, args, kwargs)
            if bad:
                hint = ("define example_inputs() in the model file or pass --input-shape/--input-dtype"
                        if example_fn is None else "fix example_inputs()")
                out["setup_error"] = f"the model's forward() does not accept the synthetic inputs ({how}): {bad}; {hint}"
                return
        counter.reset()
        current = f"forward (step {step})"
        try:
            with counter:
                phase(current, base + 2)
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                output = model(*args, **kwargs)
                loss = _loss(output)
                current = f"backward (step {step})"
                phase(current, base + 3)
                if loss is not None and loss.requires_grad:
                    loss.backward()
                elif step == 1:
                    out["notes"].append("the loss does not require grad: no backward pass ran")
                current = f"optimizer step (step {step})"
                phase(current, base + 4)
                for opt in optimizers:
                    opt.step()
                _sync(device)
        except Exception as exc:  # noqa: BLE001 - what torch raised is the evidence
            out["error"] = _describe_exception(exc, current)
            out["collectives"].append(counter.snapshot())
            return
        out["collectives"].append(counter.snapshot())
        out["steps_done"] = step
    out["peak_memory"], out["memory_measure"] = _peak_memory(device)
    after = _local_fingerprints(model)
    # trainable parameters this rank holds a piece of (FSDP leaves some ranks an empty shard)
    trainable = [n for n, (fp, rg, numel) in before.items() if rg and numel]
    out["params_changed"] = sum(1 for n in trainable if n in after and after[n][0] != before[n][0])
    out["params_trainable"] = len(trainable)


def _signature_problem(model, args, kwargs) -> Optional[str]:
    import inspect

    fn = getattr(_inner(model), "forward", None)
    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def _loss(output):
    import torch

    if output is None:
        return None
    if hasattr(output, "logits") and isinstance(getattr(output, "logits"), torch.Tensor):
        output = output.logits
    elif isinstance(output, dict):
        output = output.get("loss", output.get("logits", next((v for v in output.values()
                                                                if isinstance(v, torch.Tensor)), None)))
    elif isinstance(output, (tuple, list)):
        output = next((v for v in output if isinstance(v, torch.Tensor)), None)
    if not isinstance(output, torch.Tensor):
        return None
    if not output.is_floating_point():
        return None
    return output.float().mean()


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _reset_peak(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device) -> Tuple[int, str]:
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "CUDA max_memory_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the rank process (CPU)"


def _local_fingerprints(model) -> Dict[str, Tuple[Tuple[float, float], bool, int]]:
    """Per parameter: (sum, sum of squares) of this rank's local piece, requires_grad, numel."""
    import torch

    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            t = t.detach()
            if t.numel() == 0:
                out[name] = ((0.0, 0.0), bool(p.requires_grad), 0)
                continue
            d = t.double()
            out[name] = ((float(d.sum()), float((d * d).sum())), bool(p.requires_grad), t.numel())
    return out


# --------------------------------------------------------------------------------------------
# collectives
# --------------------------------------------------------------------------------------------
def _comm_counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommCounter(TorchDispatchMode):
        """Counts c10d collectives issued while it is active; bytes are what one rank sends
        (all-gather: output - input; reduce-scatter: input - output; all-reduce: the tensor)."""

        def __init__(self):
            super().__init__()
            self.reset()

        def reset(self) -> None:
            self.data = {"all_gather": [0, 0], "reduce_scatter": [0, 0], "all_reduce": [0, 0], "other": [0, 0]}

        def snapshot(self) -> dict:
            return {k: {"count": v[0], "bytes": v[1]} for k, v in self.data.items()}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ns = getattr(func, "namespace", "")
            if ns in ("c10d", "_c10d_functional", "c10d_functional"):
                with contextlib.suppress(Exception):
                    self._record(func, args)
            return func(*args, **kwargs)

        def _record(self, func, args) -> None:
            name = func.__name__ if hasattr(func, "__name__") else str(func)
            name = str(func).split(".")[1] if "." in str(func) else name
            if name.startswith(("wait", "barrier", "monitored_barrier")):
                return
            functional = getattr(func, "namespace", "") != "c10d"
            if "gather" in name and "all" in name:
                kind = "all_gather"
            elif "reduce_scatter" in name:
                kind = "reduce_scatter"
            elif "allreduce" in name or "all_reduce" in name:
                kind = "all_reduce"
            else:
                kind = "other"
            if functional:
                inp = _nbytes(args[0]) if args else 0
                size = next((a for a in args[1:] if isinstance(a, int)), 1)
                out = inp * size if kind == "all_gather" else (inp // max(1, size) if kind == "reduce_scatter" else inp)
            else:
                out = _nbytes(args[0]) if args else 0
                inp = _nbytes(args[1]) if len(args) > 1 else out
            if kind == "all_gather":
                sent = out - inp
            elif kind == "reduce_scatter":
                sent = inp - out
            else:
                sent = out
            self.data[kind][0] += 1
            self.data[kind][1] += max(0, sent)

    return CommCounter()


def _nbytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


# --------------------------------------------------------------------------------------------
# comparing across ranks (every rank runs this, in the same order)
# --------------------------------------------------------------------------------------------
def _compare(spec, rank, ws, device, model, out) -> dict:
    import torch
    import torch.distributed as dist

    result: Dict[str, Any] = {"diverged": [], "tied": [], "compared": 0}
    fsdp1 = any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules())
    ctx = contextlib.nullcontext()
    if fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        ctx = FSDP.summon_full_params(model, writeback=False, recurse=True)
    comm_device = device if device.type == "cuda" else torch.device("cpu")
    with torch.no_grad(), ctx:
        full: Dict[str, Any] = {}
        for fqn in spec["params"]:
            t = _resolve(model, fqn)
            if t is None:
                continue
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            full[fqn] = t.detach()
        names = list(full)
        rows = []
        for fqn in names:
            d = full[fqn].double().flatten()
            n = d.numel()
            w = torch.arange(1, n + 1, dtype=torch.float64, device=d.device) if n else d
            rows.append(torch.stack([d.sum(), (d * d).sum(), (d * w).sum() / max(1, n)]) if n
                        else torch.zeros(3, dtype=torch.float64, device=d.device))
        fps = torch.stack(rows).to(comm_device) if rows else torch.zeros((0, 3), dtype=torch.float64, device=comm_device)
        gathered = [torch.empty_like(fps) for _ in range(ws)]
        dist.all_gather(gathered, fps)
        differ = [i for i in range(len(names))
                  if any(not torch.equal(gathered[0][i], gathered[r][i]) for r in range(1, ws))]
        for i in differ:
            t = full[names[i]].double().to(comm_device)
            hi, lo = t.clone(), t.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            result["diverged"].append({"fqn": names[i], "max_diff": float((hi - lo).abs().max()) if t.numel() else 0.0})
        result["compared"] = len(names)
        for group in spec["tied"]:
            tensors = [(f, _resolve(model, f)) for f in group]
            tensors = [(f, t.full_tensor() if hasattr(t, "full_tensor") else t) for f, t in tensors if t is not None]
            if len(tensors) < 2:
                continue
            base_f, base = tensors[0]
            for f, t in tensors[1:]:
                same_object = t is base
                if tuple(t.shape) != tuple(base.shape):
                    diff = float("inf")
                else:
                    diff = float((t.double() - base.double()).abs().max()) if t.numel() else 0.0
                result["tied"].append({"fqns": [base_f, f], "max_diff": diff, "same_tensor": same_object})
    return result


_WRAPPER_ATTRS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def _unwrap(m):
    """Step through wrapper modules (FSDP1, activation checkpointing, torch.compile)."""
    for _ in range(8):
        for attr in _WRAPPER_ATTRS:
            inner = m._modules.get(attr) if hasattr(m, "_modules") else None
            if inner is not None:
                m = inner
                break
        else:
            return m
    return m


def _resolve_module(model, path: str):
    """The module an FQN of the unwrapped model names in the wrapped one (None if there is none)."""
    mod = _unwrap(model)
    try:
        for part in path.split(".") if path else ():
            mod = _unwrap(getattr(mod, part))
    except AttributeError:
        return None
    return mod


def _resolve(model, fqn: str):
    """The tensor a parameter FQN of the unwrapped model names in the wrapped one."""
    import torch

    path, _, name = fqn.rpartition(".")
    mod = _resolve_module(model, path)
    t = getattr(mod, name, None) if mod is not None else None
    return t if isinstance(t, torch.Tensor) else None


# --------------------------------------------------------------------------------------------
# exceptions
# --------------------------------------------------------------------------------------------
def _describe_exception(exc: BaseException, phase: str) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    # the frame that raised: the deepest one in the user's code or in torch.distributed (FSDP
    # itself), else the deepest that is not fsdp-lint's own or torch's dispatch plumbing
    shown = ([f for f in frames if not _is_library_file(f.filename) or _in_fsdp(f.filename)]
             or [f for f in frames if not _is_plumbing(f.filename)] or frames)
    last = shown[-1] if shown else None
    user = None
    for f in reversed(frames):
        if not _is_library_file(f.filename):
            user = f
            break
    return {
        "type": type(exc).__name__,
        "message": _one_line(str(exc)),
        "phase": phase,
        "frame": f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}" if last else None,
        "user_path": user.filename if user else None,
        "user_line": user.lineno if user else None,
        "in_fsdp": any(_in_fsdp(f.filename) for f in frames),
    }


def _is_plumbing(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return "/fsdp_lint/" in norm or norm.endswith(("/torch/_ops.py", "/torch/utils/_python_dispatch.py"))


def _is_library_file(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return filename.startswith("<") or any(s in norm for s in ("/site-packages/", "/dist-packages/", "/lib/python3",
                                                                "/fsdp_lint/"))


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _at(err: dict) -> str:
    return f" (at {err['frame']})" if err.get("frame") else ""


# ============================================================================================
# evidence: turning the ranks' reports into confirmed/evidence per finding
# ============================================================================================
def _apply_evidence(res, per_rank: List[dict], spec: dict, ranks: int, opts: RunOptions) -> dict:
    from fsdp_lint.rule import Finding

    plan = res.plan
    r0 = per_rank[0]
    errors = [r["error"] for r in per_rank if r.get("error")]
    err = errors[0] if errors else None
    err_rank = next((r["rank"] for r in per_rank if r.get("error")), None)
    steps_done = min((r.get("steps_done", 0) for r in per_rank), default=0)
    completed = err is None and steps_done == opts.steps and all(not r.get("unfinished") for r in per_rank)
    compare = r0.get("compare")
    static = _static_costs(res)
    measured = _measured_costs(per_rank)
    diverged = {d["fqn"]: d["max_diff"] for d in (compare or {}).get("diverged", [])}
    tied = [t for t in (compare or {}).get("tied", []) if t["max_diff"] != 0.0]
    run_findings: List[Finding] = []

    matched = _match_exception(res.findings, err, plan.api) if err else []
    for f in res.findings:
        f.confirmed, f.evidence = None, None
    for f in matched:
        f.confirmed = True
        f.evidence = f"torch raised {err['type']} in {err['phase']} on rank {err_rank}: {err['message']}{_at(err)}"

    stopped = (f"not reached: the run stopped in {err['phase']} with {err['type']}" if err else
               "not reached: the run did not complete its steps")
    explained: set = set()
    for f in res.findings:
        if f in matched:
            continue
        code = f.code
        if code in _DIVERGENCE_CODES or (code == "FSD401" and plan.api == "fsdp1"):
            if not completed or compare is None:
                f.evidence = stopped
                continue
            if ranks < 2 and code != "FSD401":
                f.evidence = "parameters cannot differ across ranks in a 1-rank run (use --nproc 2 or more)"
                continue
            if code == "FSD401":
                hits = _about_module(tied, f.module, lambda t: t["fqns"])
                if hits:
                    f.confirmed = True
                    f.evidence = (f"after {_steps(opts.steps)} tied weights are no longer equal: "
                                  + "; ".join(f"{t['fqns'][0]} vs {t['fqns'][1]} max |diff| {_num(t['max_diff'])}"
                                              for t in hits[:4]))
                    explained.update(x for t in hits for x in t["fqns"])
                else:
                    f.confirmed = False
                    f.evidence = f"after {_steps(opts.steps)} every tied group is still equal"
                continue
            pool = plan.leftover_params if code == "FSD301" else plan.ignored_params
            pool = _about_module(pool, f.module, lambda n: [n])
            hits = [(n, diverged[n]) for n in pool if n in diverged]
            if hits:
                f.confirmed = True
                f.evidence = (f"after {_steps(opts.steps)} {len(hits)} of {len(pool)} parameters differ across "
                              f"ranks: " + ", ".join(f"{n} (max |diff| {_num(d)})" for n, d in hits[:6])
                              + (", ..." if len(hits) > 6 else ""))
                explained.update(n for n, _ in hits)
            else:
                f.confirmed = False
                f.evidence = (f"after {_steps(opts.steps)} the {len(pool)} parameter{'s' if len(pool) != 1 else ''} "
                              f"{'outside every unit' if code == 'FSD301' else 'ignored by FSDP'} are identical on "
                              f"all ranks")
        elif code in _EXCEPTION_CODES:
            if err:
                f.evidence = stopped + " (see the finding it confirms)" if any(m is not f for m in matched) else stopped
            elif completed:
                f.confirmed = False
                f.evidence = (f"torch raised nothing: wrap, {opts.steps} forward/backward/optimizer "
                              f"step{'s' if opts.steps != 1 else ''} ran on {ranks} ranks")
            else:
                f.evidence = stopped
        elif code == "FSD501":
            infos = r0.get("optimizers") or []
            if not infos:
                f.evidence = stopped if err else "the run built no optimizer from the file"
                continue
            bad = [o for o in infos if o["held"] > o["held_of_model"]]
            changed = r0.get("params_changed")
            total = r0.get("params_trainable")
            tail = (f"; {changed} of the {total} trainable model parameters rank 0 holds changed in "
            f"{_steps(r0.get('steps_done', 0))}"
                    if changed is not None else "")
            if bad:
                f.confirmed = True
                f.evidence = "; ".join(
                    f"{o['cls']} (line {o['line']}) holds {o['held']} tensors, {o['held_of_model']} of them the "
                    f"model's parameters after wrapping (the model has {o['model_params']})" for o in bad) + tail
            else:
                f.confirmed = False
                f.evidence = "; ".join(f"{o['cls']} (line {o['line']}) holds only the model's parameters"
                                       for o in infos) + tail
        elif code in _COST_CODES:
            if not completed:
                f.evidence = stopped
                continue
            same, text = _cost_evidence(static, measured, ranks, per_rank)
            f.confirmed = same
            f.evidence = text
        else:
            f.evidence = f"--run has no check for {code}"

    # what no rule predicted: a gap in the rules, reported as a finding of its own
    if err and not matched:
        run_findings.append(_run_finding(res, err, err_rank, per_rank))
    if completed and compare is not None:
        unexplained = [(n, d) for n, d in diverged.items() if n not in explained
                       and not _predicted_divergence(res, n)]
        if unexplained:
            run_findings.append(Finding(
                code=RUN_CODE, name=RUN_NAME, severity="error", path=res.path, line=_first_wrap_line(res),
                message=(f"--run: after {_steps(opts.steps)} {len(unexplained)} parameter"
                         f"{'s' if len(unexplained) != 1 else ''} differ across ranks and no rule predicted it: "
                         + ", ".join(f"{n} (max |diff| {_num(d)})" for n, d in unexplained[:6])),
                confirmed=True, evidence="parameters compared after the steps (all-gathered fingerprints)"))
        bad_opts = [o for o in (r0.get("optimizers") or []) if o["held"] > o["held_of_model"]]
        if bad_opts and not any(f.code == "FSD501" for f in res.findings):
            o = bad_opts[0]
            run_findings.append(Finding(
                code=RUN_CODE, name=RUN_NAME, severity="error", path=o["path"] if o["path"] else res.path,
                line=o["line"] or 1,
                message=(f"--run: {o['cls']} holds {o['held']} tensors, only {o['held_of_model']} of them the "
                         f"model's parameters after wrapping, and no rule predicted it"),
                confirmed=True, evidence=f"{r0.get('params_changed')} of the {r0.get('params_trainable')} trainable "
                                         f"model parameters rank 0 holds changed in {_steps(opts.steps)}"))
    res.findings.extend(run_findings)

    file_summary = {
        "path": _display(res.path),
        "api": plan.api,
        "status": "completed" if completed else (f"raised in {err['phase']}" if err else "incomplete"),
        "steps_done": steps_done,
        "inputs": r0.get("inputs"),
        "optimizer": r0.get("optimizer"),
        "measured": measured,
        "static": {k: v for k, v in static.items()},
        "peak_memory_bytes": [r.get("peak_memory") for r in per_rank],
        "memory_measure": r0.get("memory_measure"),
        "error": ({**{k: err[k] for k in ("type", "message", "phase", "frame")}, "rank": err_rank} if err else None),
        "diverged": [{"fqn": n, "max_diff": d} for n, d in diverged.items()],
        "notes": r0.get("notes") or [],
        "_findings": list(res.findings),
    }
    return file_summary


def _about_module(items: list, module: str, fqns_of) -> list:
    """The items with a parameter under the finding's module (all of them when none is, or the
    finding is about the root)."""
    if not module:
        return list(items)
    mine = [x for x in items if any(n == module or n.startswith(module + ".") for n in fqns_of(x))]
    return mine or list(items)


def _predicted_divergence(res, fqn: str) -> bool:
    return fqn in res.plan.leftover_params or fqn in res.plan.ignored_params


def _first_wrap_line(res) -> int:
    lines = [u.line for u in res.plan.units if u.line]
    return min(lines) if lines else 1


def _run_finding(res, err: dict, rank, per_rank):
    from fsdp_lint.rule import Finding

    path, line = res.path, _first_wrap_line(res)
    if err.get("user_path") and os.path.isfile(err["user_path"]):
        path, line = err["user_path"], err["user_line"] or line
    hint = ""
    if per_rank[0].get("inputs_inferred") and err["phase"].startswith("forward"):
        hint = (f" (inputs were inferred: {per_rank[0].get('inputs')}; pass --input-shape/--input-dtype or define "
                f"example_inputs() if they do not fit the model)")
    return Finding(
        code=RUN_CODE, name=RUN_NAME, severity="error", path=path, line=line,
        message=(f"--run: torch raised {err['type']} in {err['phase']} on rank {rank} and no rule predicted it: "
                 f"{err['message']}{_at(err)}{hint}"),
        confirmed=True, evidence=f"{err['type']}: {err['message']}{_at(err)}")


def _match_exception(findings, err: dict, api: Optional[str]) -> list:
    cands = [f for f in findings if f.code in _EXCEPTION_CODES]
    if not cands:
        return []
    text = f"{err['type']}: {err['message']}"
    hits = [f for f in cands if _KEYWORDS[f.code].search(text)]
    if hits:
        named = [f for f in hits if f.module and re.search(rf"(?<![\w.]){re.escape(f.module)}(?![\w])", err["message"])]
        return named or hits
    codes = {f.code for f in cands}
    early = err["phase"] in ("wrap",) or err["phase"].startswith("forward (step 1)")
    if len(codes) == 1 and (err.get("in_fsdp") or early):
        return cands
    return []


def _measured_costs(per_rank: List[dict]) -> dict:
    r0 = per_rank[0]
    steps = r0.get("collectives") or []
    if not steps:
        return {}
    last = steps[-1]
    return {
        "all_gathers_per_step": last["all_gather"]["count"],
        "reduce_scatters_per_step": last["reduce_scatter"]["count"],
        "all_reduces_per_step": last["all_reduce"]["count"],
        "all_gather_bytes_per_step": last["all_gather"]["bytes"],
        "reduce_scatter_bytes_per_step": last["reduce_scatter"]["bytes"],
        "per_step": [{k: v["count"] for k, v in s.items()} for s in steps],
    }


def _cost_evidence(static: dict, measured: dict, ranks: int, per_rank) -> Tuple[bool, str]:
    if not measured:
        return False, "no step was measured"
    same_ws = static["world_size"] == ranks
    counts_equal = (measured["all_gathers_per_step"] == static["all_gathers_per_step"]
                    and measured["reduce_scatters_per_step"] == static["reduce_scatters_per_step"])
    bytes_equal = (measured["all_gather_bytes_per_step"] == static["all_gather_bytes_per_step"]
                   and measured["reduce_scatter_bytes_per_step"] == static["reduce_scatter_bytes_per_step"])
    peaks = [r.get("peak_memory") for r in per_rank if r.get("peak_memory")]
    text = (f"measured per step on {ranks} ranks: {measured['all_gathers_per_step']} all-gathers "
            f"({_human_bytes(measured['all_gather_bytes_per_step'])}/rank) + {measured['reduce_scatters_per_step']} "
            f"reduce-scatters ({_human_bytes(measured['reduce_scatter_bytes_per_step'])}/rank); static "
            f"{static['all_gathers_per_step']} ({_human_bytes(static['all_gather_bytes_per_step'])}) + "
            f"{static['reduce_scatters_per_step']} ({_human_bytes(static['reduce_scatter_bytes_per_step'])})")
    if not same_ws:
        text += f" for world size {static['world_size']} (bytes not comparable)"
    if peaks:
        text += (f"; peak memory {_human_bytes(max(peaks))}/rank ({per_rank[0].get('memory_measure')}), "
                 f"static estimate {_human_bytes(static['memory_per_rank_bytes'])}")
    return counts_equal and (bytes_equal or not same_ws), text


def _steps(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def _num(x: float) -> str:
    if x == float("inf"):
        return "shape differs"
    return f"{x:.3g}"


def _human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


# ============================================================================================
# torchrun mode: this process is one rank
# ============================================================================================
class _StoreReporter:
    def __init__(self, store, prefix: str, rank: int):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.last_phase = "starting"

    def phase(self, name: str, order: int) -> None:
        self.last_phase = name
        with contextlib.suppress(Exception):
            self.store.set(f"{self.prefix}/phase/{self.rank}", json.dumps([name, order]))

    def result(self, data: dict) -> None:
        self._put("result", data)

    def compare(self, data: dict) -> None:
        self._put("compare", data)

    def done(self) -> None:
        self._put("done", {})

    def crash(self, data: dict) -> None:
        self._put("crash", data)

    def _put(self, kind: str, data: dict) -> None:
        clean = {k: v for k, v in data.items() if not k.startswith("_")}
        with contextlib.suppress(Exception):
            self.store.set(f"{self.prefix}/{kind}/{self.rank}", json.dumps(clean, default=str))


class _Watchdog:
    """torchrun: at the deadline, rank 0 names the late ranks, and every rank exits (code 2)."""

    def __init__(self, deadline: float, timeout: float, rank: int, ws: int, store, prefix_fn):
        self.deadline, self.timeout, self.rank, self.ws = deadline, timeout, rank, ws
        self.store, self.prefix_fn = store, prefix_fn
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fsdp-lint-watchdog", daemon=True)

    def start(self) -> "_Watchdog":
        self.thread.start()
        return self

    def cancel(self) -> None:
        self.stop.set()

    def _run(self) -> None:
        if self.stop.wait(max(0.0, self.deadline - time.monotonic())):
            return
        if self.rank == 0:
            state = [{"phase": "unknown", "order": 0, "done": False, "closed": False} for _ in range(self.ws)]
            prefix = self.prefix_fn()

            def read() -> None:
                for r in range(self.ws):
                    with contextlib.suppress(Exception):
                        if self.store.check([f"{prefix}/phase/{r}"]):
                            state[r]["phase"], state[r]["order"] = json.loads(self.store.get(f"{prefix}/phase/{r}"))
                        state[r]["done"] = self.store.check([f"{prefix}/done/{r}"])

            # the store may be busy with the main thread: read it on the side, a few seconds at most
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout=3.0)
            msg = _describe_timeout(state, self.timeout)
            with contextlib.suppress(Exception):
                # the file descriptor: sys.stderr may be redirected while the user's code runs
                os.write(2, f"fsdp-lint: error: --run: {msg}\n".encode())
        else:
            time.sleep(2.0)
        os._exit(2)


def _confirm_torchrun(runnable, settings, opts: RunOptions, t0: float) -> Optional[dict]:
    import torch
    import torch.distributed as dist

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", str(ws)))
    deadline = t0 + opts.timeout
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if opts.device == "cuda" and have <= local_rank:
        raise RunError(f"--device cuda: rank {rank} needs GPU {local_rank}, this node has {have}")
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and have > local_rank and have >= local_ws)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not use_cuda:
        _check_host_memory(runnable, local_ws)
    if use_cuda:
        torch.cuda.set_device(local_rank)
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=_td(opts.timeout + _PG_TIMEOUT_MARGIN_S))
        created = True
    store = dist.distributed_c10d._get_default_store()
    current = {"prefix": "fsdp_lint/0"}
    dog = _Watchdog(deadline, opts.timeout, rank, ws, store, lambda: current["prefix"]).start()
    remaining = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
    files = []
    try:
        for i, res in enumerate(runnable):
            prefix = current["prefix"] = f"fsdp_lint/{i}"
            spec = _spec_for(res, settings, opts)
            rep = _StoreReporter(store, prefix, rank)
            try:
                _rank_main(spec, rank, ws, device, rep, store, prefix, remaining)
            except Exception as exc:  # noqa: BLE001
                rep.crash(_describe_exception(exc, rep.last_phase))
                if rank == 0:
                    raise RunError(f"rank 0 failed in phase '{rep.last_phase}': {type(exc).__name__}: "
                                   f"{_one_line(str(exc))}") from None
                return None
            rep.done()
            if rank != 0:
                continue
            per_rank = _collect_from_store(store, prefix, ws, remaining)
            files.append(_apply_evidence(res, per_rank, spec, ws, opts))
        if rank != 0:
            with contextlib.suppress(Exception):
                store.wait(["fsdp_lint/finished"], _td(remaining()))
    finally:
        if rank == 0:
            # rank 0 has read everything (or gave up): release the others
            with contextlib.suppress(Exception):
                store.set("fsdp_lint/finished", "1")
        dog.cancel()
        if created:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    if rank != 0:
        return None
    return _summary(files, backend, device.type, ws, opts, "torchrun", t0)


def _collect_from_store(store, prefix: str, ws: int, remaining) -> List[dict]:
    out = []
    for r in range(ws):
        key = f"{prefix}/result/{r}"
        crash_key = f"{prefix}/crash/{r}"
        data = None
        end = time.monotonic() + remaining()
        while time.monotonic() < end:
            if store.check([key]):
                data = json.loads(store.get(key))
                break
            if store.check([crash_key]):
                crash = json.loads(store.get(crash_key))
                raise RunError(f"rank {r} failed in phase '{crash.get('phase')}': {crash['type']}: "
                               f"{crash['message']}{_at(crash)}")
            time.sleep(0.05)
        if data is None:
            raise RunError(f"rank {r} sent no result")
        if data.get("setup_error"):
            raise RunError(data["setup_error"])
        out.append(data)
    if all(d.get("error") is None for d in out):
        for r, d in enumerate(out):
            ckey = f"{prefix}/compare/{r}"
            dkey = f"{prefix}/done/{r}"
            end = time.monotonic() + remaining()
            while time.monotonic() < end:
                if store.check([ckey]):
                    d["compare"] = json.loads(store.get(ckey))
                    break
                if store.check([dkey]):
                    break
                time.sleep(0.05)
    return out
