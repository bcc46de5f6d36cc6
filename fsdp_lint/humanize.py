"""Sizes, counts, paths and unit names as people read them: shared by the rules (messages) and the
report (tables), so that both say 4.73 MB, 3.15M and (root) the same way."""
from __future__ import annotations

import os
from typing import Optional


def display_path(path: str, base: Optional[str] = None) -> str:
    base = base or os.getcwd()
    ap = os.path.abspath(path)
    try:
        rel = os.path.relpath(ap, base)
    except ValueError:
        return ap
    return ap if rel.startswith("..") else rel.replace(os.sep, "/")


def human_count(n: int) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}" if n / div < 100 else f"{n / div:.0f}{suffix}"
    return str(n)


def human_bytes(n: int) -> str:
    for div, suffix in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}" if n / div < 100 else f"{n / div:.0f} {suffix}"
    return f"{n} B"


def unit_label(module: str) -> str:
    return module if module else "(root)"


def exact_count(n: int) -> str:
    """An exact count, readable: 788,096."""
    return f"{n:,}"
