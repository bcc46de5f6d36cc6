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


# Sizes print in the units the user's size settings use (gpu-memory, cuda-context-memory, nccl-memory,
# in that order; the first one set decides): SI (kB, MB, GB, TB) when none is set or it is written in SI
# units or as plain bytes; IEC (KiB, MiB, GiB, TiB) when it is written in IEC units, and then never in a
# unit larger than the one written (`81920MiB`: the peak reads `47,684 MiB`, comparable with the setting).
_SI = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
_IEC = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
_size_units = _SI
SIZE_SETTINGS = ("gpu_memory", "cuda_context_memory", "nccl_memory")


def size_units_of(settings) -> tuple:
    """The units sizes print in for these settings (see above)."""
    import re

    for name in SIZE_SETTINGS:
        value = getattr(settings, name, None)
        if isinstance(value, str) and value.strip():
            m = re.fullmatch(r"\s*[0-9.]+\s*([a-zA-Z]*)\s*", value)
            unit = (m.group(1) if m else "").lower()
            if unit in ("kib", "mib", "gib", "tib"):
                largest = {"kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"}[unit]
                return tuple(u for u in _IEC if u[0] <= dict((s, d) for d, s in _IEC)[largest])
            return _SI
    return _SI


def use_size_units(settings) -> None:
    """Print sizes in the units of `settings` from now on (the engine calls it per file, the CLI before
    it renders)."""
    global _size_units
    _size_units = size_units_of(settings)


def human_bytes(n: int) -> str:
    units = _size_units
    for div, suffix in units:
        if abs(n) >= div:
            value = n / div
            if units is not _SI and div == units[0][0] and value >= 1000:
                return f"{value:,.0f} {suffix}"       # the largest unit the user wrote: no larger one
            return f"{value:.3g} {suffix}" if value < 100 else f"{value:.0f} {suffix}"
    return f"{n} B"


def unit_label(module: str) -> str:
    return module if module else "(root)"


def exact_count(n: int) -> str:
    """An exact count, readable: 788,096."""
    return f"{n:,}"
