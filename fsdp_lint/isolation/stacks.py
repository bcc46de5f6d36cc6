"""Where a file's code was when its deadline ran out: the lint child's stacks, read before it is killed.

The child registers :mod:`faulthandler` on a real-time signal (not SIGUSR1, which training code and
Lightning's SLURM requeue handler take for themselves) to dump every thread's stack into a file the
fork server holds. At the deadline the server sends the signal, waits a moment for the dump, then
kills the child; the timeout message names the innermost line of the project's own code on the thread
that runs the replay, and the library call it was inside (a lock, a socket, a data set's download).
faulthandler writes from C, so a thread blocked in a C call (a lock, ``recv``) is dumped too.
"""
from __future__ import annotations

import os
import re
import signal
import time
from typing import List, Optional, Tuple

DUMP_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


def register(fd: int) -> None:
    """In the child: dump every thread's stack into `fd` on :data:`DUMP_SIGNAL`."""
    import faulthandler

    if DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=fd, all_threads=True)


def read_dump(pid: int, fd: int, wait_s: float = 1.0) -> str:
    """In the fork server: ask the child `pid` for its stacks and read what it wrote into `fd`."""
    if DUMP_SIGNAL is None:
        return ""
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return ""
    size, end = -1, time.monotonic() + wait_s
    while time.monotonic() < end:              # until the dump stops growing
        time.sleep(0.05)
        now = os.fstat(fd).st_size
        if now == size and now > 0:
            break
        size = now
    return os.pread(fd, 1 << 16, 0).decode("utf-8", "replace")


def _threads(dump: str) -> List[List[Tuple[str, int, str]]]:
    """The dump's threads, each its frames most recent first: (file, line, function)."""
    threads: List[List[Tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return threads


def _library_display(path: str) -> str:
    norm = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in norm:
            return norm.split(marker, 1)[1]
    return os.path.basename(path)


def waiting_at(dump: str, is_project) -> Optional[str]:
    """``at train.py:57 (main), inside datasets/load.py:1402 (load_dataset)``: the innermost frame of
    the project's code on the replay's thread and the call below it, or None when the dump has none."""
    replay = "/fsdp_lint/replay/"
    threads = [t for t in _threads(dump) if t]
    if not threads:
        return None
    main = next((t for t in threads if any(replay in f.replace("\\", "/") for f, _, _ in t)), threads[0])
    own = [i for i, (f, _, _) in enumerate(main) if is_project(f)]
    if not own:
        return None
    path, line, func = main[own[0]]
    text = f"at {os.path.relpath(path) if not os.path.relpath(path).startswith('..') else path}:{line} ({func})"
    # the call it was inside: the innermost frame that is not fsdp-lint's own (a stand-in, a recorder)
    inside = [f for f in main[:own[0]] if "/fsdp_lint/" not in f[0].replace("\\", "/")]
    if inside:
        lib_path, lib_line, lib_func = inside[0]
        text += f", inside {_library_display(lib_path)}:{lib_line} ({lib_func})"
    return text
