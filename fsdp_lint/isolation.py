"""Each file's lint runs in a child process, so that nothing the linted code does reaches fsdp-lint.

Linting runs the repository's setup code (DESIGN §4): its module level, the modules it imports, the
model's constructors. Whatever that code does -- ``os._exit(0)``, ``sys.exit``, patching builtins,
``os.chdir``, changing the environment or signal handlers, starting threads or processes that never
end, registering atexit hooks, hanging -- must end with that file's lint: the file gets one clear
line (exit code 2) and the other files are linted as usual.

How:

* this process reads and screens the sources (no torch, none of their code runs); a file that needs
  a replay becomes a **job** for the **fork server** (``python -c ... serve(fd)``, started on the first
  such file and kept for the life of this process). The server imports torch and fsdp-lint's
  pipeline once, warms them up on a small built-in model, then forks one **child** per job (up to one
  per CPU at a time): ``engine.lint_facts`` -- replay, tree, plan, layout, rules -- runs there and the
  result comes back pickled (plain dataclasses) through a pipe;
* the child leads its own process group and dies with the server (``PR_SET_PDEATHSIG``); the server
  is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process the linted code starts stays
  below it, even after a double fork or ``setsid()``;
* the **deadline** (``replay-timeout``) is kept by this process: when it passes, the server kills the
  child's whole process group. When a child ends (a result, ``os._exit``, a crash or the kill) its
  group is killed; what was reparented to the server is killed as soon as no job runs: nothing a
  file started outlives the lint;
* the server lives in a session of its own (a Ctrl-C at the terminal reaches fsdp-lint, which stops
  the children) and ends, killing everything below it, when this process goes away -- exit, crash or
  SIGKILL;
* installed libraries a child imported (``transformers``, ``peft``: seconds each) are imported by the
  server too -- in a replay of their import statements, in the same simulated environment -- so that
  the next files do not pay for them again, as they did not when everything ran in one process. Not
  the repository's own modules: those run in children only.

Where ``os.fork`` does not exist (Windows) the lint runs in this process, as before.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from fsdp_lint import reaper
from fsdp_lint.engine import FileResult, LintError

_START_TIMEOUT_S = 300.0      # the server's start (importing torch on a loaded machine)
_CLEANUP_TIMEOUT_S = 30.0     # a killed child's cleanup
_MAX_JOBS = 8
_HEADER = struct.Struct("!Q")
# the child's way out, bound before any linted code runs (which may replace os._exit, len, ...)
_exit, _getpid, _write, _pack, _dumps = os._exit, os.getpid, os.write, _HEADER.pack, pickle.dumps

# a small model the server lints once at start, so that what torch and fsdp-lint import or build
# lazily on a first replay (torch._dynamo behind the meta-device init functions, FSDP1 and FSDP2
# recorders, the rules) is in place before the first fork
_WARM_UP = '''
import functools
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2)
        self.fc = nn.Linear(dim, dim)
        self.conv = nn.Conv1d(dim, dim, 1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(16, 32)


model = Net()
model.embed.requires_grad_(False)
model = model.to(torch.bfloat16)
{wrap}
optimizer = torch.optim.AdamW(model.parameters())
'''
_WARM_UP_WRAPS = (
    "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)",
    "model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
    "transformer_layer_cls={Block}), use_orig_params=True)",
)


class IsolatedInternalError(Exception):
    """A bug in fsdp-lint met in the child: the exception's class, its first line and the child's
    traceback (shown with --debug)."""

    def __init__(self, type_name: str, message: str, traceback_text: str):
        super().__init__(message + (f"\n\n{type_name} in the process that linted the file:\n{traceback_text}"
                                    if traceback_text else ""))
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text


def available() -> bool:
    return hasattr(os, "fork") and sys.platform != "win32"


def lint_file(path: str, settings, *, argv: Optional[List[str]] = None, explicit: bool = True,
              cwd: Optional[str] = None) -> FileResult:
    """`engine.lint_file`, with the part that runs the file's code in a child process. Raises
    LintError (one line) or IsolatedInternalError."""
    linted = lint_runs([(path, settings, argv, explicit, cwd)])
    try:
        return next(linted)()
    finally:
        linted.close()


def lint_call(target: str, settings, label: str) -> FileResult:
    """``module:function(settings)`` -- a lint that builds a model without a file to screen (the
    ``--hf-config`` model, which can run the model repository's code) -- in a child process, as a
    file's lint. `label` names it in messages. Raises LintError or IsolatedInternalError."""
    if not available():
        import importlib

        module, _, func = target.partition(":")
        return getattr(importlib.import_module(module), func)(settings)
    pool = _Jobs()
    try:
        pool.submit(0, None, settings, None, True, None, call=target, label=label)
        return pool.result(0)
    finally:
        pool.cancel()


def lint_runs(runs) -> Iterator[Callable[[], FileResult]]:
    """For each run ``(path, settings, argv, explicit, cwd)`` in order, a ``lint()`` that returns
    its FileResult or raises as `engine.lint_file` does. The sources are read and screened here;
    the files that need a replay run in child processes, several at once. Closing the iterator
    (or a Ctrl-C / SIGTERM while waiting) stops the children that are still running."""
    from fsdp_lint import engine

    pool = _Jobs()
    screened: List[Any] = []
    try:
        for i, (path, settings, argv, explicit, cwd) in enumerate(runs):
            try:
                item = engine.screen(path, settings, explicit=explicit)
            except Exception as exc:  # noqa: BLE001 - raised again in its turn, as lint_file would
                item = exc
            if isinstance(item, FileResult):
                item.cwd = cwd
            elif not isinstance(item, Exception) and available():
                pool.submit(i, item, settings, argv, explicit, cwd)    # the server works while we read on
            screened.append(item)
        for i, ((path, settings, argv, explicit, cwd), item) in enumerate(zip(runs, screened)):
            if isinstance(item, Exception):
                yield _raiser(item)
            elif isinstance(item, FileResult):
                yield (lambda item=item: item)
            elif not available():
                yield (lambda item=item, settings=settings, argv=argv, explicit=explicit, cwd=cwd:
                       engine.lint_facts(item, settings, argv=argv, explicit=explicit, cwd=cwd))
            else:
                yield (lambda i=i: pool.result(i))
    finally:
        pool.cancel()


def _raiser(exc: BaseException) -> Callable[[], FileResult]:
    def lint() -> FileResult:
        raise exc
    return lint


# ============================================================================================
# this side: the server handle and the jobs
# ============================================================================================
_SERVER: Optional["ForkServer"] = None
_RETIRED: List["ForkServer"] = []   # still finishing the jobs they had started


def server() -> "ForkServer":
    """The running fork server, or a new one."""
    global _SERVER
    if _SERVER is None or not _SERVER.alive() or _SERVER.retired:
        avoid: Set[str] = set()
        if _SERVER is None:
            atexit.register(shutdown)
        elif _SERVER.retired and _SERVER.alive():
            avoid = _SERVER.avoid           # the libraries that started a thread there
            _RETIRED.append(_SERVER)
        else:
            _SERVER.close()
        _SERVER = ForkServer(avoid)
    return _SERVER


def server_pid() -> Optional[int]:
    """The fork server's pid while one runs (tests tell it apart from processes a test left)."""
    return _SERVER.proc.pid if _SERVER is not None and _SERVER.alive() else None


def shutdown() -> None:
    global _SERVER
    for srv in _RETIRED + ([_SERVER] if _SERVER is not None else []):
        srv.close()
    _RETIRED.clear()
    _SERVER = None


class ForkServer:
    def __init__(self, avoid: Set[str]):
        ours, theirs = socket.socketpair()
        code = ("import sys; sys.path[:] = %r; from fsdp_lint.isolation import serve; serve(int(sys.argv[1]), %r)"
                % (list(sys.path), sorted(avoid)))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        theirs.close()
        self.sock: Optional[socket.socket] = ours
        self.ready = False
        self.retired = False          # the server imported a library that started a thread
        self.avoid = set(avoid)
        self.next_id = 0
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.sock is not None and self.proc.poll() is None

    def close(self) -> None:
        """End the server: it kills whatever is left below it and exits."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=_CLEANUP_TIMEOUT_S)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)

    def send(self, msg) -> None:
        _send_msg(self.sock, msg)


class _Job:
    def __init__(self, key, screened, settings, argv, explicit, cwd, call=None, label=None):
        self.key, self.screened, self.settings, self.argv, self.cwd = key, screened, settings, argv, cwd
        self.explicit, self.call = explicit, call
        self.name = os.path.basename(label or screened.facts.path)
        self.server: Optional[ForkServer] = None
        self.id = 0
        self.deadline: Optional[float] = None
        self.killed = False
        self.outcome: Optional[Callable[[], FileResult]] = None


class _Jobs:
    """Jobs of one lint run on the fork server; results are taken in any order. A few more jobs
    than the server runs at once are sent ahead; the others wait here."""

    def __init__(self):
        self.jobs: Dict[Any, _Job] = {}
        self.unsent: "collections.deque[_Job]" = collections.deque()
        self.by_id: Dict[Tuple[int, int], _Job] = {}
        self.window = 2 * max(1, min(_MAX_JOBS, _cpus()))

    def submit(self, key, screened, settings, argv, explicit, cwd, call=None, label=None) -> None:
        job = _Job(key, screened, settings, argv, explicit, cwd, call, label)
        self.jobs[key] = job
        self.unsent.append(job)
        self._top_up()

    def _top_up(self) -> None:
        in_flight = sum(1 for j in self.jobs.values() if j.server is not None and j.outcome is None)
        while self.unsent and in_flight < self.window:
            self._send(self.unsent.popleft(), server())
            in_flight += 1

    def _send(self, job: _Job, srv: ForkServer) -> None:
        srv.next_id += 1
        job.server, job.id = srv, srv.next_id
        self.by_id[(id(srv), job.id)] = job
        spec = {"id": job.id, "screened": job.screened, "settings": job.settings, "argv": job.argv,
                "explicit": job.explicit, "cwd": job.cwd, "call": job.call, "name": job.name, "process_cwd": os.getcwd(), "env": dict(os.environ), "sys_path": list(sys.path)}
        try:
            srv.send(("lint", spec))
        except OSError:
            self._server_lost(srv)

    def result(self, key) -> FileResult:
        job = self.jobs[key]
        while job.outcome is None:
            self._top_up()
            # its own server, or, while it waits to be sent, the server of a job sent before it
            srv = job.server or next((j.server for j in self.jobs.values()
                                      if j.server is not None and j.outcome is None), None)
            if srv is None:
                job.outcome = _raiser(LintError(f"{job.name}: the process that lints files is gone"))
                break
            self._pump(srv)
        self._top_up()
        return job.outcome()

    def _pump(self, srv: ForkServer) -> None:
        """Handle the next message of the server, or its jobs' deadlines."""
        if srv.sock is None:
            self._server_lost(srv)
            return
        open_jobs = [j for j in self.jobs.values() if j.server is srv and j.outcome is None]
        deadlines = [j.deadline for j in open_jobs if j.deadline is not None]
        if not srv.ready:
            deadlines.append(srv.started + _START_TIMEOUT_S)
        try:
            msg = _recv_msg(srv.sock, min(deadlines) if deadlines else None)
        except TimeoutError:
            now = time.monotonic()
            if not srv.ready and srv.started + _START_TIMEOUT_S <= now:
                self._server_lost(srv, f"did not start within {_START_TIMEOUT_S:g} s")
                return
            for j in open_jobs:
                if j.deadline is not None and j.deadline <= now:
                    if j.killed:             # the server did not clean up in time: start afresh
                        self._server_lost(srv, "could not stop a child")
                        return
                    srv.send(("kill", j.id))
                    j.killed, j.deadline = True, now + _CLEANUP_TIMEOUT_S
            return
        except OSError:
            msg = None
        if msg is None:
            self._server_lost(srv)
            return
        if msg[0] == "ready":
            srv.ready = True
            return
        if msg[0] == "error":
            self._server_lost(srv, f"could not start: {msg[1]}")
            return
        kind, job_id = msg[0], msg[1]
        job = self.by_id.get((id(srv), job_id))
        if job is None or job.outcome is not None:
            return
        if kind == "started" and not job.killed:
            timeout = job.settings.replay_timeout
            job.deadline = time.monotonic() + timeout if timeout else None
        elif kind == "done":
            job.outcome = _outcome(job, msg[2], msg[3])
        elif kind == "requeue":
            # the server imported a library that started a thread: it forks no more; the jobs it
            # had not started go to a new server that leaves that library alone
            srv.retired = True
            srv.avoid |= set(msg[2])
            job.server = None
            self.unsent.appendleft(job)

    def _server_lost(self, srv: Optional[ForkServer], how: str = "ended unexpectedly") -> None:
        for j in self.jobs.values():
            if j.outcome is None and j.server is srv:
                j.outcome = _raiser(LintError(f"{j.name}: the process that lints files {how}"))
        if srv is not None:
            srv.close()

    def cancel(self) -> None:
        """Stop the jobs that have no outcome (Ctrl-C, SIGTERM, an error): their children are killed
        with everything they started."""
        self.unsent.clear()
        for job in self.jobs.values():
            if job.outcome is None and job.server is not None and job.server.sock is not None:
                with contextlib.suppress(Exception):
                    job.server.send(("kill", job.id))


def _outcome(job: _Job, status: int, payload: bytes) -> Callable[[], FileResult]:
    name = job.name
    if job.killed:
        timeout = job.settings.replay_timeout
        return _raiser(LintError(
            f"{name}: linting did not finish within replay-timeout = {timeout:g} s (the setup code may wait for "
            f"something: a data set, a network, a lock); it was stopped with every process it started"))
    if payload:
        enabled = gc.isenabled()
        gc.disable()       # unpickling a large result creates many objects: no collections meanwhile
        try:
            kind, *rest = pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - a result the child could not finish writing
            return _raiser(LintError(f"{name}: the process linting it sent an unreadable result "
                                     f"({type(exc).__name__})"))
        finally:
            if enabled:
                gc.enable()
        if kind == "ok":
            return lambda: rest[0]
        if kind == "lint_error":
            err = LintError(rest[0])
            err.user_traceback = rest[1]             # the linted code's own exception, for --debug
            return _raiser(err)
        return _raiser(IsolatedInternalError(*rest))
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = str(sig)
        return _raiser(LintError(f"{name}: the process linting it was killed by {signame} before it finished "
                                 f"(the file's code or a library it imports crashed or killed it)"))
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else status
    return _raiser(LintError(f"{name}: the file's code ended the process linting it (exit code {code}: "
                             f"os._exit or similar) before the lint finished"))


# ============================================================================================
# framing: 8-byte length + pickle
# ============================================================================================
def _send_msg(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: Optional[float]) -> Optional[bytes]:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not select.select([sock], [], [], left)[0]:
                continue
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_msg(sock: socket.socket, deadline: Optional[float] = None):
    """The next message; None at EOF; TimeoutError when none started before `deadline`."""
    head = _recv_exact(sock, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    data = _recv_exact(sock, size, None)
    return None if data is None else pickle.loads(data)


def _frames(raw: bytes) -> List[bytes]:
    """The whole frames (8-byte length + body) in `raw`; a cut-off one is dropped."""
    out, pos = [], 0
    while pos + _HEADER.size <= len(raw):
        (size,) = _HEADER.unpack(raw[pos:pos + _HEADER.size])
        body = raw[pos + _HEADER.size:pos + _HEADER.size + size]
        if len(body) != size:
            break
        out.append(body)
        pos += _HEADER.size + size
    return out


# ============================================================================================
# the server
# ============================================================================================
class _Child:
    def __init__(self, job: dict, pid: int, r: int):
        self.job, self.pid, self.r = job, pid, r
        self.pidfd = _pidfd(pid)
        self.chunks: List[bytes] = []


def serve(fd: int, avoid: List[str] = ()) -> None:
    """Body of the fork server: import once, then fork one child per job until fsdp-lint is gone."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # fsdp-lint handles Ctrl-C and tells us
    reaper.prctl(reaper._PR_SET_CHILD_SUBREAPER, 1)
    try:
        _preload()
    except BaseException as exc:  # noqa: BLE001 - reported, then the server ends
        with contextlib.suppress(Exception):
            _send_msg(sock, ("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    _send_msg(sock, ("ready", os.getpid()))
    try:
        _Server(sock, set(avoid)).loop()
    finally:
        _kill_descendants()
        os._exit(0)


def _preload() -> None:
    """What every child needs, imported and warmed up once here (children inherit it at fork)."""
    import gc

    import torch  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn  # noqa: F401

    from fsdp_lint import engine, layout, plan, replay, rule, selection, tree  # noqa: F401

    rule.all_rules()
    for wrap in _WARM_UP_WRAPS:
        _warm_up(_WARM_UP.format(wrap=wrap))
    # children never walk (and so never copy) the objects that exist now when they collect garbage
    gc.collect()
    gc.freeze()


def _warm_up(source: str) -> None:
    from fsdp_lint import engine
    from fsdp_lint.config import Settings
    from fsdp_lint.source import parse_source

    with contextlib.suppress(Exception):
        engine.lint_facts(engine.Screened(parse_source("<fsdp-lint warm-up>", source)),
                          Settings(world_size=4, replay_timeout=None))


class _Server:
    def __init__(self, sock: socket.socket, avoid: Set[str]):
        self.sock = sock
        self.parent = _pidfd(os.getppid())   # fsdp-lint's end, also when processes it forked keep the socket
        self.pending: "collections.deque[dict]" = collections.deque()
        self.running: Dict[int, _Child] = {}
        self.slots = max(1, min(_MAX_JOBS, _cpus()))
        self.avoid = avoid                  # libraries not to import here
        self.learned: Set[str] = set()      # libraries imported here
        self.to_learn: Set[str] = set()
        self.retired = False

    def loop(self) -> None:
        while True:
            self._start_pending()
            watch: List[Any] = [self.sock] + ([self.parent] if self.parent is not None else [])
            for child in self.running.values():
                watch += [child.r] if child.r >= 0 else []
                watch += [child.pidfd] if child.pidfd is not None else []
            polling = any(c.pidfd is None for c in self.running.values())
            ready = select.select(watch, [], [], 0.05 if polling else None)[0]
            if self.parent is not None and self.parent in ready:
                return
            if self.sock in ready:
                msg = _recv_msg(self.sock)
                if msg is None:
                    return
                self._handle(msg)
            for child in list(self.running.values()):
                if child.r >= 0 and child.r in ready:
                    data = os.read(child.r, 1 << 20)
                    if data:
                        child.chunks.append(data)
                    else:
                        os.close(child.r)
                        child.r = -1
                if (child.pidfd is None or child.pidfd in ready) and _exited(child.pid):
                    self._finish(child)
            if not self.running and not self.pending:
                _kill_descendants()         # what was reparented here once no job can own it

    def _handle(self, msg) -> None:
        if msg[0] == "lint":
            self.pending.append(msg[1])
        elif msg[0] == "kill":
            for child in self.running.values():
                if child.job["id"] == msg[1]:
                    _kill_group(child.pid)
            for job in [j for j in self.pending if j["id"] == msg[1]]:
                self.pending.remove(job)
                _send_msg(self.sock, ("done", job["id"], None, b""))

    def _start_pending(self) -> None:
        while self.pending and len(self.running) < self.slots:
            if self.to_learn and not self.retired:
                self._learn()
            job = self.pending.popleft()
            if self.retired:
                _send_msg(self.sock, ("requeue", job["id"], sorted(self.learned)))
                continue
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:                            # the child
                os.close(r)
                for fd in [self.sock.fileno(), self.parent] + [c.r for c in self.running.values()] + \
                        [c.pidfd for c in self.running.values()]:
                    with contextlib.suppress(Exception):
                        if fd is not None and fd >= 0:
                            os.close(fd)
                _child(job, w)                      # never returns
            os.close(w)
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)                # as the child does: no window without its own group
            self.running[pid] = _Child(job, pid, r)
            _send_msg(self.sock, ("started", job["id"], pid))

    def _finish(self, child: _Child) -> None:
        # the group is killed while the child is a zombie: its number cannot be reused yet
        _kill_group(child.pid)
        status = os.waitpid(child.pid, 0)[1]
        if child.r >= 0:
            child.chunks += _drain(child.r)
            os.close(child.r)
        if child.pidfd is not None:
            os.close(child.pidfd)
        del self.running[child.pid]
        frames = _frames(b"".join(child.chunks))
        if len(frames) > 1:
            with contextlib.suppress(Exception):
                self.to_learn |= set(pickle.loads(frames[1])) - self.learned - self.avoid
        _send_msg(self.sock, ("done", child.job["id"], status, frames[0] if frames else b""))

    def _learn(self) -> None:
        """Import the libraries children imported, as a replay would (same simulated world)."""
        import threading

        names = sorted(self.to_learn, key=lambda n: (n.count("."), n))
        self.to_learn.clear()
        self.learned |= set(names)
        source = "".join(f"import {n}\n" for n in names) + _WARM_UP.format(wrap="fully_shard(model)")
        _warm_up(source)
        if threading.active_count() > 1:
            # forking a process with more than one thread is not safe: a new server takes over
            self.retired = True


def _cpus() -> int:
    """How many files are linted at once: ``FSDP_LINT_JOBS``, else one per CPU this process may use."""
    jobs = os.environ.get("FSDP_LINT_JOBS", "")
    if jobs.strip().isdigit() and int(jobs) > 0:
        return int(jobs)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _drain(fd: int) -> List[bytes]:
    """What is left in the result pipe, without waiting for a writer that a grandchild may hold."""
    os.set_blocking(fd, False)
    out = []
    with contextlib.suppress(BlockingIOError, OSError):
        while True:
            data = os.read(fd, 1 << 20)
            if not data:
                break
            out.append(data)
    return out


def _pidfd(pid: int) -> Optional[int]:
    with contextlib.suppress(Exception):
        return os.pidfd_open(pid)
    return None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether the child has ended (it is not reaped: its pid and group stay reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == pid


def _kill_descendants() -> int:
    """Kill every process below this (subreaper) server but the running jobs' children, with their
    process groups; reap them. Returns how many processes were killed."""
    killed = 0
    for _ in range(100):
        left = reaper.children(os.getpid())
        if not left:
            break
        reaper.kill_processes(left, spare_groups={os.getpgid(0)})
        killed += len(left)
        for pid in left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
    # zombies of processes that were reparented here and had already exited
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return killed


# ============================================================================================
# the child
# ============================================================================================
def _child(job: dict, w: int) -> None:
    me = _getpid()
    code = 0
    try:
        os.setpgid(0, 0)
        reaper.prctl(reaper._PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        # torch's module walks recurse once per level: a 1,000-deep model needs more than Python's
        # default (its own script raises it to build the model; the analysis must not need less)
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
        # a lint builds many objects that live until it ends (the model, the tree, the layout):
        # collecting every 700 allocations walks them again and again (a third of the lint of
        # 10,000 units); cyclic garbage is still collected, less often
        gc.set_threshold(100_000, 50, 100)
        before = set(sys.modules)
        out = _lint_in_child(job)
        gc.disable()       # a large result (10,000 units) pickles 3x faster without collections
        try:
            data = _dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            data = _dumps(("internal", type(exc).__name__, f"cannot send the result: {exc}", ""))
        try:
            libraries = _dumps(_new_libraries(before))
        except Exception:  # noqa: BLE001 - only an optimisation
            libraries = _dumps([])
        if _getpid() == me:                          # not a fork the file's code made of this process
            view = memoryview(_pack(data.__len__()) + data + _pack(libraries.__len__()) + libraries)
            while view:
                view = view[_write(w, view):]
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        _exit(code)                                  # no atexit hooks, no waiting for the file's threads


def _new_libraries(before: Set[str]) -> List[str]:
    """Modules of installed libraries imported since the fork (not the repository's own code)."""
    from fsdp_lint.project import is_local

    out = []
    for name, mod in list(sys.modules.items()):
        if name in before or name.startswith(("__", "fsdp_lint")):
            continue
        fname = getattr(mod, "__file__", None)
        if not isinstance(fname, str) or fname.startswith("<"):
            continue
        norm = fname.replace("\\", "/")
        if (not is_local(fname)) if fname.endswith(".py") else ("-packages/" in norm or "/lib/python3" in norm):
            out.append(name)
    return out[:5000]


def _lint_in_child(job: dict) -> Tuple:
    import dataclasses
    import traceback

    from fsdp_lint import engine

    screened, settings, name = job["screened"], job["settings"], job["name"]
    try:
        os.chdir(job["process_cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        sys.path[:] = job["sys_path"]
        # the deadline is kept from outside (fsdp-lint kills this process group), not by SIGALRM,
        # which the file's code could ignore or use itself
        settings = dataclasses.replace(settings, replay_timeout=None)
        if job["call"]:
            import importlib

            module, _, func = job["call"].partition(":")
            return ("ok", getattr(importlib.import_module(module), func)(settings))
        return ("ok", engine.lint_facts(screened, settings, argv=job["argv"], explicit=job["explicit"],
                                        cwd=job["cwd"]))
    except LintError as exc:
        user = getattr(exc, "user_exception", None)
        text = "".join(traceback.format_exception(type(user), user, user.__traceback__)) if user is not None else ""
        return ("lint_error", str(exc), text)
    except SystemExit as exc:
        return ("lint_error", f"{name}: the file's code called sys.exit({exc.code!r}) while it was linted", "")
    except KeyboardInterrupt:
        return ("lint_error", f"{name}: interrupted", "")
    except BaseException as exc:  # noqa: BLE001 - a bug: the parent says so in one line
        text = str(exc).strip()
        return ("internal", type(exc).__name__, text.splitlines()[0] if text else "", traceback.format_exc())
