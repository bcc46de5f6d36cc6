"""A fix as plain data: text replacements in the user's files, and whether applying them is safe.

ruff's model: a *safe* fix keeps what the code means apart from the finding (`--fix` applies it); an
*unsafe* one may change behaviour the user relies on -- memory, a class it names -- and is applied
only with `--unsafe-fixes`. Positions are 1-based lines and 1-based columns (as findings are); an
edit replaces [start, end) with `content` (start == end inserts).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List

SAFE = "safe"
UNSAFE = "unsafe"


@dataclass(frozen=True)
class Edit:
    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    content: str

    def to_json(self, display=None) -> dict:
        out = asdict(self)
        if display is not None:
            out["path"] = display(self.path)
        return out


@dataclass
class Fix:
    title: str                       # what applying it does, one line
    applicability: str               # SAFE or UNSAFE
    edits: List[Edit] = field(default_factory=list)

    def to_json(self, display=None) -> dict:
        return {"title": self.title, "applicability": self.applicability,
                "edits": [e.to_json(display) for e in self.edits]}

    def applies(self, unsafe: bool) -> bool:
        return bool(self.edits) and (self.applicability == SAFE or unsafe)
