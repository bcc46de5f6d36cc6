"""The quick screen: most files of a repository are plain (utilities, data code, CLIs) and are skipped;
deciding that should cost a parse, not the full reading of ``source``.

A file is linted when it, or a project module it imports, defines a model, wraps with FSDP, names an
auto-wrap policy or uses a framework that wraps (``engine.skip_reason``). Every one of those facts
that ``source._Collector`` records needs one of the words below in the file's text (a class whose
base ends in ``Module``, ``fully_shard``, ``FSDP``, ``build_model``, ``from_pretrained``,
``lightning``, ...; aliases are made only from those names). So a file whose text holds none of
them, and whose imports resolve to no project module, is skipped for the same reason, with the same
message, as the full screen would give (``skips``) -- its syntax errors reported just the same. Its
imports and its syntax are first read from the text alone (``entry.scan``), where that is certain:
``ast.parse`` and a walk over the import statements decide the rest. Anything else goes through the
full screen.
"""
from __future__ import annotations

import ast
import os
from typing import List

from fsdp_lint.entry.detect import FRAMEWORK_PACKAGES
from fsdp_lint.entry.source import (FACTORY_NAMES, FRAMEWORK_MODULES, FRAMEWORK_NAMES, HF_FACTORIES, POLICY_NAMES,
                                    WRAP_FSDP1, WRAP_FSDP2, ImportInfo, parse_tree)

# every name the collector keys a model, wrap, policy or framework fact on (``Module`` covers
# ``nn.Module``, ``ModuleWrapPolicy`` and ``LightningModule``)
TRIGGER_WORDS = sorted(WRAP_FSDP1 | WRAP_FSDP2 | {"FSDP"} | POLICY_NAMES | HF_FACTORIES | set(FACTORY_NAMES)
                       | FRAMEWORK_MODULES | FRAMEWORK_NAMES | set(FRAMEWORK_PACKAGES) | {"Module", "PreTrainedModel", "Sequential"})


def may_matter(text: str) -> bool:
    """The text holds a word some model, wrap, policy or framework fact needs (a substring search per
    word: a third of what one search for the alternation of them all costs)."""
    return any(word in text for word in TRIGGER_WORDS)


class ImportsOnly:
    """What ``project.Project.imports_of`` reads of a file: its import statements."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.imports: List[ImportInfo] = []
        todo = list(parse_tree(path, text).body)
        while todo:      # import statements sit only in statement lists: expressions are not walked
            node = todo.pop()
            kind = type(node)
            if kind in _SIMPLE:      # most statements: nothing to look into
                continue
            if kind is ast.Import:
                self.imports += [ImportInfo(a.name, 0, [], node.lineno, False) for a in node.names]
            elif kind is ast.ImportFrom:
                self.imports.append(ImportInfo(node.module or "", node.level or 0, [a.name for a in node.names],
                                               node.lineno, False))
            else:
                for name in _BODIES:
                    sub = getattr(node, name, None)
                    if sub:
                        todo += sub


# the fields of a statement that hold statements (``handlers``: except clauses; ``cases``: match)
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
# the simple statements: none holds a statement
_SIMPLE = frozenset({ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Pass, ast.Break,
                     ast.Continue, ast.Delete, ast.Raise, ast.Assert, ast.Global, ast.Nonlocal})


def skips(path: str, text: str) -> bool:
    """The quick screen's verdict on a file whose text holds no trigger word (``may_matter``): True when
    none of its imports resolves to a project module, and the full screen would skip it for "no
    nn.Module and no FSDP use". Raises SourceError where ``ast.parse`` fails, as the full screen does."""
    from fsdp_lint.entry.project import Project, entry_for
    from fsdp_lint.entry.scan import Imports, import_candidates, parses

    absolute = os.path.abspath(path)
    project = Project(entry_for(path, text))
    found = import_candidates(text)
    if found is not None and not project.imports_of(absolute, Imports(found)) and parses(path, text):
        return True
    return not project.imports_of(absolute, ImportsOnly(path, text))
