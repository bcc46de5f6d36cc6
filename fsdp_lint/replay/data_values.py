"""Python values read from tensors that have no data here (meta tensors; fake tensors under
``FakeTensorMode`` in ``--simulate``), during setup.

Setup code reads scalars from tensors: ``x.item()``, ``.tolist()``, ``bool(t)`` / ``if (t > 0).any():``,
``int(t.max())``; libraries do too -- ``nn.init.trunc_normal_`` redraws until ``mask.any()`` is False,
``resize_token_embeddings`` checks ``positive_definite.check(covariance).all()`` before sampling the new
rows. On a real node these read a value; on meta torch raises "cannot be called on meta tensors", and a
fake tensor raises ``DataDependentOutputException``. Initial values never change a plan, so each of
these reads answers a neutral value -- zero: ``0`` / ``0.0`` / ``False`` for ``.item()``, ``int()``,
``float()``, ``bool()`` and ``operator.index()``, zeros of the tensor's shape for ``.tolist()`` and
``.numpy()`` -- and the replay notes the line that read it. The real call is tried first: a tensor
with data (a CPU tensor, a fake tensor made from a constant) answers its own value, and a read that
would fail on a real node too (``bool()`` of a tensor of many elements) raises as it would there.

A shape computed from such a value (``torch.empty(int(n))``) is a shape the data decides; the note
names the line, so that a plan built with it is not taken for the job's.
"""
from __future__ import annotations

import os
from typing import Any, Optional


def _zero_of(tensor) -> Any:
    if tensor.dtype.is_complex:
        return 0j
    if tensor.dtype.is_floating_point:
        return 0.0
    if str(tensor.dtype) == "torch.bool":
        return False
    return 0


def _zeros_list(tensor) -> Any:
    zero = _zero_of(tensor)
    shape = list(tensor.shape)
    if not shape:
        return zero

    def build(dims):
        if len(dims) == 1:
            return [zero] * dims[0]
        return [build(dims[1:]) for _ in range(dims[0])]
    return build(shape)


def _zeros_array(tensor) -> Any:
    import numpy
    import torch

    dtype = torch.empty((), dtype=tensor.dtype, device="cpu").numpy().dtype
    return numpy.zeros(tuple(tensor.shape), dtype=dtype)


_ANSWERS = {
    "item": _zero_of,
    "tolist": _zeros_list,
    "__bool__": lambda t: False,
    "__int__": lambda t: 0,
    "__index__": lambda t: 0,
    "__float__": lambda t: 0.0,
    "__complex__": lambda t: 0j,
    "numpy": lambda t: _zeros_array(t),
}
_SPELLING = {"item": ".item()", "tolist": ".tolist()", "__bool__": "bool()", "__int__": "int()",
             "__index__": "an index", "__float__": "float()", "__complex__": "complex()",
             "numpy": ".numpy()"}


def reads_a_value(func) -> Optional[str]:
    """The name of the tensor read `func` is (``"item"``, ``"__bool__"``), or None."""
    import torch

    name = getattr(func, "__name__", None)
    if name in _ANSWERS and getattr(torch.Tensor, name, None) is func:
        return name
    return None


def _has_no_data(tensor) -> bool:
    if getattr(tensor, "is_meta", False):
        return True
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:      # pragma: no cover - every supported torch has it
        return False
    return isinstance(tensor, FakeTensor)


def _is_no_data_error(exc: BaseException) -> bool:
    kind = type(exc).__name__
    if kind in ("DataDependentOutputException", "DynamicOutputShapeException", "GuardOnDataDependentSymNode"):
        return True
    text = str(exc)
    return "meta" in text or "no data" in text


def read_value(name: str, func, args, kwargs, rec) -> Any:
    """Call the read; on a tensor with no data here, answer the neutral value (and note the line)."""
    try:
        return func(*args, **kwargs)
    except Exception as exc:
        tensor = args[0] if args else None
        if tensor is None or not _has_no_data(tensor) or not _is_no_data_error(exc):
            raise
        if name == "__bool__" and tensor.numel() != 1:
            raise           # ambiguous on a real node too
        value = _ANSWERS[name](tensor)
        _note(rec, name, value)
        return value


def _note(rec, name: str, value) -> None:
    pos = rec.position()
    where = f"{os.path.basename(pos.path)}:{pos.line}" if pos.line else os.path.basename(pos.path)
    shown = "zeros" if name in ("tolist", "numpy") else repr(value)
    text = (f"{where}: {_SPELLING[name]} of a tensor that has no data here (meta) answered {shown}: values read "
            f"from tensors during setup answer zero; a shape computed from one would be the data's")
    seen = rec.__dict__.setdefault("_data_value_lines", set())
    if (pos.path, pos.line) in seen:
        return
    seen.add((pos.path, pos.line))
    notes = rec.__dict__.setdefault("framework_notes", [])
    notes.append(text)
