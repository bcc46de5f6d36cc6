"""Golden outputs for the article fixtures: the exact text/JSON a user sees.

A change to any stage (plan, layout, report, a rule firing on a correct plan) shows up here as a diff.
When the change is intended, regenerate every golden file with one command and review the diff:

    python -m pytest tests/test_golden.py --update-goldens
    git diff tests/golden/
"""
import difflib
import os
import re
import shlex

import pytest

from conftest import REPO

GOLDEN_DIR = os.path.join(REPO, "tests", "golden")

# golden file -> fsdp-lint arguments (run from the repository root)
CASES = {
    "article_fsdp2.txt": ["fixtures/article_fsdp2.py", "--world-size", "4"],
    "article_fsdp2_params.txt": ["fixtures/article_fsdp2.py", "--world-size", "4", "--layout", "params"],
    "article_fsdp1_ranks.txt": ["fixtures/article_fsdp1.py", "--world-size", "4", "--layout", "ranks"],
    "article_fsdp2.json": ["fixtures/article_fsdp2.py", "--world-size", "4", "--format", "json"],
    "article_fsdp1.json": ["fixtures/article_fsdp1.py", "--world-size", "4", "--format", "json", "--layout", "ranks"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(cli, update_goldens, name):
    res = cli(*CASES[name])
    assert res.code == 0, f"fsdp-lint {' '.join(CASES[name])} exited {res.code}: {res.err}"
    path = os.path.join(GOLDEN_DIR, name)
    if update_goldens:
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(res.out)
        return
    assert os.path.exists(path), f"{path} is missing: run python -m pytest tests/test_golden.py --update-goldens"
    with open(path, encoding="utf-8") as fh:
        expected = fh.read()
    if res.out != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), res.out.splitlines(True),
                                            f"tests/golden/{name}", "fsdp-lint " + " ".join(CASES[name])))
        pytest.fail(f"output differs from tests/golden/{name}; if intended, run "
                    f"`python -m pytest tests/test_golden.py --update-goldens` and review the diff\n{diff[:6000]}")


def test_no_stale_golden_files():
    present = {n for n in os.listdir(GOLDEN_DIR) if not n.startswith(".")} if os.path.isdir(GOLDEN_DIR) else set()
    assert present == set(CASES), "tests/golden/ and CASES disagree"


# ------------------------------------------------------------------------------------------------
# README.md: every example of fsdp-lint's output is what fsdp-lint prints
# ------------------------------------------------------------------------------------------------
# A fenced block right after `<!-- fsdp-lint-output: ARGS -->` is the output of `fsdp-lint ARGS`, run
# from the repository root without a terminal (80 columns unless ARGS starts with `COLUMNS=N`).
# `<!-- fsdp-lint-output lines=1-2,13-: ARGS -->` shows those lines of it (1-based, inclusive, an open
# end runs to the last line), with a `...` line between ranges that are not adjacent.
README = os.path.join(REPO, "README.md")
_MARKER = re.compile(r"^<!-- fsdp-lint-output(?: lines=([0-9,\-]+))?: (.+?) -->\n```[a-z]*\n(.*?)^```$", re.M | re.S)
_RULES = re.compile(r"(<!-- rule-reference:begin[^\n]*-->\n)(.*?)(<!-- rule-reference:end -->)", re.S)


def _select(out: str, spec) -> str:
    lines = out.rstrip("\n").split("\n")
    if not spec:
        return "\n".join(lines) + "\n"
    shown, last = [], None
    for part in spec.split(","):
        a, _, b = part.partition("-")
        start, end = int(a), (int(b) if b else len(lines)) if "-" in part else int(a)
        if last is not None and start != last + 1:
            shown.append("...")
        shown += lines[start - 1:end]
        last = end
    return "\n".join(shown) + "\n"


# The one figure of an example that is not the same run to run: the wall-clock seconds `--simulate` took
# (`..., 6.6 s: peak 388 MB/rank`). Everything else it prints -- peaks, breakdown, collectives -- comes from
# torch's memory tracker over FakeTensorMode and is the same on every run (two runs of the README's command
# differed only there: 73.9 s and 100.2 s), so only those seconds are compared as "some duration".
_ELAPSED = re.compile(r"(?<=\), )\d+(?:\.\d+)? s(?=: peak )")


def _same_output(shown: str, expected: str) -> bool:
    return _ELAPSED.sub("N s", shown) == _ELAPSED.sub("N s", expected)


def _readme_examples(text: str):
    return [(m, m.group(2), m.group(1)) for m in _MARKER.finditer(text)]


def rule_reference() -> str:
    """README.md's "Rule reference": a heading per rule (the SARIF `helpUri` anchors) with its
    severity, summary and the first paragraph of *What it does*."""
    from fsdp_lint.check.rule import all_rules

    out = []
    for r in all_rules():
        m = re.search(r"## What it does\n(.*?)(?:\n\n|\n##|$)", r.doc(), re.S)
        what = " ".join(m.group(1).split()) if m else ""
        out += ["", f"#### {r.code} `{r.name}`", "",
                f"*{r.severity}* · {r.summary}. {what} `fsdp-lint --explain {r.code}` prints the whole documentation."]
    return "\n".join(out).lstrip("\n") + "\n\n"


def _run_example(cli, monkeypatch, command: str) -> str:
    words = shlex.split(command)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    assert words[0] == "fsdp-lint", command
    res = cli(*words[1:])
    assert res.code in (0, 1), f"{command} exited {res.code}: {res.err}"
    return res.out


def test_readme_examples_are_what_fsdp_lint_prints(cli, monkeypatch, update_goldens):
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    examples = _readme_examples(text)
    assert len(examples) >= 6, "README.md lost its <!-- fsdp-lint-output: ... --> markers"
    new, pos, wrong = [], 0, []
    for m, command, spec in examples:
        shown = _select(_run_example(cli, monkeypatch, command), spec)
        if _same_output(shown, m.group(3)):
            shown = m.group(3)          # the README keeps the seconds of the run that wrote it
        else:
            wrong.append("".join(difflib.unified_diff(m.group(3).splitlines(True), shown.splitlines(True),
                                                      "README.md", command)))
        new.append(text[pos:m.start(3)] + shown)
        pos = m.end(3)
    new.append(text[pos:])
    rebuilt = "".join(new)
    ref = _RULES.search(rebuilt)
    assert ref, "README.md has no <!-- rule-reference:begin --> ... <!-- rule-reference:end --> section"
    if ref.group(2) != rule_reference():
        wrong.append("README.md's rule reference differs from the rules' code, summary and documentation")
        rebuilt = rebuilt[:ref.start(2)] + rule_reference() + rebuilt[ref.end(2):]
    if update_goldens:
        if rebuilt != text:
            with open(README, "w", encoding="utf-8") as fh:
                fh.write(rebuilt)
        return
    assert not wrong, ("README.md's examples differ from what fsdp-lint prints; if intended, run "
                       "`python -m pytest tests/test_golden.py --update-goldens` and review the diff\n"
                       + "\n".join(wrong)[:8000])
