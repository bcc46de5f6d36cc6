"""Two lines of a launch script that set variables a launch reads: a ``for`` header around a launch (its first
value: ``for FOLD in {0..4}``) and a file the script sources (``source configs/env.sh``). `fsdp_lint.entry.shell`
reads the script line by line with these."""
from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

from fsdp_lint.entry.bash_words import ShellError, _expand, _expanded_words
from fsdp_lint.entry.launch_files import _resolve

_FOR_IN = re.compile(r"^for\s+([A-Za-z_][A-Za-z0-9_]*)\s+in\s+(.*?)\s*(?:;\s*do)?\s*$", re.S)
_FOR_C = re.compile(r"^for\s*\(\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^;]*);([^;]*);[^)]*\)\)\s*(?:;\s*do)?\s*$")
_RANGE = re.compile(r"^\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?\}$")
_CHOICES = re.compile(r"^\{([^{},]*(?:,[^{},]*)+)\}$")


def loop_header(text: str, env: Dict, positional) -> Optional[Tuple[str, str, str]]:
    """(name, its first value, how many runs) of a ``for NAME in WORDS`` / ``for ((NAME=A; NAME<B; ...))`` header
    whose first value bash decides here (`{0..4}`, `{a,b}`, words, `$(seq 0 4)`), or None."""
    from fsdp_lint.entry.bash_substitutions import arithmetic

    m = _FOR_IN.match(text.strip())
    if m:
        try:
            words = _expanded_words(m.group(2), env, positional)
        except (ValueError, ShellError):
            return None
        if len(words) == 1 and _RANGE.match(words[0]):
            a, b, step = _RANGE.match(words[0]).groups()
            values = list(range(int(a), int(b) + (1 if int(b) >= int(a) else -1),
                                abs(int(step or 1)) * (1 if int(b) >= int(a) else -1)))
            words = [str(v) for v in values]
        elif len(words) == 1 and _CHOICES.match(words[0]):
            words = _CHOICES.match(words[0]).group(1).split(",")
        if not words or "$" in words[0] or "`" in words[0]:
            return None
        return m.group(1), words[0], str(len(words))
    m = _FOR_C.match(text.strip())
    if m:
        first = arithmetic(m.group(2), lambda t: _expand(t, env, positional))
        return None if first is None else (m.group(1), first, "several")
    return None


def sourced_script(words, env: Dict, positional, script: str, cd: Optional[str], depth: int) -> Optional[str]:
    """The project's file a ``source FILE``/``. FILE`` line reads (not an environment's ``activate``), or None."""
    if len(words) < 2 or words[0] not in ("source", ".") or depth >= 4:
        return None
    target = _expand(words[1], env, positional)
    if "$" in target or os.path.basename(target) == "activate":
        return None
    path, _ = _resolve(target, script, cd)
    return path if path is not None and os.path.isfile(path) else None
