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
            raise ConfigError(f"{origin}: unknown rule selector {sel!r} (codes are {code_ranges(known)}; "
                              f"see --list-rules)")


def code_ranges(codes: Iterable[str]) -> str:
    """`FSD101-FSD105, FSD201-FSD204, FSD301-FSD302, ...`: every code family, first to last."""
    families: dict = {}
    for code in sorted(set(codes)):
        families.setdefault(code[:4], []).append(code)
    return ", ".join(f"{c[0]}-{c[-1]}" if len(c) > 1 else c[0] for c in families.values())


def codes_from_module_names() -> List[str]:
    """Rule codes read from the module names under ``fsdp_lint.rules`` (``fsd301_missing_root_wrap``),
    without importing the rules (a rule module may import torch)."""
    import pkgutil
    import re

    import fsdp_lint.rules as pkg

    codes = []
    for info in pkgutil.iter_modules(pkg.__path__):
        m = re.match(r"fsd(\d{3})(?:_|$)", info.name, re.IGNORECASE)
        if m:
            codes.append("FSD" + m.group(1))
    return codes


def _layers(settings: Settings):
    """(select or None, extend_select, ignore, origin) per layer: the config's, then the command line's."""
    yield (list(settings.select) if settings.select is not None else None, list(settings.extend_select),
           list(settings.ignore), "")
    cli = settings.cli_selection
    if cli:
        yield (list(cli["select"]) if cli.get("select") else None, list(cli.get("extend_select") or ()),
               list(cli.get("ignore") or ()), "--")


def check_all_selectors(settings: Settings) -> None:
    """Raise ConfigError for a selector that matches no rule. Checked against the rule modules' names
    first, and only imported (all_rules) when that cheap check fails, so that linting files that get
    skipped never imports torch through a rule module."""
    groups = []
    cfg = f"{settings.config_path}: [tool.fsdp-lint] " if settings.config_path else ""
    for select, extend, ignore, dash in _layers(settings):
        where = dash or cfg
        groups += [(select or [], f"{where}select"), (ignore, f"{where}ignore"), (extend, f"{where}extend-select")]
    groups += [(codes, f"{cfg}per-file-ignores {pattern!r}") for pattern, codes in (settings.per_file_ignores or {}).items()]
    try:
        cheap = codes_from_module_names()
        for selectors, origin in groups:
            check_selectors(selectors, cheap, origin)
    except ConfigError:
        from fsdp_lint.check.rule import all_rules

        known = [r.code for r in all_rules()]
        for selectors, origin in groups:
            check_selectors(selectors, known, origin)


def rule_enabled(code: str, settings: Settings, path: str) -> bool:
    """ruff's model: within a layer the more specific selector wins (ties go to ignore); a layer with
    `select` decides afresh, one without only changes what its extend-select/ignore match; the
    command line is the last layer; per-file-ignores always win."""
    enabled = False
    for select, extend, ignore, _ in _layers(settings):
        ignored = _matches(code, ignore)
        if select is not None:
            enabled = _matches(code, select + extend) > ignored
        else:
            added = _matches(code, extend)
            if added or ignored:
                enabled = added > ignored
    if not enabled:
        return False
    for pattern, codes in (settings.per_file_ignores or {}).items():
        if _matches(code, codes) and _path_matches(path, pattern, settings):
            return False
    return True


def _path_matches(path: str, pattern: str, settings: Settings) -> bool:
    base = os.path.dirname(settings.config_path) if settings.config_path else os.getcwd()
    rel = os.path.relpath(os.path.abspath(path), base).replace(os.sep, "/")
    return fnmatch.fnmatch(rel, pattern) or fnmatch.fnmatch(os.path.basename(path), pattern)


def suppressed(finding, facts) -> bool:
    """`# noqa` or `# noqa: FSD201` on the reported line, or a file-level `# fsdp-lint: noqa[: FSD201]`
    (in the linted file, or in the helper module a finding points into)."""
    return bool(suppressions(finding, facts))


def suppressions(finding, facts) -> list:
    """The noqa entries that suppress `finding`: (file, line of the comment, the code or prefix that
    matched; None for a bare noqa), each one that matches (FSD001 reports the others as unused)."""
    if facts is None:
        return []
    if os.path.abspath(finding.path) != os.path.abspath(facts.path):
        from fsdp_lint.entry.project import facts_for
        from fsdp_lint.entry.source import SourceError

        try:
            facts = facts_for(os.path.abspath(finding.path))
        except (OSError, SourceError):
            return []
    path = os.path.abspath(facts.path)
    entries = []
    if finding.line in facts.noqa:
        entries.append((finding.line, facts.noqa[finding.line]))
    entries += sorted(getattr(facts, "noqa_file", {}).items())
    out = []
    for line, codes in entries:
        if codes is None:
            out.append((path, line, None))
        else:
            out += [(path, line, c) for c in sorted(codes) if finding.code.startswith(c)]
    return out
