"""What an older torch lacks on a CPU rank, added the way later torch has it (fsdp-lint supports
torch 2.6 and later; ``benchmarks/torch_versions.sh`` runs the checks on each version).

* torch 2.6's ``torch.cpu.Stream`` has no ``record_event``/``wait_event``: FSDP2 records an event on
  its all-gather stream after every collective, so its first forward on CPU raises. Later torch
  (2.9.1 has them) makes both no-ops on CPU (there is one CPU stream and nothing to wait for); here
  they are the same.
* torch 2.6 has no ``torch.distributed._tools.common_utils``: the storage walk the memory tracker
  labels buffers with was ``_WeakRefInfo.get_untyped_storages`` of ``mem_tracker``.
"""
from __future__ import annotations


def _record_event(self, event=None):
    """A CPU event (its methods do nothing), as a CUDA stream returns its recorded event: torch 2.6's
    HSDP asserts the all-reduce's event is not None."""
    import torch.cpu

    return event if event is not None else torch.cpu.Event()


def _wait_event(self, event) -> None:
    return None


def cpu_streams() -> None:
    """``torch.cpu.Stream.record_event``/``wait_event`` where this torch lacks them (2.6)."""
    import torch.cpu

    for name, fn in (("record_event", _record_event), ("wait_event", _wait_event)):
        if not hasattr(torch.cpu.Stream, name):
            setattr(torch.cpu.Stream, name, fn)


def untyped_storages():
    """The memory tracker's storage walk: ``get_untyped_storages(tensor) -> set of storages``."""
    try:
        from torch.distributed._tools.common_utils import get_untyped_storages
    except ImportError:      # torch 2.6: a static method of the tracker's weak-reference record
        from torch.distributed._tools.mem_tracker import _WeakRefInfo

        get_untyped_storages = _WeakRefInfo.get_untyped_storages
    return get_untyped_storages
