"""The lint in this process, where ``os.fork`` does not exist (Windows): fsdp-lint's analysis of the
file (tree, plan, layout, rules, once the file's code has run) keeps the limit it has in a child
process (``ANALYSIS_TIMEOUT_S``) and ends with the same message.

A child is killed from outside; here a watchdog thread follows the lint's phases (``engine._phase``)
and, when the analysis has used up its limit, raises ``_AnalysisTimeout`` in the thread running the
lint (``PyThreadState_SetAsyncExc``: at the next bytecode that thread runs, on every platform). It is a
BaseException, so that no ``except Exception`` of the analysis takes it for an error of its own, and
it is raised again each second until the analysis ends. The file's own code (setup, forward) is not
interrupted here: replay-timeout bounds it as before in this process (the replay's own alarm).
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Callable, Optional

from fsdp_lint.engine import FileResult, LintError

_RERAISE_S = 1.0      # the exception again, while the analysis has not ended (something caught it)


class _AnalysisTimeout(BaseException):
    """fsdp-lint's analysis ran past its limit (raised in the linting thread by the watchdog)."""


def _set_async(thread_id: int, exc: Optional[type]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


def run_limited(lint: Callable[[], FileResult], job, message: Callable[[object], str]) -> FileResult:
    """``lint()`` in this thread, its analysis phase limited as in a child process: `job` (an
    ``isolation._Job``) keeps the phases and the deadline, as for a child. Raises LintError with
    ``message(job)`` (one line, the forking path's) when the limit runs out."""
    from fsdp_lint import engine

    lock = threading.Lock()
    state = {"active": True, "fired": False}
    wake = threading.Event()
    target = threading.get_ident()

    def listener(phase: str, info: dict) -> None:
        with lock:
            job.shape.update(info)
            if phase != job.phase:
                job.enter(phase, time.monotonic())
            if state["fired"] and phase != "analysis":
                _set_async(target, None)            # the file's code again: not interrupted here
        wake.set()

    def watch() -> None:
        while True:
            with lock:
                if not state["active"]:
                    return
                now = time.monotonic()
                due = job.deadline if job.phase == "analysis" else None
                if due is not None and due <= now:
                    state["fired"] = True
                    _set_async(target, _AnalysisTimeout)
                    wait = _RERAISE_S
                else:
                    wait = None if due is None else due - now
            wake.wait(wait)
            wake.clear()

    previous = engine._phase_listener
    engine._phase_listener = listener
    job.enter("setup", time.monotonic())
    watchdog = threading.Thread(target=watch, name="fsdp-lint analysis limit", daemon=True)
    watchdog.start()
    timed_out = False
    try:
        try:
            result = lint()
        except _AnalysisTimeout:
            timed_out = True
    finally:
        while True:          # the watchdog stopped and nothing of it pending, whenever it fired
            try:
                with lock:
                    state["active"] = False
                    if state["fired"]:
                        _set_async(target, None)    # one set but not raised yet is cleared
                break
            except _AnalysisTimeout:
                timed_out = True
        wake.set()
        engine._phase_listener = previous
    if timed_out:
        raise LintError(message(job))
    return result

