"""Failures the script's own ``except`` catches: ``try: main(args) except Exception: logger.error(...)``.

A handler of the script's (an ``except`` of a ``try`` the replay runs as written) first tells the replay what
it caught (the transform puts a call of `CAUGHT` at the top of the handler). Two things follow from it:

* the model failed to build and the handler swallowed it (a block's ``__init__`` imports a CUDA-only package
  this machine lacks): when the setup then wraps nothing, that failure is the cause, not a plan suggested for
  the half-built model (`caught_before_wrap`);
* the wrap ran inside the very call the handler guards -- an installed trainer's ``main()`` that builds, wraps
  and then reads its data -- and what failed after it is something this machine lacks (a data file, the
  network, a package): on the node that call goes on to train, so training starts there (`after_wrap_boundary`)
  and what the script does after the handler (collect the stats training writes) is not run.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from fsdp_lint.replay.records import NoModelError, TrainingBoundary, exception_chain, traceback_frames


def lacks_here(exc: BaseException) -> bool:
    """A failure for what the simulated node lacks: a file or folder, the network, a download, a package."""
    from fsdp_lint.replay.network import NetworkWait

    return any(isinstance(e, (OSError, ImportError, NetworkWait)) for e in exception_chain(exc))


def after_wrap_boundary(run, exc: BaseException) -> None:
    """Raise `TrainingBoundary` when the handler caught, from the library call its ``try`` made, a failure for
    what this machine lacks, after that call wrapped the model (see the module's text)."""
    rec = run.rec
    if not rec.wrap_calls or rec.stopped is not None or not lacks_here(exc):
        return
    frames = traceback_frames(exc)
    if len(frames) < 2 or rec.is_project_file(frames[-1][0].f_code.co_filename):
        return                  # raised by the project's own code: the replay's own skips decide it
    here = (os.path.abspath(frames[0][0].f_code.co_filename), frames[0][1])
    if not any(here in ((w.pos.path, w.pos.line),
                        (getattr(w.pos.via, "path", None), getattr(w.pos.via, "line", None)))
               for w in rec.wrap_calls):
        return
    from fsdp_lint.replay.one_line import one_line

    shown = f"{run.display if here[0] == run.path else os.path.relpath(here[0])}:{here[1]}"
    reason = (f"{shown} wrapped the model, then failed on what this machine lacks ({one_line(exc)[:160]}) and the "
              f"script's `except` caught it: on a node, training starts there")
    rec.stopped = (reason, rec.wrap_calls[-1].pos)
    # (said in the report too: on a node without that data the job stops there, which the plan does not show)
    rec.__dict__.setdefault("framework_notes", []).append(f"the setup's end: {reason}")
    raise TrainingBoundary(reason)


def caught_before_wrap(run) -> Optional[NoModelError]:
    """The setup wrapped nothing, and the script's own handler had caught a failure raised while a model was
    built: that failure, in one line, instead of a plan suggested for what was half built."""
    from fsdp_lint.replay.failures import _in_model_init, package_hint
    from fsdp_lint.replay.import_errors import _innermost_project_line
    from fsdp_lint.replay.one_line import one_line

    if run.rec.wrap_calls or run.override is not None or not run.project.wrap_paths:
        return None
    for exc, path, line in run.failures.caught:
        if not any(_in_model_init(frame) for frame, _ in traceback_frames(exc)):
            continue
        failed = _innermost_project_line(exc)
        where = f"{_shown(run, failed[0])}:{failed[1]}: " if failed else ""
        msg = one_line(exc)
        err = NoModelError(f"{run.display}: the setup never reached its wrap code: the model failed to build -- "
                           f"{where}{msg}{package_hint(exc, msg)} -- and the script's `except` at "
                           f"{_shown(run, path)}:{line} caught it")
        err.user_exception = exc
        return err
    return None


def _shown(run, path: str) -> str:
    return run.display if os.path.abspath(path) == run.path else os.path.relpath(path)


_KEPT = 64


def caught_helper(run):
    """The `CAUGHT` helper of transformed code: record what the handler it starts caught."""
    def caught():
        exc = sys.exc_info()[1]
        if exc is None or run.finished or not isinstance(exc, Exception):
            return
        frame = sys._getframe(2)
        if len(run.failures.caught) < _KEPT:        # (a retry loop catches thousands: the first ones say why)
            run.failures.caught.append((exc, frame.f_code.co_filename, frame.f_lineno))
        if run.rec.wrap_calls:
            run.failures.caught_after_wrap = (exc, frame.f_code.co_filename, frame.f_lineno)
        after_wrap_boundary(run, exc)
    return caught
