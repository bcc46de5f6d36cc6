"""``# noqa`` comments, read from a module's text: the line and the codes each one suppresses."""
from __future__ import annotations

import re
from typing import Dict, Optional, Set

_NOQA = re.compile(r"#\s*noqa\b(?P<colon>\s*:)?(?P<rest>.*)", re.IGNORECASE)
_NOQA_CODE = re.compile(r"[A-Za-z]+[0-9]+")


def _noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    """line -> the codes its ``# noqa: FSD201, FSD3`` suppresses (None: a bare ``# noqa``, all).
    As ruff does, a ``# noqa:`` not followed by codes (letters then digits: ``# noqa: see below``,
    ``# noqa:``) suppresses nothing."""
    out: Dict[int, Optional[Set[str]]] = {}
    if "noqa" not in text.lower():
        return out
    for i, line in enumerate(text.splitlines(), start=1):
        m = _NOQA.search(line)
        if not m:
            continue
        if not m.group("colon"):
            out[i] = None
            continue
        codes: Set[str] = set()
        for token in re.split(r"[\s,]+", m.group("rest").strip()):
            if not _NOQA_CODE.fullmatch(token):
                break                       # the codes end where the explanation starts
            codes.add(token.upper())
        if codes:
            out[i] = codes
    return out
