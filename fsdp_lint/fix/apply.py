"""`--fix` / `--diff`: the findings' fixes applied to the files, after the report's findings are known.

A fix is applied whole or not at all; of two fixes whose edits overlap, the first (file order) wins
and the other stays a remaining finding (a second `--fix` run applies it on the new text). A file
whose fixed text no longer parses (Python) is left as it was; a configuration file's edit replaces one
value where it is written.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from fsdp_lint.fix.codemods import apply_to_text
from fsdp_lint.fix.edits import Edit


@dataclass
class FixOutcome:
    fixed: List[object] = field(default_factory=list)     # the findings whose fix was applied
    changed: Dict[str, Tuple[str, str]] = field(default_factory=dict)   # path -> (before, after)
    hidden_unsafe: int = 0                                # unsafe fixes not applied (no --unsafe-fixes)

    def diff(self, display=lambda p: p) -> str:
        out = []
        for path, (before, after) in sorted(self.changed.items()):
            name = display(path)
            out.extend(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                            fromfile=f"a/{name}", tofile=f"b/{name}"))
        return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def plan_fixes(findings, unsafe: bool) -> FixOutcome:
    """The fixes that apply to `findings` and the fixed text of each file (nothing is written)."""
    out = FixOutcome()
    taken: Dict[str, List[Edit]] = {}
    for f in findings:
        fix = getattr(f, "fix_edits", None)
        if fix is None or not fix.edits:
            continue
        if not fix.applies(unsafe):
            out.hidden_unsafe += 1
            continue
        # the same edit from two findings (one keyword for several units) is made once, for both
        new = [e for e in fix.edits if e not in taken.get(os.path.abspath(e.path), ())]
        if any(_overlap(e, other) for e in new for other in taken.get(os.path.abspath(e.path), ())):
            continue
        for e in new:
            taken.setdefault(os.path.abspath(e.path), []).append(e)
        out.fixed.append(f)
    for path, edits in taken.items():
        try:
            with open(path, encoding="utf-8") as fh:
                before = fh.read()
        except OSError:
            continue
        after = apply_to_text(before, edits)
        if after != before and (not path.endswith(".py") or _parses(after)):
            out.changed[path] = (before, after)
    broken = {p for p in taken if p not in out.changed}
    out.fixed = [f for f in out.fixed if not any(os.path.abspath(e.path) in broken for e in f.fix_edits.edits)]
    return out


def write(outcome: FixOutcome) -> None:
    for path, (_, after) in outcome.changed.items():
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(after)


def _overlap(a: Edit, b: Edit) -> bool:
    if os.path.abspath(a.path) != os.path.abspath(b.path):
        return False
    a0, a1 = (a.line, a.col), (a.end_line, a.end_col)
    b0, b1 = (b.line, b.col), (b.end_line, b.end_col)
    if a0 == a1 == b0 == b1:
        return True        # two insertions at one place: their order would be arbitrary
    return a0 < b1 and b0 < a1


def _parses(text: str) -> bool:
    import libcst as cst

    try:
        cst.parse_module(text)
        return True
    except Exception:  # noqa: BLE001 - libcst's ParserSyntaxError and its relatives
        return False
