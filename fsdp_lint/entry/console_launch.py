"""The console scripts of a launch line: a pip-installed wrapper (``bin/lerobot-train``) and the names a module
defines at its top level (whether a console script's function is there)."""
from __future__ import annotations

import ast
import os
import re
from typing import Optional


def top_level_names(text: str) -> Optional[set]:
    """The names a module binds at its top level (defs, classes, assignments, imports), or None (unreadable,
    or it binds names in ways not read here: ``from x import *``, ``globals()``)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    if "globals()" in text:
        return None
    names: set = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names



_WRAPPER = re.compile(r"^from\s+([\w.]+)\s+import\s+(\w+)\s*$.*?sys\.exit\(\s*\2\(\)\s*\)", re.S | re.M)


def console_wrapper(path: str) -> Optional[str]:
    """"module:function" of a console script pip installed (``bin/lerobot-train``: ``from lerobot.scripts.
    lerobot_train import main`` ... ``sys.exit(main())``), or None for any other word."""
    if path.endswith(".py") or path.startswith("-") or os.sep not in path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4096)
    except OSError:
        return None
    m = _WRAPPER.search(text) if text.startswith("#!") and "python" in text.splitlines()[0] else None
    return f"{m.group(1)}:{m.group(2)}" if m else None
