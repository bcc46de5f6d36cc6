"""Parameter reads from the traced forward (``layout.trace``): what a fix may not split.

A rule that suggests giving a module a unit of its own checks it here first: a parameter under that
module that the forward reads from outside the module's subtree would be sharded when it is read
(FSD402), so no fix may suggest that split. Without a trace (the forward could not run on the
simulated node) the modules that hold it through a plain Python reference (``tree.held_outside``: a
tuple, a ``TiedLinear``-style holder object) count as its readers: their code reads its weight.
"""
from typing import List, Tuple


def reads_outside(ctx, module: str) -> List[Tuple[str, str]]:
    """(parameter, reader module) pairs: parameters under `module` read by code outside its
    subtree during the traced forward ("" = the root module's own code)."""
    trace = getattr(ctx.layout, "trace", None)
    if trace is not None and not trace.error:
        return trace.reads_outside(ctx.tree, module)
    return held_outside(ctx.tree, module)


def held_outside(tree, module: str) -> List[Tuple[str, str]]:
    """(parameter, holder) pairs for the modules outside `module`'s subtree that hold it (or a module
    under it) through a plain reference; the parameter named is the first one under the held module."""
    if not module:
        return []
    out = []
    held = getattr(tree, "held_outside", None) or {}
    for info in tree.subtree(module):
        for holder in held.get(info.fqn, ()):
            if holder != module and not tree.is_ancestor(module, holder):
                params = tree.params_under(info.fqn)
                out.append((params[0] if params else info.fqn, holder))
    return out
