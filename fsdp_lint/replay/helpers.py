"""The functions the transform calls from the linted code's globals (``__fsdp_lint_skip__``, ...)."""
from __future__ import annotations


class ReplayHelper:
    """A function the transform calls from the linted code's globals (``__fsdp_lint_skip__``, ...).

    It pickles as its name: ``datasets`` fingerprints a ``Dataset.map`` function by pickling it with
    dill, with the globals it reads, by value -- a closure over the replay would take the whole replay
    with it, the meta model included, whose every parameter its tensor pickler turns into a float32
    array (32 GB for an 8B model: the child was killed for memory)."""
    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (_unpickled_helper, (self.name,))


def _unpickled_helper(name: str):
    raise RuntimeError(f"{name} belongs to an fsdp-lint replay and cannot be unpickled")
