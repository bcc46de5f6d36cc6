"""The transform's part of `fsdp_lint.replay.caught`: each ``except`` of a project file first tells the replay
what it caught."""
from __future__ import annotations

import ast

from fsdp_lint.replay.stub_imports import CAUGHT, _call_stmt


def tell_caught(tree: ast.Module, synthetic) -> None:
    """Every ``except`` of the file first calls `CAUGHT` (ids of the calls made are added to `synthetic`)."""
    for node in ast.walk(tree):
        for handler in getattr(node, "handlers", None) or ():
            call = _call_stmt(CAUGHT, like=handler)
            synthetic.add(id(call))
            handler.body.insert(0, call)
