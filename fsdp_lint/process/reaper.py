"""How fsdp-lint ends: SIGTERM handled as Ctrl-C, and nothing that ``--run`` started outlives it.

* ``sigterm_as_interrupt()``: while fsdp-lint runs, SIGTERM (CI cancellation, ``timeout(1)``,
  ``kill``) raises ``Terminated`` in the main thread; every cleanup that runs for Ctrl-C runs for it
  (``finally`` blocks: rank process groups killed, the lint child stopped), then one line and exit
  code 143 (128 + SIGTERM).
* ``RunGuard``: around ``--run``'s ranks. fsdp-lint becomes a child subreaper
  (``PR_SET_CHILD_SUBREAPER``), so a process a rank starts stays below fsdp-lint even after its
  parent dies or it calls ``setsid()``; when the run ends those are killed. A **watchdog** process
  (in a session of its own, so a signal to fsdp-lint's process group does not reach it) records every
  process below fsdp-lint a few times a second; if fsdp-lint dies without saying goodbye -- SIGKILL,
  the OOM killer -- it kills them all and their process groups. Linux only (``/proc``); elsewhere the
  ranks' own process groups are all that is killed.

The small ``/proc`` helpers here are shared with ``fsdp_lint.isolation``.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

EXIT_TERMINATED = 128 + signal.SIGTERM
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_POLL_S = 0.1


class Terminated(BaseException):
    """SIGTERM arrived; raised like KeyboardInterrupt (not caught by ``except Exception``)."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Turn SIGTERM into `Terminated` in the main thread while the block runs (then restore)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a second SIGTERM must not cut the cleanup short
        raise Terminated()

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# ============================================================================================
# /proc
# ============================================================================================
def _stat(pid: int) -> Optional[Tuple[int, int, int]]:
    """(ppid, pgid, starttime) of a live process, None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def process_table() -> Dict[int, Tuple[int, int, int]]:
    """pid -> (ppid, pgid, starttime) of every live process (empty where there is no /proc)."""
    out: Dict[int, Tuple[int, int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = st
    return out


def children(pid: int, table: Optional[Dict[int, Tuple[int, int, int]]] = None) -> List[int]:
    table = process_table() if table is None else table
    return [p for p, (ppid, _, _) in table.items() if ppid == pid]


def descendants(pid: int, table: Optional[Dict[int, Tuple[int, int, int]]] = None) -> List[int]:
    table = process_table() if table is None else table
    below: Dict[int, List[int]] = {}
    for p, (ppid, _, _) in table.items():
        below.setdefault(ppid, []).append(p)
    out, todo = [], list(below.get(pid, ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(below.get(p, ()))
    return out


def kill_processes(pids: Iterable[int], spare_groups: Iterable[int] = ()) -> None:
    """SIGKILL each process and its process group (unless the group is in `spare_groups`)."""
    spare = set(spare_groups)
    for pid in pids:
        with contextlib.suppress(OSError):
            pg = os.getpgid(pid)
            if pg not in spare:
                os.killpg(pg, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def prctl(option: int, value: int = 0) -> Optional[int]:
    """libc prctl; None where it is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0)
    except Exception:  # noqa: BLE001
        return None


def _is_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
        return bool(flag.value)
    except Exception:  # noqa: BLE001
        return False


# ============================================================================================
# --run: subreaper + watchdog
# ============================================================================================
class RunGuard:
    """``with RunGuard(): <start ranks, wait, kill their groups>``: on the way out (normal, error,
    Ctrl-C, SIGTERM) every process the ranks started is killed too; if fsdp-lint is killed outright,
    the watchdog does it."""

    def __init__(self, spare: Iterable[int] = ()):
        self.spare = set(spare)
        self.before: Set[int] = set()
        self.was_subreaper = False
        self.watchdog: Optional[subprocess.Popen] = None

    def __enter__(self) -> "RunGuard":
        if not sys.platform.startswith("linux"):
            return self
        self.before = set(children(os.getpid()))
        self.was_subreaper = _is_subreaper()
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
        with contextlib.suppress(Exception):
            self.watchdog = subprocess.Popen(
                [sys.executable, "-c", "import sys; from fsdp_lint.process.reaper import watch; watch(int(sys.argv[1]))",
                 str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True)
        return self

    def __exit__(self, *exc) -> None:
        if not sys.platform.startswith("linux"):
            return
        keep = self.before | self.spare | _long_lived_helpers()
        if self.watchdog is not None:
            keep.add(self.watchdog.pid)
        # whatever the ranks left behind was reparented to this process (the subreaper)
        for _ in range(50):
            left = [p for p in children(os.getpid()) if p not in keep]
            if not left:
                break
            kill_processes(left, spare_groups={os.getpgid(0)})
            for pid in left:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, 0)
        if not self.was_subreaper:
            prctl(_PR_SET_CHILD_SUBREAPER, 0)
        if self.watchdog is not None:
            with contextlib.suppress(Exception):
                self.watchdog.stdin.write(b"bye\n")
                self.watchdog.stdin.close()
            with contextlib.suppress(Exception):
                self.watchdog.wait(timeout=10)
            if self.watchdog.poll() is None:
                with contextlib.suppress(Exception):
                    self.watchdog.kill()
                    self.watchdog.wait(timeout=5)


# processes of this one that outlive a run by design and say so here (the lint fork server, through
# `spare`): what owns them registers them, so this low-level module needs to know none of its users
_SPARED: List[Callable[[], Optional[int]]] = []


def spare(pid_of: Callable[[], Optional[int]]) -> None:
    """Never kill the process `pid_of()` names (None: none now) when a run is cleaned up."""
    _SPARED.append(pid_of)


def _long_lived_helpers() -> Set[int]:
    """Processes of this one that outlive a run by design: those registered with `spare` (the lint
    fork server), multiprocessing's resource tracker and fork server (started by a spawn-method run)."""
    out: Set[int] = set()
    for pid_of in _SPARED:
        with contextlib.suppress(Exception):
            pid = pid_of()
            if pid:
                out.add(pid)
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        if resource_tracker._resource_tracker._pid:
            out.add(resource_tracker._resource_tracker._pid)
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver

        if forkserver._forkserver._forkserver_pid:
            out.add(forkserver._forkserver._forkserver_pid)
    return out


def watch(parent: int) -> None:
    """The watchdog's body: record the processes below `parent`; when it dies without writing
    "bye" on our stdin, kill them and their process groups."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = os.getpid()
    known: Dict[int, Tuple[int, int]] = {}           # pid -> (pgid, starttime)
    pidfd = None
    with contextlib.suppress(Exception):
        pidfd = os.pidfd_open(parent)
    stdin = sys.stdin.buffer
    watch_fds: List = [stdin] + ([pidfd] if pidfd is not None else [])
    while True:
        if os.getppid() != parent:
            break                                     # reparented: the parent is gone
        table = process_table()
        for pid in descendants(parent, table):
            if pid != me:
                _, pgid, start = table[pid]
                known[pid] = (pgid, start)
        ready = select.select(watch_fds, [], [], _POLL_S)[0]
        if stdin in ready:
            line = stdin.readline()
            if line.strip() == b"bye":
                return
            if not line:
                watch_fds.remove(stdin)               # EOF alone proves nothing: ranks may hold it
        if pidfd is not None and pidfd in ready:
            break
    # the parent died: its descendants are now orphans (or dying by PR_SET_PDEATHSIG)
    for _ in range(20):
        table = process_table()
        alive = [pid for pid, (pgid, start) in known.items()
                 if pid in table and table[pid][2] == start]
        groups = {pgid for pid, (pgid, start) in known.items()} - {os.getpgid(0)}
        for pg in groups:
            with contextlib.suppress(OSError):
                os.killpg(pg, signal.SIGKILL)
        # and whatever they started since the last look
        extra = [p for pid in alive for p in descendants(pid, table)]
        kill_processes(alive + extra, spare_groups={os.getpgid(0)})
        for p in extra:
            known.setdefault(p, (table[p][1], table[p][2]))
        if not alive and not extra:
            break
        time.sleep(0.05)
