"""An exception said in one line, for the one-line error and the notes of skipped statements."""
from __future__ import annotations

import re

from fsdp_lint.replay.network import NotDownloaded

# pydantic's "2 validation errors for Config" heads a list: a field's location on a line of its own, its
# message indented below it
_VALIDATION_HEADER = re.compile(r"^\d+ validation errors? for \S+$")
# a line that says an error, as python prints one (`ValueError: ...`, `torch.OutOfMemoryError: ...`)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?:\([^)]*\))?: ")


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if isinstance(exc, NotDownloaded):
        return first          # fsdp-lint's own text: whole, without the class's name
    if "Traceback (most recent call last)" in text and len(lines) > 2:
        # an error another process raised, with its traceback in the message (a Ray worker's `RayTaskError`,
        # `ray::main_task() (pid=..., ip=...)` then the worker's traceback): its own last line is the cause
        first = f"{first} -- {lines[-1]}"
    elif len(lines) > 1 and _EXCEPTION_LINE.match(lines[-1]) and not _EXCEPTION_LINE.match(first):
        # a header, then the error it reports on a later line (a worker's failure raised again by its caller:
        # `worker::build() (pid=..., ip=...)` then `ValueError: ...`): the error is the cause
        first = f"{first} -- {lines[-1]}"
    elif first.endswith(":") and len(lines) > 1:
        # a wrapper's header ("Failed to import transformers.trainer because of the following error
        # (look up to see its traceback):"): the cause is the next line
        first = f"{first} {lines[1]}"
    elif _VALIDATION_HEADER.match(first) and len(lines) > 1:
        # which fields and why (a README's stale flag: `checkpoint_interval  Extra inputs are not permitted`)
        raw = [line for line in text.splitlines() if line.strip()][1:]
        fields = [(raw[i].strip(), raw[i + 1].strip()) for i in range(len(raw) - 1)
                  if not raw[i].startswith(" ") and raw[i + 1].startswith(" ")]
        if fields:
            first = f"{first}: " + "; ".join(f"{name}: {why.split(' [type=')[0]}" for name, why in fields)
    return f"{type(exc).__name__}: {first[:limit]}" if first else type(exc).__name__
