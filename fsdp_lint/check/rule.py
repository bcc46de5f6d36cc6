"""The rule base class, findings, and rule discovery.

A rule is a class in one module under ``rules/`` (installed as ``fsdp_lint.rules``) with a code,
a kebab-case name, a default severity, a one-line summary, a docstring with *What it does*,
*Why is this bad?*, *Example* and *Fix*, and VALID/INVALID examples that the test suite runs.
Rules are discovered: a new file under ``rules/`` is all it takes.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

SEVERITIES = ("info", "warning", "error")
# a finding's message is one line of `concise` (`path:line:col: CODE [severity] message`): rules keep it
# to this many characters and put what names from the linted code make longer in `detail`
MESSAGE_LIMIT = 160


def fitting(*messages: str) -> str:
    """The first message that is at most MESSAGE_LIMIT characters (the last one in any case): the
    fullest wording whose names from the linted code (mesh dimensions, modules) leave it one line."""
    return next((m for m in messages if len(m) <= MESSAGE_LIMIT), messages[-1])
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class Finding:
    code: str
    name: str
    severity: str
    message: str
    path: str
    line: int
    col: int = 1
    module: str = ""             # FQN in the unwrapped model ("" = root)
    fix: Optional[str] = None
    confirmed: Optional[bool] = None
    evidence: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)
    # the linted file's call into the helper module that holds `path:line` (None: it is the file)
    call_site: Optional[Tuple[str, int]] = None
    # the fix as edits of the user's files (fsdp_lint.fix.edits.Fix), when it is a mechanical one
    fix_edits: Optional[Any] = None
    # the long explanation (what torch raises, the numbers behind it): `full` shows it on its own
    # line under the short `message`, which is all `concise` shows
    detail: Optional[str] = None

    @property
    def text(self) -> str:
        """The message with its explanation, as one text (SARIF, annotations, JSON readers)."""
        return f"{self.message}: {self.detail}" if self.detail else self.message

    def to_json(self, display_path: Optional[str] = None, display=None) -> dict:
        site = None
        if self.call_site is not None:
            site = {"path": display(self.call_site[0]) if display else self.call_site[0], "line": self.call_site[1]}
        return {
            "code": self.code, "name": self.name, "severity": self.severity, "message": self.message,
            "detail": self.detail,
            "path": display_path or self.path, "line": self.line, "col": self.col, "module": self.module,
            "fix": self.fix, "confirmed": self.confirmed, "evidence": self.evidence, "call_site": site,
            "fix_edits": self.fix_edits.to_json(display) if self.fix_edits is not None else None,
            "fix_applicability": self.fix_edits.applicability if self.fix_edits is not None else None,
        }


@dataclass
class Example:
    """A small model file for a rule's VALID/INVALID list; `world_size` and `options` are CLI-like
    overrides (keys of `fsdp_lint.config.Settings`)."""
    source: str
    world_size: int = 4
    options: Dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class LintContext:
    """What a rule reads: nothing here is re-derived by rules."""
    path: str
    facts: Any        # SourceFacts
    tree: Any         # ModuleTree
    plan: Any         # WrapPlan
    layout: Any       # Layout
    settings: Any     # Settings (thresholds)
    # filled while the rules run, for the rule that judges the noqa comments (FSD001): the codes of the
    # rules that ran on the file, and the noqa entries (file, comment line, code) that suppressed a finding
    rules_run: set = field(default_factory=set)
    noqa_used: set = field(default_factory=set)
    finding_paths: set = field(default_factory=set)   # absolute paths the rules' findings point into


class Rule:
    code: str = ""
    name: str = ""
    severity: str = "warning"
    summary: str = ""
    applies_to = ("fsdp1", "fsdp2")
    VALID: List[Example] = []
    INVALID: List[Example] = []

    def check(self, ctx: LintContext) -> Iterable[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(self, ctx: LintContext, message: str, *, line: int, col: int = 1, module: str = "",
                fix: Optional[str] = None, path: Optional[str] = None, severity: Optional[str] = None,
                fix_edits=None, detail: Optional[str] = None, **details) -> Finding:
        return Finding(code=self.code, name=self.name, severity=severity or self.severity, message=message,
                       path=path or ctx.path, line=line, col=col, module=module, fix=fix, details=details,
                       fix_edits=fix_edits, detail=detail)

    @classmethod
    def doc(cls) -> str:
        import inspect

        return inspect.cleandoc(cls.__doc__ or "")


_RULES: Optional[List[Rule]] = None


def all_rules() -> List[Rule]:
    """Every rule under ``fsdp_lint.rules``, sorted by code."""
    global _RULES
    if _RULES is None:
        import fsdp_lint.rules as pkg

        found: Dict[str, Rule] = {}
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for obj in vars(mod).values():
                if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.code \
                        and obj.__module__ == mod.__name__:
                    if obj.code in found and type(found[obj.code]) is not obj:
                        raise RuntimeError(f"rule code {obj.code} is defined twice "
                                           f"({type(found[obj.code]).__module__} and {mod.__name__})")
                    found[obj.code] = obj()
        _RULES = [found[c] for c in sorted(found)]
    return _RULES


def rule_by_code(code: str) -> Optional[Rule]:
    for r in all_rules():
        if r.code == code.upper():
            return r
    return None
