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
    simulated: Optional[dict] = None      # --simulate: the measured peak (fsdp_lint.run.simulate)
    granularity: Optional[list] = None    # --compare-granularity: rows (fsdp_lint.granularity)


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
            and "from_config" not in text and "from_pretrained" not in text:
        return FileResult(path=path, facts=facts, skipped="no nn.Module and no FSDP use")

    from fsdp_lint.layout import compute_layout
    from fsdp_lint.plan import PlanOptions, build_plan
    from fsdp_lint.replay import ModelTarget, ReplayError, replay
    from fsdp_lint.tree import build_module_tree

    try:
        target = ModelTarget.parse(settings.model) if settings.model else None
        result = replay(facts, settings.world_size, target=target, timeout=settings.replay_timeout)
    except ReplayError as exc:
        raise LintError(str(exc)) from None
    state = {}
    for call in result.wrap_calls:
        state.update(call.state)
    tree = build_module_tree(result.model, state)
    plan = build_plan(result, tree, PlanOptions(world_size=settings.world_size, api=settings.api,
                                                wrap=list(settings.wrap), use_orig_params=settings.use_orig_params))
    from fsdp_lint.run.inputs import find_example_inputs

    example_fn = find_example_inputs(result.namespace, result.model)     # it loses to --input-shape, as in --run
    # activations enter the estimate when the input shape is known (or --simulate measures the same inputs)
    known = bool(settings.input_shape) or example_fn is not None or settings.activations_for_inferred_inputs
    trace = _trace(result, tree, plan, settings, example_fn, known)
    layout = compute_layout(plan, tree, trace=trace, activations=known)
    return FileResult(path=path, target=result.target, facts=facts, tree=tree, plan=plan, layout=layout,
                      replay=result if keep_model else None)


def _trace(result, tree, plan, settings: Settings, example_fn, activations: bool):
    """One forward of the replay's model with the training inputs (``fsdp_lint.trace``)."""
    from fsdp_lint.config import input_shape_dims
    from fsdp_lint.trace import trace_forward

    return trace_forward(result.model, tree, plan, input_shape=input_shape_dims(settings.input_shape),
                         input_dtype=settings.input_dtype, example_fn=example_fn, timeout=settings.replay_timeout,
                         activations=activations)


def lint_file(path: str, settings: Settings) -> FileResult:
    res = analyse(path, settings)
    if res.skipped:
        return res
    from fsdp_lint.rule import LintContext
    from fsdp_lint.selection import rule_enabled, suppressed

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
    res.findings = findings
    return res
