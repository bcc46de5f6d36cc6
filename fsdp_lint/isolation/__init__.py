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

Where ``os.fork`` does not exist (Windows) the lint runs in this process, as before; its analysis keeps
the same limit and message (``isolation.inprocess``).
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from fsdp_lint.engine import FileResult, LintError
from fsdp_lint.process import reaper

from fsdp_lint.isolation.wire import _recv_msg, _send_msg

_START_TIMEOUT_S = 300.0      # the server's start (importing torch on a loaded machine)
_CLEANUP_TIMEOUT_S = 30.0     # a killed child's cleanup
_MAX_JOBS = 8
# fsdp-lint's own analysis of one file (tree, plan, layout, rules, once the file's code has run):
# an internal limit, far above what a 10,000-unit model takes on a loaded machine, so that a bug of
# fsdp-lint (a loop that never ends) cannot hang a lint. replay-timeout bounds the file's own code.
ANALYSIS_TIMEOUT_S = 900.0

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
        return _in_process(lambda: getattr(importlib.import_module(module), func)(settings), settings, label)
    pool = _Jobs()
    try:
        pool.submit(0, None, settings, None, True, None, call=target, label=label, last=True)
        return pool.result(0)
    finally:
        pool.cancel()


def _in_process(lint: Callable[[], FileResult], settings, name: str) -> FileResult:
    """`lint()` in this process (no fork), its analysis limited and timed out as a child's."""
    from fsdp_lint.isolation.inprocess import run_limited

    return run_limited(lint, _Job(None, None, settings, None, True, None, label=name), _timeout_message)


def lint_runs(runs, cache=None, record=None) -> Iterator[Callable[[], FileResult]]:
    """For each run ``(path, settings, argv, explicit, cwd)`` in order, a ``lint()`` that returns
    its FileResult or raises as `engine.lint_file` does. The sources are read and screened here;
    the files that need a replay run in child processes, several at once. Closing the iterator
    (or a Ctrl-C / SIGTERM while waiting) stops the children that are still running.

    `cache` (``fsdp_lint.cache.Cache``): a screened file whose key it holds is not linted again;
    the results of the others are stored (not their errors).

    `record` (a dict, with a cache): filled, run index -> what decides that run's result as the
    re-run of ``fastpath`` checks it: ``("key", key, [(imported file, digest)])`` for a result that
    is cached or was just stored, ``("skip", reason)`` for a file the screen skipped."""
    from fsdp_lint import engine
    from fsdp_lint.entry import project
    project.forget()     # import resolution is remembered for this run's files only
    pool = _Jobs()
    screened: List[Any] = []
    keys: Dict[int, str] = {}
    try:
        for i, (path, settings, argv, explicit, cwd) in enumerate(runs):
            try:
                item = engine.screen(path, settings, explicit=explicit)
            except Exception as exc:  # noqa: BLE001 - raised again in its turn, as lint_file would
                item = exc
            if cache is not None and isinstance(item, engine.Screened):
                item = _cached(cache, keys, i, item, settings, argv, explicit, cwd, record)
            elif record is not None and isinstance(item, FileResult):
                record[i] = ("skip", item.skipped)
            if isinstance(item, FileResult):
                item.cwd = cwd
            elif not isinstance(item, Exception) and available():
                # the server works while we read on; `last`: no warm-up for later files (issue 17)
                pool.submit(i, item, settings, argv, explicit, cwd, last=i == len(runs) - 1)
            screened.append(item)
        for i, ((path, settings, argv, explicit, cwd), item) in enumerate(zip(runs, screened)):
            if isinstance(item, Exception):
                yield _raiser(item)
            elif isinstance(item, FileResult):
                yield (lambda item=item: item)
            elif not available():      # no fork: in this process, the analysis limited as in a child
                yield _storing(cache, keys.get(i), lambda item=item, settings=settings, argv=argv, explicit=explicit,
                               cwd=cwd: _in_process(lambda: engine.lint_facts(item, settings, argv=argv,
                                                                              explicit=explicit, cwd=cwd),
                                                    settings, os.path.basename(item.facts.path)),
                               record, i)
            else:
                yield _storing(cache, keys.get(i), lambda i=i: pool.result(i), record, i)
    finally:
        pool.cancel()
        if cache is not None:
            cache.prune()


def _cached(cache, keys: Dict[int, str], i: int, item, settings, argv, explicit, cwd, record=None):
    """The cached FileResult of a screened run, or the run itself (its key kept for the store)."""
    from fsdp_lint.cache import run_key

    try:
        key = run_key(item, settings, argv, explicit, cwd)
    except Exception:  # noqa: BLE001 - a key that cannot be computed: lint as without a cache
        return item
    hit = cache.get(key)
    if isinstance(hit, tuple) and len(hit) == 2 and isinstance(hit[0], FileResult) and _unchanged(hit[1]):
        if record is not None:
            record[i] = ("key", key, list(hit[1]))
        return hit[0]
    keys[i] = key
    return item


def _unchanged(imported) -> bool:
    """The project files a cached lint imported beyond the key's modules still hold what they held."""
    from fsdp_lint.cache.key import file_digest

    return all(file_digest(path) == digest for path, digest in imported)


def _storing(cache, key: Optional[str], lint: Callable[[], FileResult], record=None, i=None) -> Callable[[], FileResult]:
    """`lint`, whose result (not an exception) goes into the cache under `key`."""
    if cache is None or key is None:
        return lint

    def run() -> FileResult:
        from fsdp_lint.cache.key import file_digest

        res = lint()
        imported = [(path, file_digest(path)) for path in res.imported_files]
        cache.put(key, (res, imported))
        if record is not None:
            record[i] = ("key", key, imported)
        return res
    return run


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


reaper.spare(server_pid)   # a run's cleanup never kills the lint's own fork server


def shutdown() -> None:
    global _SERVER
    for srv in _RETIRED + ([_SERVER] if _SERVER is not None else []):
        srv.close()
    _RETIRED.clear()
    _SERVER = None


class ForkServer:
    def __init__(self, avoid: Set[str]):
        ours, theirs = socket.socketpair()
        code = ("import sys; sys.path[:] = %r; from fsdp_lint.isolation.server import serve; serve(int(sys.argv[1]), %r)"
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
    def __init__(self, key, screened, settings, argv, explicit, cwd, call=None, label=None, last=False):
        self.key, self.screened, self.settings, self.argv, self.cwd = key, screened, settings, argv, cwd
        self.explicit, self.call = explicit, call
        self.last = last                    # no job of this run follows it
        self.name = os.path.basename(label or screened.facts.path)
        self.server: Optional[ForkServer] = None
        self.id = 0
        self.deadline: Optional[float] = None
        self.killed = False
        self.outcome: Optional[Callable[[], FileResult]] = None
        # where the lint is (engine._phase): "setup" (the file's code), "forward" (its model's
        # forward) or "analysis" (fsdp-lint's own); each has its own deadline
        self.phase: Optional[str] = None
        self.phase_started = 0.0
        self.code_s = 0.0                   # time spent in the file's code so far
        self.analysis_s = 0.0               # and in fsdp-lint's analysis
        self.shape: Dict[str, int] = {}     # the model's modules, depth and units, as they become known
        self.stacks = ""                    # its threads' stacks at the deadline (isolation/stacks.py)

    def enter(self, phase: str, now: float) -> None:
        if self.phase is not None:
            spent = now - self.phase_started
            if self.phase == "analysis":
                self.analysis_s += spent
            else:
                self.code_s += spent
        self.phase, self.phase_started = phase, now
        if phase == "analysis":
            self.deadline = now + max(0.0, ANALYSIS_TIMEOUT_S - self.analysis_s)
        else:
            timeout = self.settings.replay_timeout
            self.deadline = now + timeout if timeout else None


class _Jobs:
    """Jobs of one lint run on the fork server; results are taken in any order. A few more jobs
    than the server runs at once are sent ahead; the others wait here."""

    def __init__(self):
        self.jobs: Dict[Any, _Job] = {}
        self.unsent: "collections.deque[_Job]" = collections.deque()
        self.by_id: Dict[Tuple[int, int], _Job] = {}
        self.window = 2 * max(1, min(_MAX_JOBS, _cpus()))

    def submit(self, key, screened, settings, argv, explicit, cwd, call=None, label=None, last=False) -> None:
        job = _Job(key, screened, settings, argv, explicit, cwd, call, label, last)
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
                "explicit": job.explicit, "cwd": job.cwd, "call": job.call, "name": job.name, "last": job.last, "process_cwd": os.getcwd(), "env": dict(os.environ), "sys_path": list(sys.path)}
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
                    j.enter(j.phase or "setup", now)          # its time so far, for the message
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
            job.enter("setup", time.monotonic())
        elif kind == "phase" and not job.killed and job.phase is not None:
            job.shape.update(msg[3])
            if msg[2] != job.phase:
                job.enter(msg[2], time.monotonic())
        elif kind == "stacks":
            job.stacks = msg[2]
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
        return _raiser(LintError(_timeout_message(job)))
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
        why = ("the file's code killed it, or the machine's out-of-memory killer did: the process held more memory "
               "than there is, as real tensors the size of the model would" if sig == signal.SIGKILL
               else "the file's code or a library it imports crashed or killed it")
        return _raiser(LintError(f"{name}: the process linting it was killed by {signame} before it finished ({why})"))
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else status
    return _raiser(LintError(f"{name}: the file's code ended the process linting it (exit code {code}: "
                             f"os._exit or similar) before the lint finished"))

def _timeout_message(job: _Job) -> str:
    """Which deadline ran out: the file's code (replay-timeout) or fsdp-lint's analysis (its own)."""
    name, timeout = job.name, job.settings.replay_timeout
    if job.phase == "analysis":
        shape = job.shape
        size = ", ".join(f"{shape[k]:,} {what}" for k, what in (("modules", "modules"), ("units", "FSDP units"))
                         if k in shape)
        if "depth" in shape:
            size += f", nested {shape['depth']:,} deep"
        return (f"{name}: fsdp-lint's analysis of the model ({size or 'its size unknown'}) took longer than its "
                f"internal limit of {ANALYSIS_TIMEOUT_S:g} s; the file's code had finished (in {job.code_s:.1f} s): "
                f"a limit of fsdp-lint, not a fault of the file. It was stopped with every process the file started")
    where = _waiting_at(job)
    if job.phase == "forward":
        return (f"{name}: the model's forward (run once on the meta device, for the activations) did not finish "
                f"within replay-timeout = {timeout:g} s{where} (it may wait for something: a lock, a network); it "
                f"was stopped with every process the file started")
    return (f"{name}: the setup code did not finish within replay-timeout = {timeout:g} s{where} (it may wait "
            f"for something: a data set, a network, a lock); it was stopped with every process it started")


def _waiting_at(job: _Job) -> str:
    """``: it was at train.py:57 (main), inside ...`` from the child's stacks, or nothing."""
    if not job.stacks:
        return ""
    from fsdp_lint.entry.project import is_local
    from fsdp_lint.isolation.stacks import waiting_at

    with contextlib.suppress(Exception):
        where = waiting_at(job.stacks, is_local)
        if where:
            return f": it was {where}"
    return ""


def _cpus() -> int:
    """How many files are linted at once: ``FSDP_LINT_JOBS``, else one per CPU this process may use."""
    jobs = os.environ.get("FSDP_LINT_JOBS", "")
    if jobs.strip().isdigit() and int(jobs) > 0:
        return int(jobs)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
