"""A failure of project code on a stand-in's value that no recorded use of the stand-in explains.

The uses of a stand-in (for an import that failed) are recorded where they happen; a failure on a line of
its traceback where one happened names the package. Some failures happen where the stand-in is only
read: ``assert init_device in ("meta", "cpu")`` with ``init_device`` from a stand-in's call three lines
above (list membership compares, it does not use), ``super().register(...)`` in a class built on a
stand-in base (``super()`` reads the bases' own attributes, which an empty stand-in class lacks),
``Runner.remote()`` of a class a stand-in decorated (``@ray.remote``). The failing line's values say
so: a stand-in, an object or class built on one, or a class one decorated."""
from __future__ import annotations

from typing import Optional

from fsdp_lint.entry.project import is_local
from fsdp_lint.replay.imports import Missing, StubUse
from fsdp_lint.replay.line_values import named_on_line


def stand_in_on_failing_line(exc: BaseException) -> Optional[StubUse]:
    """The stand-in the innermost project line of `exc`'s traceback works on, as a use there."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        if is_local(tb.tb_frame.f_code.co_filename):
            last = tb
        tb = tb.tb_next
    if last is None:
        return None
    try:
        names = [_stand_in_name(value) for value in named_on_line(last.tb_frame, last.tb_lineno)]
    except Exception:  # noqa: BLE001  an explanation never turns the failure into fsdp-lint's own (a value
        return None    # whose attributes raise)
    name = next((n for n in names if n), None)
    return StubUse(name, last.tb_frame.f_code.co_filename, last.tb_lineno, in_model=False) if name else None


def _stand_in_name(value) -> Optional[str]:
    if isinstance(value, Missing):
        return value._fsdp_lint_name
    own = getattr(value, "__dict__", None)         # (a class's is a mappingproxy, a function's a dict)
    marker = own.get("_fsdp_lint_decorated_by") if callable(value) and hasattr(own, "get") else None
    if isinstance(marker, str):
        return marker          # a class or function a stand-in decorated (`@ray.remote`)
    kind = value if isinstance(value, type) else type(value)
    for base in getattr(kind, "__mro__", ()):
        name = base.__dict__.get("_fsdp_lint_stand_in")
        if isinstance(name, str):
            return name
    return None
