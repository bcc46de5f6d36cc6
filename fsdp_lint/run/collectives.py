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
            self._saved = None
            self._in_python_collective = False

        def __enter__(self):
            if not fake_collectives_registered():
                self._patch_python_collectives()
            return super().__enter__()

        def __exit__(self, *args):
            try:
                return super().__exit__(*args)
            finally:
                if self._saved is not None:
                    import torch.distributed as dist

                    for name, fn in self._saved.items():
                        setattr(dist, name, fn)
                    self._saved = None

        def _patch_python_collectives(self) -> None:
            """torch 2.6 has no fake kernels for c10d's collectives: under fake tensors its memory
            tracker answers ``dist.all_gather_into_tensor`` & co. itself and they never reach the
            dispatcher. They are counted where they are called (the same bytes), and the dispatch
            below does not count them again."""
            import torch.distributed as dist

            self._saved = {}
            for name, kind in (("all_gather_into_tensor", "all_gather"), ("reduce_scatter_tensor", "reduce_scatter"),
                               ("all_reduce", "all_reduce")):
                original = getattr(dist, name, None)
                if original is None:
                    continue
                self._saved[name] = original
                setattr(dist, name, self._counting(original, kind))

        def _counting(self, original, kind):
            def collective(*args, **kwargs):
                tensors = list(args[:2]) + [kwargs[k] for k in ("output_tensor", "input_tensor", "output", "input",
                                                                 "tensor") if k in kwargs]
                with contextlib.suppress(Exception):
                    out = _nbytes(tensors[0]) if tensors else 0
                    inp = _nbytes(tensors[1]) if kind != "all_reduce" and len(tensors) > 1 else out
                    self._add(kind, out - inp if kind == "all_gather" else inp - out if kind == "reduce_scatter"
                              else out)
                was, self._in_python_collective = self._in_python_collective, True
                try:
                    return original(*args, **kwargs)
                finally:
                    self._in_python_collective = was

            return collective

        def _add(self, kind: str, sent: int) -> None:
            self.data[kind][0] += 1
            self.data[kind][1] += max(0, sent)

        def reset(self) -> None:
            self.data = {"all_gather": [0, 0], "reduce_scatter": [0, 0], "all_reduce": [0, 0], "other": [0, 0]}

        def snapshot(self) -> dict:
            return {k: {"count": v[0], "bytes": v[1]} for k, v in self.data.items()}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ns = getattr(func, "namespace", "")
            if ns in ("c10d", "_c10d_functional", "c10d_functional") and not self._in_python_collective:
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
            self._add(kind, sent)

    return CommCounter()


def fake_collectives_registered() -> bool:
    """Whether this torch gives c10d's collectives fake kernels (their module
    ``torch.distributed._tools.fake_collectives``, which the memory trackers import: torch 2.9.1 and
    later have it, 2.6.0 has not)."""
    import importlib.util

    return importlib.util.find_spec("torch.distributed._tools.fake_collectives") is not None


def _nbytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0
