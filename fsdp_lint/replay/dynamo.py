"""torch wraps many of its own Python functions in ``torch._disable_dynamo`` -- the decompositions a
meta tensor's ``layer_norm``/``mean`` run through, ``nn.init`` on meta, the optimizers' ``step`` --
and the first call of each imports ``torch._dynamo`` (1-2 s, more than the rest of a lint) only to
run the function with compilation turned off. Nothing in a lint compiles (the replay's
``torch.compile`` returns its argument), and a function run with compilation off computes what it
computes without: so before a replay, every such function torch has made so far is set to call the
function itself (what the wrapper caches after its first call: ``fn.__dynamo_disable``). A function
made later imports torch._dynamo on its first call, as before.

Once torch._dynamo is imported (the linted code imported it), nothing is changed: its ``disable``
is cheap then, and kept.
"""
from __future__ import annotations

import gc
import sys


def skip_dynamo_import() -> int:
    """Set every ``torch._disable_dynamo`` wrapper made so far to call its function directly;
    returns how many were set. The search walks the objects the collector tracks (in a child of
    the fork server: those made since the server froze its own, which it searched already)."""
    if "torch._dynamo" in sys.modules or "torch._compile" not in sys.modules:
        return 0
    from torch._compile import _disable_dynamo

    code = _disable_dynamo(lambda: None).__code__      # every wrapper is a function of this code
    if "fn" not in code.co_freevars:       # another torch: leave it alone
        return 0
    cell = code.co_freevars.index("fn")
    count = 0
    for wrapper in gc.get_referrers(code):
        if getattr(wrapper, "__code__", None) is not code or not wrapper.__closure__:
            continue
        try:
            fn = wrapper.__closure__[cell].cell_contents
        except ValueError:     # an empty cell
            continue
        if getattr(fn, "__dynamo_disable", None) is None:
            try:
                fn.__dynamo_disable = fn
            except (AttributeError, TypeError):
                continue
            count += 1
    return count
