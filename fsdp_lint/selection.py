"""Which rules run: --select/--ignore/--extend-select (prefixes, ALL), per-file-ignores, noqa."""
from __future__ import annotations

import fnmatch
import os
from typing import Iterable, List

from fsdp_lint.config import ConfigError, Settings


def _matches(code: str, selectors: Iterable[str]) -> int:
    """Length of the longest selector matching `code` (0 = none); ALL matches with length 1."""
    best = 0
    for sel in selectors:
        sel = sel.strip().upper()
        if sel == "ALL":
            best = max(best, 1)
        elif code.startswith(sel):
            best = max(best, len(sel) + 1)
    return best


def check_selectors(selectors: Iterable[str], known: List[str], origin: str) -> None:
    for sel in selectors:
        s = sel.strip().upper()
        if s == "ALL":
            continue
        if not s.startswith("FSD") or not any(code.startswith(s) for code in known):
            raise ConfigError(f"{origin}: unknown rule selector {sel!r} (codes are FSD101..FSD601; see --list-rules)")


def rule_enabled(code: str, settings: Settings, path: str) -> bool:
    selected = _matches(code, list(settings.select) + list(settings.extend_select))
    if not selected:
        return False
    ignored = _matches(code, settings.ignore)
    for pattern, codes in (settings.per_file_ignores or {}).items():
        if _path_matches(path, pattern, settings):
            ignored = max(ignored, _matches(code, codes))
    # ruff's rule: the more specific selector wins; ties go to ignore
    return selected > ignored


def _path_matches(path: str, pattern: str, settings: Settings) -> bool:
    base = os.path.dirname(settings.config_path) if settings.config_path else os.getcwd()
    rel = os.path.relpath(os.path.abspath(path), base).replace(os.sep, "/")
    return fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(os.path.basename(path), pattern)


def suppressed(finding, facts) -> bool:
    """`# noqa` or `# noqa: FSD201` on the reported line."""
    if facts is None or os.path.abspath(finding.path) != os.path.abspath(facts.path):
        return False
    codes = facts.noqa.get(finding.line, False)
    if codes is False:
        return False
    return codes is None or any(finding.code.startswith(c) for c in codes)
