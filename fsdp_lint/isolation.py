"""Each file's lint runs in a child process, so that nothing the linted code does reaches fsdp-lint.

Linting runs the repository's setup code (DESIGN §4): its module level, the modules it imports, the
model's constructors. Whatever that code does -- ``os._exit(0)``, ``sys.exit``, patching builtins,
``os.chdir``, changing the environment or signal handlers, starting threads or processes that never
end, registering atexit hooks, hanging -- must end with that file's lint: the file gets one clear
line (exit code 2) and the other files are linted as usual.

How:

* a **fork server** (``python -c ... serve(fd)``, started on the first file that needs a replay and
  kept for the life of this process) imports torch and fsdp-lint's pipeline once, then forks one
  **child** per file: ``engine.lint_facts`` (replay, tree, plan, layout, rules) runs there and the
  result comes back pickled (plain dataclasses) through a pipe;
* the child is the leader of its own process group and dies with the server
  (``PR_SET_PDEATHSIG``); the server is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every
  process the linted code starts stays below it, even after a double fork or ``setsid()``;
* the **deadline** (``replay-timeout``) is kept by this process: when it passes, the server kills the
  child's whole process group. When a child ends (a result, ``os._exit``, a crash or the kill), the
  server kills whatever it left (its group, then every process reparented to the server) before it
  reports the job done: nothing a file started outlives its lint;
* the server lives in a session of its own (a Ctrl-C at the terminal reaches fsdp-lint, which stops
  the child) and ends, killing everything below it, when this process goes away -- exit, crash or
  SIGKILL (its end of the socket closes).

Where ``os.fork`` does not exist (Windows) the lint runs in this process, as before.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, List, Optional, Tuple

from fsdp_lint import reaper
from fsdp_lint.engine import FileResult, LintError

# how long the server may take to start (importing torch on a loaded machine) and to clean up a child
_START_TIMEOUT_S = 300.0
_CLEANUP_TIMEOUT_S = 30.0
_HEADER = struct.Struct("!Q")
# the child's way out, bound before any linted code runs (which may replace os._exit, len, ...)
_exit, _getpid, _write, _pack, _dumps = os._exit, os.getpid, os.write, _HEADER.pack, pickle.dumps


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


def lint_file(path: str, settings) -> FileResult:
    """`engine.lint_file`, with the part that runs the file's code in a child process.

    Reading and screening the source happens here (no torch, no code of the file runs); a file that
    needs a replay goes to the fork server. Raises LintError (one line) or IsolatedInternalError."""
    from fsdp_lint import engine

    screened = engine.screen(path, settings)
    if isinstance(screened, FileResult):
        return screened
    if not available():
        return engine.lint_facts(screened, settings)
    return server().lint(screened, settings)


# ============================================================================================
# this side: the server handle
# ============================================================================================
_SERVER: Optional["ForkServer"] = None


def server() -> "ForkServer":
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        if _SERVER is not None:
            _SERVER.close()
        else:
            atexit.register(shutdown)
        _SERVER = ForkServer()
    return _SERVER


def server_pid() -> Optional[int]:
    """The fork server's pid while one runs (tests tell it apart from processes a test left)."""
    return _SERVER.proc.pid if _SERVER is not None and _SERVER.alive() else None


def shutdown() -> None:
    global _SERVER
    if _SERVER is not None:
        _SERVER.close()
        _SERVER = None


class ForkServer:
    def __init__(self):
        ours, theirs = socket.socketpair()
        code = ("import sys; sys.path[:] = %r; from fsdp_lint.isolation import serve; serve(int(sys.argv[1]))"
                % (list(sys.path),))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        theirs.close()
        self.sock = ours
        self.ready = False
        self.jobs = 0

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

    def _recv(self, deadline: Optional[float]):
        """The next message from the server; None when it is gone; TimeoutError past `deadline`."""
        return _recv_msg(self.sock, deadline)

    def _wait_ready(self) -> None:
        if self.ready:
            return
        msg = self._recv(time.monotonic() + _START_TIMEOUT_S)
        if msg is None or msg[0] != "ready":
            detail = msg[1] if msg is not None and msg[0] == "error" else "it exited"
            self.close()
            raise LintError(f"cannot start the process that lints files: {detail}")
        self.ready = True

    def lint(self, facts, settings) -> FileResult:
        """Lint one screened file in a child process, within settings.replay_timeout."""
        self._wait_ready()
        self.jobs += 1
        job_id = self.jobs
        job = {"id": job_id, "facts": facts, "settings": settings, "cwd": os.getcwd(), "env": dict(os.environ),
               "sys_path": list(sys.path)}
        name = os.path.basename(facts.path)
        try:
            _send_msg(self.sock, ("lint", job))
        except OSError:
            self.close()
            raise LintError(f"{name}: the process that lints files is gone; try again") from None
        timeout = settings.replay_timeout
        deadline = time.monotonic() + _START_TIMEOUT_S     # until the child has started
        killed = False
        try:
            while True:
                try:
                    msg = self._recv(deadline)
                except TimeoutError:
                    if killed:              # the server did not clean up in time: start afresh next time
                        self.close()
                        raise LintError(f"{name}: the lint process could not be stopped") from None
                    _send_msg(self.sock, ("kill", job_id))
                    killed = True
                    deadline = time.monotonic() + _CLEANUP_TIMEOUT_S
                    continue
                if msg is None:
                    self.close()
                    raise LintError(f"{name}: the process that lints files ended unexpectedly")
                kind, mid = msg[0], msg[1]
                if mid != job_id:
                    continue                # late news of an earlier, interrupted job
                if kind == "started" and not killed:
                    deadline = time.monotonic() + timeout if timeout else None
                elif kind == "done":
                    status, payload, leftovers = msg[2], msg[3], msg[4]
                    break
        except BaseException:
            # Ctrl-C, SIGTERM: the child and everything it started are killed before fsdp-lint goes
            with contextlib.suppress(Exception):
                _send_msg(self.sock, ("kill", job_id))
            raise
        if killed:
            raise LintError(f"{name}: linting did not finish within replay-timeout = {timeout:g} s (the setup "
                            f"code may wait for something: a data set, a network, a lock); it was stopped "
                            f"with every process it started")
        return _outcome(name, status, payload)


def _outcome(name: str, status: int, payload: bytes) -> FileResult:
    if payload:
        try:
            kind, *rest = pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - a result the child could not finish writing
            raise LintError(f"{name}: the lint process sent an unreadable result ({type(exc).__name__})") from None
        if kind == "ok":
            return rest[0]
        if kind == "lint_error":
            raise LintError(rest[0])
        raise IsolatedInternalError(*rest)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = str(sig)
        raise LintError(f"{name}: the process linting it was killed by {signame} before it finished (the file's "
                        f"code or a library it imports crashed or killed it)")
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    raise LintError(f"{name}: the file's code ended the process linting it (exit code {code}, e.g. os._exit) "
                    f"before the lint finished")


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
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                if time.monotonic() >= deadline:
                    raise TimeoutError
                continue
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_msg(sock: socket.socket, deadline: Optional[float] = None):
    head = _recv_exact(sock, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    data = _recv_exact(sock, size, None)
    return None if data is None else pickle.loads(data)


# ============================================================================================
# the server
# ============================================================================================
def serve(fd: int) -> None:
    """Body of the fork server: import once, then fork one child per job until the socket closes."""
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
    # fsdp-lint's end: its socket closes, or (when processes it forked hold a copy) the process ends
    parent = _pidfd(os.getppid())
    try:
        while True:
            ready = select.select([sock] + ([parent] if parent is not None else []), [], [])[0]
            if parent in ready:
                break
            msg = _recv_msg(sock)
            if msg is None:
                break
            if msg[0] == "lint":
                if not _run_job(sock, msg[1], parent):
                    break
    finally:
        _kill_descendants()
        os._exit(0)


def _preload() -> None:
    """What every child needs, imported once here (children inherit it at fork)."""
    import torch  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn  # noqa: F401

    from fsdp_lint import engine, layout, plan, replay, rule, selection, tree  # noqa: F401

    rule.all_rules()


def _run_job(sock: socket.socket, job: dict, parent: Optional[int]) -> bool:
    """Fork a child for `job`, relay its result, clean up after it. False when fsdp-lint is gone."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child
        os.close(r)
        with contextlib.suppress(Exception):
            sock.close()
        _child(job, w)                               # never returns
    os.close(w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)                         # as the child does: no window without its own group
    _send_msg(sock, ("started", job["id"], pid))
    chunks: List[bytes] = []
    status = None
    parent_gone = False
    pidfd = _pidfd(pid)
    try:
        watch: List[Any] = [r, sock] + [fd for fd in (pidfd, parent) if fd is not None]
        while status is None:
            ready = select.select(watch, [], [], None if pidfd is not None else 0.05)[0]
            if r in ready:
                data = os.read(r, 1 << 20)
                if data:
                    chunks.append(data)
                else:
                    watch.remove(r)
            if parent is not None and parent in ready and not parent_gone:
                parent_gone = True                   # fsdp-lint itself is gone
                _kill_group(pid)
                watch.remove(parent)
            if sock in ready:
                msg = _recv_msg(sock)
                if msg is None:                      # fsdp-lint itself is gone
                    parent_gone = True
                    _kill_group(pid)
                    watch.remove(sock)
                elif msg[0] == "kill" and msg[1] == job["id"]:
                    _kill_group(pid)
            if (pidfd is None or pidfd in ready) and _exited(pid):
                # the group is killed while the child is a zombie: its number cannot be reused yet
                _kill_group(pid)
                status = os.waitpid(pid, 0)[1]
        chunks += _drain(r)
    finally:
        os.close(r)
        if pidfd is not None:
            os.close(pidfd)
    leftovers = _kill_descendants()
    if parent_gone:
        return False
    try:
        _send_msg(sock, ("done", job["id"], status, _framed_payload(b"".join(chunks)), leftovers))
    except OSError:
        return False
    return True


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


def _framed_payload(raw: bytes) -> bytes:
    """The child's result: 8-byte length + pickle; b"" when it did not write a whole one."""
    if len(raw) < _HEADER.size:
        return b""
    (size,) = _HEADER.unpack(raw[:_HEADER.size])
    body = raw[_HEADER.size:_HEADER.size + size]
    return body if len(body) == size else b""


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
    """Kill every process left below this (subreaper) server, with their process groups; reap them.
    Returns how many processes were killed."""
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
        out = _lint_in_child(job)
        try:
            data = _dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            data = _dumps(("internal", type(exc).__name__, f"cannot send the result: {exc}", ""))
        if _getpid() == me:                          # not a fork the file's code made of this process
            view = memoryview(_pack(data.__len__()) + data)
            while view:
                view = view[_write(w, view):]
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        _exit(code)                                  # no atexit hooks, no waiting for the file's threads


def _lint_in_child(job: dict) -> Tuple:
    import dataclasses
    import traceback

    from fsdp_lint import engine

    facts, settings = job["facts"], job["settings"]
    name = os.path.basename(facts.path)
    try:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        sys.path[:] = job["sys_path"]
        # the deadline is kept from outside (fsdp-lint kills this process group), not by SIGALRM,
        # which the file's code could ignore or use itself
        settings = dataclasses.replace(settings, replay_timeout=None)
        return ("ok", engine.lint_facts(facts, settings))
    except LintError as exc:
        return ("lint_error", str(exc))
    except SystemExit as exc:
        return ("lint_error", f"{name}: the file's code called sys.exit({exc.code!r}) while it was linted")
    except KeyboardInterrupt:
        return ("lint_error", f"{name}: interrupted")
    except BaseException as exc:  # noqa: BLE001 - a bug: the parent says so in one line
        text = str(exc).strip()
        return ("internal", type(exc).__name__, text.splitlines()[0] if text else "", traceback.format_exc())
