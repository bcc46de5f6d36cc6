"""FSD501 optimizer-before-wrap."""
from fsdp_lint.check.rule import Example, Rule

_MODEL = '''
import torch
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())

class Net(nn.Module):
    def __init__(self, vocab=1000, dim=64, layers=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''


def _lines(lines) -> str:
    lines = sorted(set(lines))
    if len(lines) == 1:
        return f"line {lines[0]}"
    return "lines " + ", ".join(str(n) for n in lines)


class OptimizerBeforeWrap(Rule):
    """The optimizer is built from the model's parameters before FSDP wraps the model.

    ## What it does
    Flags optimizers constructed from parameters that a later wrap call replaces, and points at both
    the optimizer and the wrap call.

    ## Why is this bad?
    An optimizer keeps references to the tensors it was given. FSDP2's `fully_shard` replaces every
    parameter it manages with a new sharded `DTensor` parameter, and FSDP1 with
    `use_orig_params=False` flattens them into `FlatParameter`s. The optimizer built before the wrap
    still holds the old tensors: they receive no gradients, so `optimizer.step()` updates nothing and
    the model never learns. Nothing raises. FSDP1 with `use_orig_params=True` keeps the original
    `Parameter` objects, so training happens to work, but only as long as that flag stays on; FSDP
    requires the optimizer to be built after wrapping.

    ## Example
    ```python
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```

    ## Fix
    Build the optimizer after the last wrap call, from the wrapped model's parameters:
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```
    """

    code = "FSD501"
    name = "optimizer-before-wrap"
    severity = "error"
    summary = "the optimizer is built before the wrap that replaces its parameters"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
'''),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model = FSDP(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model = FSDP(model, use_orig_params=True)
''', note="warning: use_orig_params=True keeps the Parameter objects"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
fully_shard(model)
''', note="the root's own parameters (embed, head) are replaced after the optimizer is built"),
    ]

    def check(self, ctx):
        plan = ctx.plan
        if plan.origin != "file" or not plan.units:
            return
        for opt in plan.optimizers:
            if opt.remapped_by:         # accelerate's prepare(model, optimizer) keeps it working
                continue
            replaced = []
            units = {}
            for fqn in opt.params:
                later = [u for u in plan.units_for_param(fqn) if u.seq > opt.seq]
                if later:
                    replaced.append(fqn)
                    for u in later:
                        units[id(u)] = u
            if not replaced:
                continue
            wraps = sorted(units.values(), key=lambda u: u.seq)
            last = wraps[-1]
            wrap_lines = _lines(u.line for u in wraps)
            n, total = len(replaced), len(opt.params)
            if n < total:
                held = (f"{n} of its {total} parameters (" + ", ".join(f"`{p}`" for p in replaced[:4])
                        + (f" and {n - 4} more" if n > 4 else "") + ")")
                effect = "never updates them"
            else:
                held = f"all {total} of its parameters"
                effect = "updates nothing"
            severity = self.severity
            if plan.api == "fsdp2":
                why = (f"`fully_shard` at {wrap_lines} replaces {held} with new sharded DTensor parameters; the "
                       f"optimizer keeps the old tensors, which get no gradients, so `optimizer.step()` {effect}")
            elif not plan.use_orig_params:
                why = (f"FSDP at {wrap_lines} flattens {held} into FlatParameters (use_orig_params=False); the "
                       f"optimizer keeps the original tensors, which get no gradients, so `optimizer.step()` {effect}")
            else:
                severity = "warning"
                why = (f"FSDP at {wrap_lines} wraps {held}; it works only because use_orig_params=True keeps the "
                       "original Parameter objects, and breaks with use_orig_params=False or FSDP2")
            msg = f"optimizer `{opt.cls}` is built before the model is wrapped: " + (
                f"`optimizer.step()` {effect}" if severity == self.severity
                else "it works only because use_orig_params=True")
            last_line = max(u.line for u in wraps)
            fix = (f"build the optimizer after the wrap: move the `{opt.cls}(...)` at line {opt.line} below the "
                   f"wrap call at line {last_line}, and pass it the wrapped model's `parameters()`")
            if getattr(plan, "framework", None) == "accelerate":
                # accelerate 1.x remaps optimizers for FSDP2 only; FSDP1 keeps what the optimizer holds
                fix = (f"prepare the model first (`model = accelerator.prepare(model)` at line {last_line}), then "
                       f"build the `{opt.cls}` over `model.parameters()` and `optimizer = "
                       f"accelerator.prepare(optimizer)`; or set `use_orig_params=True` (`fsdp_use_orig_params: "
                       f"true`), or FSDP2 (`fsdp_version: 2`), where accelerate points the optimizer at the "
                       f"sharded parameters")
            edits = None if getattr(plan, "framework", None) else self._edits(opt, last)
            yield self.finding(ctx, msg, line=opt.line, path=opt.path, fix=fix, severity=severity, fix_edits=edits,
                               detail=why,
                               wrap_lines=sorted({u.line for u in wraps}), params=replaced, last_wrap=last.line)

    @staticmethod
    def _edits(opt, last):
        """The optimizer's statement moved below the last wrap (its loop, when it is in one), in the same
        block and when nothing in between uses the optimizer."""
        from fsdp_lint.fix import codemods
        from fsdp_lint.fix.edits import SAFE, Fix

        if last.path != opt.path:
            return None
        src = codemods.Source.of(opt.path)
        call = codemods.wrap_call(src, last.line, last.col) if src is not None else None
        opt_calls = src.calls_at(opt.line) if src is not None else []
        if call is None or not opt_calls:
            return None
        wrap_stmt = src.statement(call)
        loops = src.enclosing_loops(wrap_stmt)
        edits = codemods.move_below(src, src.statement(opt_calls[0]), loops[-1] if loops else wrap_stmt)
        if edits is None:
            return None
        return Fix(f"move the `{opt.cls}(...)` below the wrap at line {last.line}", SAFE, edits)
