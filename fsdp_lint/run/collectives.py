"""Counting the c10d collectives a step issues (a dispatch mode), with the bytes one rank sends."""
from __future__ import annotations

import contextlib



def comm_counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CommCounter(TorchDispatchMode):
        """Counts c10d collectives issued while it is active; bytes are what one rank sends
        (all-gather: output - input; reduce-scatter: input - output; all-reduce: the tensor)."""

        def __init__(self):
            super().__init__()
            self.reset()

        def reset(self) -> None:
            self.data = {"all_gather": [0, 0], "reduce_scatter": [0, 0], "all_reduce": [0, 0], "other": [0, 0]}

        def snapshot(self) -> dict:
            return {k: {"count": v[0], "bytes": v[1]} for k, v in self.data.items()}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ns = getattr(func, "namespace", "")
            if ns in ("c10d", "_c10d_functional", "c10d_functional"):
                with contextlib.suppress(Exception):
                    self._record(func, args)
            return func(*args, **kwargs)

        def _record(self, func, args) -> None:
            name = func.__name__ if hasattr(func, "__name__") else str(func)
            name = str(func).split(".")[1] if "." in str(func) else name
            if name.startswith(("wait", "barrier", "monitored_barrier")):
                return
            functional = getattr(func, "namespace", "") != "c10d"
            if "gather" in name and "all" in name:
                kind = "all_gather"
            elif "reduce_scatter" in name:
                kind = "reduce_scatter"
            elif "allreduce" in name or "all_reduce" in name:
                kind = "all_reduce"
            else:
                kind = "other"
            if functional:
                inp = _nbytes(args[0]) if args else 0
                size = next((a for a in args[1:] if isinstance(a, int)), 1)
                out = inp * size if kind == "all_gather" else (inp // max(1, size) if kind == "reduce_scatter" else inp)
            else:
                out = _nbytes(args[0]) if args else 0
                inp = _nbytes(args[1]) if len(args) > 1 else out
            if kind == "all_gather":
                sent = out - inp
            elif kind == "reduce_scatter":
                sent = inp - out
            else:
                sent = out
            self.data[kind][0] += 1
            self.data[kind][1] += max(0, sent)

    return CommCounter()


def _nbytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0
