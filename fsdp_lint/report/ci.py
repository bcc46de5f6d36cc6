"""`report` for CI systems: JUnit XML (as ruff writes it) and GitLab Code Quality JSON."""
from __future__ import annotations

import hashlib
import json
from typing import Dict, List
from xml.sax.saxutils import quoteattr, escape

from fsdp_lint.humanize import display_path
from fsdp_lint.report.machine import full_message, repo_root

# GitLab's scale is info, minor, major, critical, blocker: an error is a plan that crashes or trains
# wrongly (critical); a warning costs memory or speed (minor); info stays info.
GITLAB_SEVERITY = {"error": "critical", "warning": "minor", "info": "info"}


def _xml_text(text: str) -> str:
    """`text` safe inside XML 1.0: the characters XML cannot hold (C0 controls but tab/LF/CR) as
    ``\\xNN``, then escaped."""
    return escape("".join(ch if ch in "\t\n\r" or ord(ch) >= 0x20 else f"\\x{ord(ch):02x}" for ch in text))


def _attr(text: str) -> str:
    return quoteattr(_xml_text(str(text)))


def render_junit(results, failures=()) -> str:
    """One ``testsuite`` per linted file, one ``testcase`` per finding with a ``failure`` (ruff's
    layout: name ``org.fsdp_lint.CODE``, classname the path, line and column attributes); a file with
    no finding is one passing test case, a file that could not be linted one with an ``error``."""
    suites: List[str] = []
    total = failed = errored = 0
    for res in results:
        if res.skipped:
            continue
        path = display_path(res.path)
        cases = []
        for f in res.findings:
            msg = full_message(f)
            cases.append(f'    <testcase name={_attr("org.fsdp_lint." + f.code)} classname={_attr(path)} '
                         f'line="{f.line}" column="{f.col}">\n'
                         f'      <failure message={_attr(f.message)} type={_attr(f.severity)}>'
                         f'line {f.line}, col {f.col}, {_xml_text(msg)}</failure>\n'
                         f'    </testcase>')
        if not cases:
            cases.append(f'    <testcase name="org.fsdp_lint.no-findings" classname={_attr(path)}/>')
        n = len(res.findings)
        total += max(n, 1)
        failed += n
        suites.append(f'  <testsuite name={_attr(path)} tests="{max(n, 1)}" disabled="0" errors="0" '
                      f'failures="{n}" package="org.fsdp_lint">\n' + "\n".join(cases) + "\n  </testsuite>")
    for path, message in failures:
        total += 1
        errored += 1
        shown = display_path(path)
        suites.append(f'  <testsuite name={_attr(shown)} tests="1" disabled="0" errors="1" failures="0" '
                      f'package="org.fsdp_lint">\n'
                      f'    <testcase name="org.fsdp_lint.lint" classname={_attr(shown)}>\n'
                      f'      <error message="fsdp-lint could not lint this file">{_xml_text(message)}</error>\n'
                      f'    </testcase>\n  </testsuite>')
    head = (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="fsdp-lint" tests="{total}" '
            f'failures="{failed}" errors="{errored}">')
    return "\n".join([head] + suites + ["</testsuites>"]) + "\n"


def gitlab_fingerprint(code: str, path: str, module: str, name: str, seen: Dict[str, int]) -> str:
    """Stable across runs and edits elsewhere in the file: the rule, the repository-relative path and
    the module (FQN) the finding is about; never the line or the numbers of the message. Findings
    that share all three are told apart by their order."""
    key = "\0".join((code, path, module or "", name))
    n = seen.get(key, 0)
    seen[key] = n + 1
    return hashlib.md5(f"{key}\0{n}".encode("utf-8")).hexdigest()


def render_gitlab(results, failures=()) -> str:
    """GitLab Code Quality (the "Code Quality report format": an array of issues with description,
    check_name, fingerprint, severity, location.path and location.lines.begin); paths relative to the
    repository root, as GitLab matches them against the merge request's files."""
    import os

    from fsdp_lint.report.positions import end_position

    root = repo_root()
    seen: Dict[str, int] = {}
    issues = []

    def rel(path: str) -> str:
        r = os.path.relpath(os.path.abspath(path), root)
        return path if r.startswith("..") else r.replace(os.sep, "/")

    for res in results:
        for f in res.findings:
            path = rel(f.path)
            lines = {"begin": max(1, f.line)}
            end = end_position(f.path, f.line, f.col)
            if end is not None and end[0] > lines["begin"]:
                lines["end"] = end[0]
            issues.append({
                "description": f"{f.code} {full_message(f)}",
                "check_name": f.code,
                "fingerprint": gitlab_fingerprint(f.code, path, f.module, f.name, seen),
                "severity": GITLAB_SEVERITY[f.severity],
                "location": {"path": path, "lines": lines},
            })
    for path, message in failures:
        p = rel(path)
        issues.append({"description": f"fsdp-lint could not lint this file: {message}", "check_name": "lint-error",
                       "fingerprint": gitlab_fingerprint("lint-error", p, "", "", seen), "severity": "major",
                       "location": {"path": p, "lines": {"begin": 1}}})
    return json.dumps(issues, indent=2) + "\n"
