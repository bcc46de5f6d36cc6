"""Module-level calls that register something process-wide in a library.

``OmegaConf.register_new_resolver("run_dir", ...)``, ``AutoConfig.register("my-lm", MyConfig)``,
``register_model("tiny")``: what they register is looked up by name later (a config's
``${run_dir:...}`` interpolation, a model type in a hub config), so such a statement is set-up a later
one depends on, though it binds nothing the later code reads -- the replay keeps it where it leaves
out statements the plan does not depend on.
"""
from __future__ import annotations

import ast


def registers(func: ast.expr) -> bool:
    """Whether a call of `func` registers something (``register``, ``register_*``, ``*_register``)."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "register" or name.startswith(("register_", "_register")) or name.endswith("_register")
