"""Edits of configuration files (accelerate's YAML, a JSON fsdp_config, a command-line value in a
launch script): one value replaced where it is written, so that the file's layout, comments and
quoting stay as they are (no YAML/JSON round trip)."""
from __future__ import annotations

import os
import re
from typing import Optional

from fsdp_lint.fix.edits import Edit


def replace_word(path: str, line: int, old: str, new: str) -> Optional[Edit]:
    """`old` replaced by `new` on `line` of `path`, when it occurs there exactly once as a whole word
    (a class name inside a YAML value, a JSON string, a list); None otherwise."""
    if not path or not os.path.isfile(path) or line < 1:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None
    if line > len(lines):
        return None
    hits = [m for m in re.finditer(rf"(?<![\w.]){re.escape(old)}(?!\w)", lines[line - 1])]
    if len(hits) != 1:
        return None
    start, end = hits[0].span()
    return Edit(path, line, start + 1, line, end + 1, new)
