"""Parameter reads from the traced forward (``layout.trace``): what a fix may not split.

A rule that suggests giving a module a unit of its own checks it here first: a parameter under that
module that the forward reads from outside the module's subtree would be sharded when it is read
(FSD402), so no fix may suggest that split.
"""
from typing import List, Tuple


def reads_outside(ctx, module: str) -> List[Tuple[str, str]]:
    """(parameter, reader module) pairs: parameters under `module` read by code outside its
    subtree during the traced forward ("" = the root module's own code). Empty without a trace."""
    trace = getattr(ctx.layout, "trace", None)
    return trace.reads_outside(ctx.tree, module) if trace is not None else []
