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
    if trace is None or trace.error or not module:
        return []
    tree = ctx.tree
    out = []
    for fqn in tree.params_under(module):
        for reader in sorted(trace.readers.get(fqn, ())):
            if reader != module and not tree.is_ancestor(module, reader):
                out.append((fqn, reader))
    return out
