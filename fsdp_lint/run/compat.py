"""What an older torch lacks on a CPU rank, added the way later torch has it (fsdp-lint supports
torch 2.6 and later; ``benchmarks/torch_versions.sh`` runs the checks on each version).

* torch 2.6's ``torch.cpu.Stream`` has no ``record_event``/``wait_event``: FSDP2 records an event on
  its all-gather stream after every collective, so its first forward on CPU raises. Later torch
  (2.9.1 has them) makes both no-ops on CPU (there is one CPU stream and nothing to wait for); here
  they are the same.
* torch 2.7's ``record_event`` on CPU is such a no-op but returns nothing, and its HSDP backward asserts
  that the all-reduce's event is not None (2.8 asserts it only off CPU): there it returns a CPU event
  to FSDP2's ``foreach_reduce`` only (an all-gather's event is waited on through ``torch.accelerator``,
  which on a CUDA build without a GPU initialises CUDA).
* torch 2.6 has no ``torch.distributed._tools.common_utils``: the storage walk the memory tracker
  labels buffers with was ``_WeakRefInfo.get_untyped_storages`` of ``mem_tracker``.
"""
from __future__ import annotations


def _record_event(self, event=None):
    """A CPU event (its methods do nothing), as a CUDA stream returns its recorded event: torch 2.6's
    and 2.7's HSDP assert the all-reduce's event is not None."""
    import torch.cpu

    return event if event is not None else torch.cpu.Event()


def _record_event_for_reduce(self, event=None):
    """torch 2.7's no-op, except to FSDP2's ``foreach_reduce``, which gets a CPU event."""
    import sys

    if sys._getframe(1).f_code.co_name == "foreach_reduce":
        return _record_event(self, event)
    return None


def _wait_event(self, event) -> None:
    return None


def cpu_stream_patches() -> dict:
    """What ``torch.cpu.Stream`` needs on this torch, as ``{name: function}``: the methods 2.6 lacks,
    and 2.7's ``record_event``, whose ``None`` its HSDP backward refuses."""
    import torch
    import torch.cpu

    patches = {name: fn for name, fn in (("record_event", _record_event), ("wait_event", _wait_event))
               if not hasattr(torch.cpu.Stream, name)}
    if "record_event" not in patches and torch_release() < (2, 8):
        patches["record_event"] = _record_event_for_reduce
    return patches


def torch_release() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def cpu_streams() -> None:
    """``torch.cpu.Stream`` as later torch has it (see :func:`cpu_stream_patches`), for this process."""
    import torch.cpu

    for name, fn in cpu_stream_patches().items():
        setattr(torch.cpu.Stream, name, fn)


def untyped_storages():
    """The memory tracker's storage walk: ``get_untyped_storages(tensor) -> set of storages``."""
    try:
        from torch.distributed._tools.common_utils import get_untyped_storages
    except ImportError:      # torch 2.6: a static method of the tracker's weak-reference record
        from torch.distributed._tools.mem_tracker import _WeakRefInfo

        get_untyped_storages = _WeakRefInfo.get_untyped_storages
    return get_untyped_storages
