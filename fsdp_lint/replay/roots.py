"""Where a replay finds the project's own top-level packages besides the entry's folder.

``python -m apps.main.train`` from a repository root finds ``lingua/`` next to ``apps/`` because the
launch folder is first on ``sys.path``: layouts without ``__init__.py`` files (namespace packages)
work only that way, and scripts often reach the repository's package through a ``sys.path`` tweak or
an editable install. The static `Project` resolves imports through the repository root and its
``src/``; the replay appends the same folders to ``sys.path`` (after everything else, so that they
never shadow an installed package), so that a module the reach analysis found is the module that runs
rather than a stand-in for "not installed".
"""
from __future__ import annotations

import os
from typing import List, Optional

from fsdp_lint.entry.project import Entry, Project


def last_resort_roots(entry: Entry, siblings: Optional[str]) -> List[str]:
    """The folders appended to ``sys.path`` for a replay of `entry`, in the static resolution's order:
    the repository root, its ``src/``, then the package module's own folder (`siblings`)."""
    roots = [r for r in Project(entry).roots if r != entry.root and r != siblings and os.path.isdir(r)]
    if siblings:
        roots.append(siblings)
    return roots
