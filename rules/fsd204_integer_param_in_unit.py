"""FSD204 integer-param-in-unit."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._flat_params import (
    anchor, fsdp1_torch_error, group_units, units_brief, units_label, wrapped_how,
)

_MODEL = '''
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(x))
'''

_NET = '''
class Net(nn.Module):
    def __init__(self, vocab=256, dim=64, layers=2, max_len=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)
        {positions}

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''

_AS_PARAM = "self.positions = nn.Parameter(torch.arange(max_len), requires_grad=False)"
_AS_BUFFER = 'self.register_buffer("positions", torch.arange(max_len), persistent=False)'


def _param_expr(tree, fqn: str) -> str:
    owner, _, leaf = fqn.rpartition(".")
    return f"{tree.expr(owner)}.{leaf}"


class IntegerParamInUnit(Rule):
    """An FSDP1 unit holds a parameter that is not floating point.

    ## What it does
    Flags FSDP1 units that own an integer or boolean `nn.Parameter` (position ids, token
    indices, masks registered as frozen parameters) and names it.

    ## Why is this bad?
    FSDP1 flattens every unit's parameters into one floating-point `FlatParameter`; torch
    raises at wrap time with `ValueError: Cannot flatten integer dtype tensors` when the
    integer parameter comes first in the unit, and `ValueError: Must flatten tensors with
    uniform dtype but got torch.float32 and torch.int64` otherwise. An integer tensor can never
    have a gradient, so it never needed to be a parameter in the first place.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            ...
            self.positions = nn.Parameter(torch.arange(max_len), requires_grad=False)
    ```

    ## Fix
    Register it as a buffer, which FSDP leaves alone:
    ```python
    self.register_buffer("positions", torch.arange(max_len), persistent=False)
    ```
    or keep it out of FSDP with `FSDP(model, ignored_states=[model.positions], ...)`.
    """

    code = "FSD204"
    name = "integer-param-in-unit"
    severity = "error"
    summary = "an FSDP1 unit holds a non-floating parameter (torch raises)"
    applies_to = ("fsdp1",)

    VALID = [
        Example(_MODEL + _NET.format(positions=_AS_BUFFER) + '''
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        Example(_MODEL + _NET.format(positions=_AS_PARAM) + '''
model = Net()
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), ignored_states=[model.positions])
'''),
    ]
    INVALID = [
        # the integer parameter is the root's first: "Cannot flatten integer dtype tensors"
        Example(_MODEL + _NET.format(positions=_AS_PARAM) + '''
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        # inside a block after float parameters: "Must flatten tensors with uniform dtype"
        Example(_MODEL + _NET.format(positions="") + '''
model = Net()
for layer in model.layers:
    layer.norm.register_parameter("step", nn.Parameter(torch.zeros((), dtype=torch.long), requires_grad=False))
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.api != "fsdp1" or plan.origin not in ("file", "cli"):
            return
        bad = [u for u in plan.units if any(not tree.params[p].is_floating for p in u.params)]

        def rel(u, p):
            return p[len(u.module) + 1:] if u.module else p

        def sig(u):
            return tuple(rel(u, p) for p in u.params if not tree.params[p].is_floating)

        for units in group_units(bad, sig):
            u = units[0]
            ints = [p for p in u.params if not tree.params[p].is_floating]
            shown = ", ".join(f"{rel(u, p)} ({tree.params[p].dtype}, {list(tree.params[p].shape)})" for p in ints[:4])
            more = f" and {len(ints) - 4} more" if len(ints) > 4 else ""
            holds = "each hold" if len(units) > 1 else "holds"
            torch_says = fsdp1_torch_error(ctx, u) or "Cannot flatten integer dtype tensors"
            msg = (f"{units_brief(units)} {holds} {len(ints)} non-floating parameter{'s' if len(ints) > 1 else ''}: "
                   f"torch raises at wrap time")
            detail = (f"{units_label(units)} ({wrapped_how(ctx, u)}): {shown}{more}; a FlatParameter is floating "
                      f"point, so torch raises at wrap time: `ValueError: {torch_says}`")
            first = ints[0]
            owner, _, leaf = first.rpartition(".")
            owner_cls = tree.modules[owner].cls if owner in tree.modules else "its module"
            every = [p for x in units for p in x.params if not tree.params[p].is_floating]
            listed = ", ".join(_param_expr(tree, p) for p in every[:2]) + (", ..." if len(every) > 2 else "")
            fix = (f"register it as a buffer instead (an integer tensor never has a gradient): "
                   f"`self.register_buffer(\"{leaf}\", ...)` in {owner_cls}, "
                   f"or exclude it: `ignored_states=[{listed}]` in the FSDP call")
            yield self.finding(ctx, msg, **anchor(ctx, u), module=u.module, fix=fix, detail=detail,
                               params=every, units=[x.module for x in units],
                               torch_exception="ValueError", torch_error=torch_says)
