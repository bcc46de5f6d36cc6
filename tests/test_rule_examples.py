"""Every rule's VALID/INVALID examples, run through the whole pipeline, plus catalogue hygiene."""
import re

import pytest

from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file
from fsdp_lint.check.rule import SEVERITIES, all_rules

RULES = all_rules()


def _cases(kind):
    for rule in RULES:
        for i, ex in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, ex, id=f"{rule.code}-{kind.lower()}-{i}")


def _lint(tmp_path, ex):
    path = tmp_path / "example.py"
    path.write_text(ex.source)
    settings = Settings(world_size=ex.world_size).with_overrides(**ex.options)
    return lint_file(str(path), settings)


@pytest.mark.parametrize("rule,ex", list(_cases("VALID")))
def test_valid_example_has_no_finding(tmp_path, rule, ex):
    res = _lint(tmp_path, ex)
    codes = [f.code for f in res.findings]
    assert rule.code not in codes, [f.message for f in res.findings if f.code == rule.code]


@pytest.mark.parametrize("rule,ex", list(_cases("INVALID")))
def test_invalid_example_is_flagged(tmp_path, rule, ex):
    res = _lint(tmp_path, ex)
    hits = [f for f in res.findings if f.code == rule.code]
    assert hits, f"{rule.code} did not fire; findings: {[(f.code, f.message) for f in res.findings]}"
    from fsdp_lint.report.text import MESSAGE_LIMIT

    for f in hits:
        assert f.line > 0 and f.message and f.severity in SEVERITIES
        # concise shows the message on one line: the rule keeps it short, the explanation is `detail`
        assert len(f.message) <= MESSAGE_LIMIT and "\n" not in f.message, (len(f.message), f.message)
        assert not f.detail or (f.detail != f.message and "\n" not in f.detail)


def test_codes_are_unique_and_well_formed():
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for r in RULES:
        assert re.fullmatch(r"FSD(00[1-9]|[1-9]\d\d)", r.code), r.code   # FSD00x: about fsdp-lint itself (noqa)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.name), r.name
        assert r.severity in SEVERITIES
        assert r.summary


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_doc_has_the_four_sections(rule):
    doc = rule.doc()
    for section in ("What it does", "Why is this bad?", "Example", "Fix"):
        assert f"## {section}" in doc, f"{rule.code} doc lacks '## {section}'"
    assert rule.VALID and rule.INVALID, f"{rule.code} needs VALID and INVALID examples"
