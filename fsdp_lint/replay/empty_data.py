"""A project data set left empty because the statement that would have filled it was skipped.

``self.samples = []`` then ``self.samples += json.load(open(annotation))`` in ``__init__``: the annotation
file is on the node only, the statement is skipped, and ``__len__`` answers 0 -- a sampler then raises
(``num_samples=0``) where the node's run goes on. Like a ``__len__`` that fails for the same reason
(`Failures.standin_length`), the length is the stand-in data sets' when a statement of the data set's own
methods (run with it as ``self``) was skipped; a data set that is empty on a node too (nothing of it was
skipped) answers 0.
"""
from __future__ import annotations

from fsdp_lint.replay.data_standins import length_stood_in
from fsdp_lint.replay.failures import STANDIN_LENGTH


def empty_length(failures, length, frame, over: bool = False):
    """`length`, what ``__len__`` of `frame` returned; the stand-in length for 0 after a skip in the data set."""
    if over or type(length) is not int or length != 0:
        return length
    dataset = frame.f_locals.get("self")
    if dataset is None:
        return length
    cause = next((s for s in reversed(failures.skips)
                  if s.frame is not None and _self_of(s.frame) is dataset), None)
    if cause is None:
        return length
    note = f" (its data set's length stands in as {STANDIN_LENGTH})"
    if note not in cause.skipped.error:
        cause.skipped.error += note
    length_stood_in(dataset)
    return STANDIN_LENGTH


def _self_of(frame):
    try:
        return frame.f_locals.get("self")
    except Exception:  # noqa: BLE001  (a frame whose locals cannot be read)
        return None
