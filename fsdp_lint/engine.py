"""The pipeline for one file: source -> replay/tree -> plan -> layout -> rules. Never prints."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional

from fsdp_lint.config import Settings
from fsdp_lint.rule import Finding


class LintError(Exception):
    """The file cannot be linted (bad input); message is one line, exit code 2."""


@dataclass
class FileResult:
    path: str
    skipped: Optional[str] = None
    target: Optional[str] = None
    facts: Any = None
    tree: Any = None
    plan: Any = None
    layout: Any = None
    findings: List[Finding] = field(default_factory=list)
    replay: Any = None


def analyse(path: str, settings: Settings, *, keep_model: bool = False) -> FileResult:
    """Build tree, plan and layout for `path` (no rules). Raises LintError on bad input."""
    from fsdp_lint.source import SourceError, looks_relevant, read_source

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LintError(f"cannot read {path}: {exc}") from None
    if not settings.model and not looks_relevant(text):
        return FileResult(path=path, skipped="no nn.Module and no FSDP use")
    try:
        facts = read_source(path)
    except SourceError as exc:
        raise LintError(str(exc)) from None
    if not settings.model and not facts.module_classes and not facts.uses_fsdp and not facts.factories() \
            and not facts.uses_framework and "from_config" not in text and "from_pretrained" not in text:
        return FileResult(path=path, facts=facts, skipped="no nn.Module and no FSDP use")

    from fsdp_lint import frameworks
    from fsdp_lint.frameworks.options import FrameworkOptions, OptionError
    from fsdp_lint.replay import ModelTarget, ReplayError, replay

    from fsdp_lint.frameworks.detect import install_hint, missing_packages

    missing = missing_packages(facts.framework_imports)
    if missing:
        raise LintError(f"{os.path.basename(path)}: {install_hint(missing)}")
    try:
        target = ModelTarget.parse(settings.model) if settings.model else None
        options = FrameworkOptions.from_settings(settings)
        with frameworks.configured(options):
            result = replay(facts, settings.world_size, target=target, timeout=settings.replay_timeout)
    except (ReplayError, OptionError) as exc:
        raise LintError(str(exc)) from None
    with frameworks.configured(options):
        tree, plan, layout = plan_replay(result, settings)
    return FileResult(path=path, target=result.target, facts=facts, tree=tree, plan=plan, layout=layout,
                      replay=result if keep_model else None)


def plan_replay(result, settings: Settings):
    """Tree, plan and layout of a replay's records (the file's, a framework's, or ``fsdp_lint.record()``'s)."""
    from fsdp_lint import frameworks
    from fsdp_lint.layout import compute_layout
    from fsdp_lint.plan import PlanOptions, build_plan
    from fsdp_lint.tree import build_module_tree

    state = {}
    for call in result.wrap_calls:
        state.update(call.state)
    tree = build_module_tree(result.model, state)
    plan = build_plan(result, tree, PlanOptions(world_size=settings.world_size, api=settings.api,
                                                wrap=list(settings.wrap), use_orig_params=settings.use_orig_params))
    frameworks.annotate_plan(plan, result, tree)
    layout = compute_layout(plan, tree)
    return tree, plan, layout


def lint_file(path: str, settings: Settings) -> FileResult:
    res = analyse(path, settings)
    if res.skipped:
        return res
    res.findings = check_rules(res, settings)
    return res


def check_rules(res: FileResult, settings: Settings) -> List[Finding]:
    """The enabled rules' findings on an analysed file, unsuppressed, by line."""
    from fsdp_lint.rule import LintContext
    from fsdp_lint.selection import rule_enabled, suppressed

    path = res.path
    ctx = LintContext(path=path, facts=res.facts, tree=res.tree, plan=res.plan, layout=res.layout, settings=settings)
    findings: List[Finding] = []
    from fsdp_lint.rule import all_rules

    for rule in all_rules():
        if not rule_enabled(rule.code, settings, path):
            continue
        if res.plan.api is not None and res.plan.api not in rule.applies_to:
            continue
        for f in rule.check(ctx):
            if not suppressed(f, res.facts):
                findings.append(f)
    findings.sort(key=lambda f: (os.path.abspath(f.path) != os.path.abspath(path), f.line, f.col, f.code))
    return findings
