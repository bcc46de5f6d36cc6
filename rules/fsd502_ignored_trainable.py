"""FSD502 ignored-trainable."""
from typing import Dict, List, Tuple

from fsdp_lint.check.rule import Example, Rule

_MODEL = '''
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())

class Net(nn.Module):
    def __init__(self, dim=64, layers=3, classes=10):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.backbone(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''


class IgnoredTrainable(Rule):
    """Parameters that FSDP is told to ignore are still trainable.

    ## What it does
    Flags FSDP1 `ignored_modules=` / `ignored_states=` and FSDP2 `ignored_params=` that hold
    parameters with `requires_grad=True` (at the end of the setup code), and names them.

    ## Why is this bad?
    FSDP leaves ignored parameters alone: they are not sharded and their gradients are never reduced
    across ranks. That is right for a frozen backbone, but a trainable ignored parameter gets a
    different local gradient on every rank, each rank's optimizer applies its own, and the replicas
    silently drift apart from the first step on.

    ## Example
    ```python
    model = FSDP(model, auto_wrap_policy=policy, ignored_modules=[model.backbone])
    # model.backbone is still trainable
    ```

    ## Fix
    If the parameters should not train, freeze them before wrapping:
    ```python
    model.backbone.requires_grad_(False)
    model = FSDP(model, auto_wrap_policy=policy, ignored_modules=[model.backbone])
    ```
    If they should train, do not ignore them: let FSDP shard and synchronise them.
    """

    code = "FSD502"
    name = "ignored-trainable"
    severity = "error"
    summary = "ignored modules/params hold trainable parameters: their gradients are never synchronised"

    VALID = [
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
model = Net()
model.backbone.requires_grad_(False)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy, ignored_modules=[model.backbone])
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for p in model.head.parameters():
    p.requires_grad = False
for layer in model.layers:
    fully_shard(layer)
fully_shard(model, ignored_params=set(model.head.parameters()))
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
model = FSDP(model, ignored_modules=[model.backbone])
model.backbone.requires_grad_(False)
''', note="frozen after the wrap, before training"),
    ]
    INVALID = [
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
model = Net()
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy, ignored_modules=[model.backbone])
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
model = FSDP(model, ignored_states=[model.head.weight], use_orig_params=True)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model, ignored_params=set(model.head.parameters()))
'''),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.origin != "file" or not plan.ignored_params:
            return
        trainable = {p for p in plan.ignored_params if self._trainable(plan, tree, p)}
        if not trainable:
            return
        # group by the call that names them, keeping what the call named (a module or a parameter)
        by_call: Dict[Tuple[str, int, int], List[Tuple[str, List[str]]]] = {}
        for named, where in plan.ignored_at.items():
            if named in tree.params or named in tree.alias_to_canonical:
                under = [tree.canonical(named)]
            elif named in tree.modules:
                under = tree.params_under(named)
            else:
                continue
            hits = [p for p in under if p in trainable]
            if hits:
                by_call.setdefault(where, []).append((named, hits))
        reported = set()
        for (path, line, col), entries in sorted(by_call.items(), key=lambda kv: kv[0][1]):
            params = []
            for _, hits in entries:
                params += [p for p in hits if p not in params]
            reported |= set(params)
            yield self._make(ctx, entries, params, path, line, col)
        rest = [p for p in plan.ignored_params if p in trainable and p not in reported]
        if rest:
            first = plan.units[0] if plan.units else None
            yield self._make(ctx, [], rest, first.path if first else ctx.path,
                             first.line if first else 1, first.col if first else 1)

    @staticmethod
    def _trainable(plan, tree, fqn: str) -> bool:
        """requires_grad at the end of the setup code: the last freeze/unfreeze of the parameter, else
        its state when the model was wrapped."""
        events = [e for e in plan.param_events.get(fqn, []) if e.kind == "freeze"]
        if events:
            return bool(max(events, key=lambda e: e.seq).value)
        return tree.params[fqn].requires_grad

    def _make(self, ctx, entries, params, path, line, col):
        tree = ctx.tree
        numel = sum(tree.params[p].numel for p in params)
        shown = ", ".join(f"`{p}`" for p in params[:4]) + (f" and {len(params) - 4} more" if len(params) > 4 else "")
        modules = [n for n, _ in entries if n not in tree.params]
        what = ""
        if modules:
            what = " (in " + ", ".join(f"`{m or '<root>'}`" for m in modules) + ")"
        if ctx.plan.api == "fsdp2":
            kwarg = "`ignored_params`"
        else:
            kwarg = "`ignored_modules`" if modules else "`ignored_states`"
        noun = "parameter" if len(params) == 1 else "parameters"
        msg = (f"{kwarg} holds {len(params)} trainable {noun}{what}: FSDP never reduces their gradients, so the "
               "replicas drift apart")
        detail = (f"{numel:,} elements: {shown}; FSDP never reduces their gradients, so each rank updates its own "
                  "copy and the replicas drift apart")
        freeze = " and ".join(f"`model.{m}.requires_grad_(False)`" for m in modules if m) or \
            "`requires_grad_(False)` on them"
        fix = (f"if they should not train, freeze them before wrapping ({freeze}); if they should train, "
               "do not ignore them, so FSDP shards and synchronises them")
        return self.finding(ctx, msg, line=line, col=col, path=path, module=modules[0] if modules else "",
                            fix=fix, detail=detail, params=params)
