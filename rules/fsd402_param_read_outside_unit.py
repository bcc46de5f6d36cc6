"""FSD402 param-read-outside-unit."""
import os

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import where

_MODEL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(x))

class Head(nn.Module):
    """Projects with the embedding's weight; the embedding is held in a tuple, not registered."""
    def __init__(self, embedding):
        super().__init__()
        self._embedding = (embedding,)

    def forward(self, h):
        return F.linear(h, self._embedding[0].weight)

class LM(nn.Module):
    def __init__(self, vocab=512, dim=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = Head(self.embed)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''


class ParamReadOutsideUnit(Rule):
    """A parameter is read while the FSDP unit that owns it holds it sharded.

    ## What it does
    Runs the model's forward (and loss) once on fake tensors with the training inputs and
    records, for every parameter passed to a torch function, which module and which unit were
    running. A parameter read outside the forward of its own unit -- after that unit resharded,
    or before it gathered -- is reported with the module that owns it, the module that reads it,
    and the line that reads it.

    Typical causes: an output head tied to the embedding through a plain Python reference (a
    tuple, a helper object) rather than a registered parameter; a fused or chunked loss that
    reads `lm_head.weight` directly instead of calling `lm_head`; any `other_module.weight`
    used in a parent's `forward` after `other_module` was given a unit of its own.

    ## Why is this bad?
    FSDP gathers a unit's parameters in that unit's own forward hooks and frees them again
    when its forward returns (every unit but the root). Read at any other moment, the parameter
    is a shard: FSDP2 raises at the first forward (`aten.mm.default: got mixed torch.Tensor and
    DTensor`), FSDP1 computes on a flat slice of the shard (a shape error, or wrong numbers).
    Nothing about it is visible in the wrap code.

    ## Example
    ```python
    class Head(nn.Module):
        def __init__(self, embedding):
            super().__init__()
            self._embedding = (embedding,)      # not registered: FSDP does not know the head uses it
        def forward(self, h):
            return F.linear(h, self._embedding[0].weight)

    fully_shard(model.embed)                    # resharded once `embed` returns
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)                          # the head runs in the root's forward
    ```

    ## Fix
    Keep the parameter in a unit that is gathered when it is read: group the owner with its
    reader (`fully_shard([model.embed, model.head])`: FSDP2 gathers the group for each of its
    modules' forwards), or leave the owner in the enclosing unit (no `fully_shard` of its own).
    A weight read by the parent's own code (a fused loss) stays in the parent's unit, or is read
    inside a method of its module registered with
    `torch.distributed.fsdp.register_fsdp_forward_method`.
    """

    code = "FSD402"
    name = "param-read-outside-unit"
    severity = "error"
    summary = "a parameter is read outside its own unit's forward, while FSDP holds it sharded"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', note="the embedding stays in the root unit, gathered for the whole forward"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
fully_shard([model.embed, model.head])
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', note="owner and reader in one group: gathered for each of their forwards"),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
fully_shard(model.embed)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', note="tie through a plain Python reference"),
        Example(_MODEL.replace("return self.head(x)", "return x @ self.embed.weight.t()") + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(LM(), auto_wrap_policy=ModuleWrapPolicy({nn.Embedding, Block}), use_orig_params=True)
''', note="FSDP1: the root's forward reads the embedding unit's weight directly"),
    ]

    def check(self, ctx):
        trace = getattr(ctx.layout, "trace", None)
        if trace is None or trace.error or not trace.sharded_reads:
            return
        units = {u.module: u for u in ctx.plan.units}
        for read in trace.sharded_reads:
            owner = units.get(read.owner)
            if owner is None:
                continue
            if any(m in ctx.tree.modules and not ctx.tree.modules[m].has_forward for m in owner.modules if m):
                continue    # a container unit (FSD105): its forward never runs, every read is that one mistake
            yield self._finding(ctx, read, owner, units.get(read.unit) if read.unit is not None else None)

    def _finding(self, ctx, read, owner, reader_unit):
        from fsdp_lint.humanize import display_path, unit_label

        plan, tree = ctx.plan, ctx.tree
        reader = read.module
        reader_cls = tree.modules[reader].cls if reader in tree.modules else "?"
        if reader == "":
            who = f"the root module's own forward ({reader_cls})"
        else:
            who = f"`{reader}` ({reader_cls})"
        inside = f", inside the forward of unit {_unit(reader_unit)}" if reader_unit is not None else ""
        at = ""
        if read.path and read.line:
            at = f" at {display_path(read.path)}:{read.line}" + (f" in {read.function}" if read.function else "")
        state = ("after that unit's forward returned and resharded it" if read.owner_ran
                 else "before that unit's forward gathered it (here it never runs)")
        if read.phase == "loss":
            who += " (the loss)"
        msg = (f"`{read.fqn}` belongs to unit {_unit(owner)} but is read by {who} while it is sharded: "
               + ("FSDP2 raises at the first forward" if plan.api == "fsdp2" else
                  "FSDP1 hands it a flat slice of a shard"))
        detail = (f"read{inside}{at}, {state}: "
                  + ("FSDP2 raises at the first forward (`aten.mm.default got mixed torch.Tensor and DTensor`)"
                     if plan.api == "fsdp2" else
                     "FSDP1 hands it a flat slice of this rank's shard (a shape error, or wrong numbers)"))
        fix = self._fix(ctx, read, owner, reader)
        loc = where(ctx, owner.path, owner.line, owner.col)
        if not os.path.isfile(loc["path"]):
            loc = where(ctx, "", 0)
        edits = None
        if plan.api == "fsdp1" and not owner.is_root and owner.modules == [read.fqn.rpartition(".")[0]]:
            # the owner's unit goes (FSD401's FSDP1 edit when the read is of a tied weight: made once)
            from fsdp_lint.fix.edits import SAFE, Fix
            from fsdp_lint.fix.policies import unwrap_units

            found = unwrap_units(plan, tree, [owner])
            if found:
                edits = Fix(f"leave `{owner.modules[0]}` in the enclosing unit", SAFE, found[0])
        return self.finding(ctx, msg, **loc, module=owner.module, fix=fix, detail=detail, param=read.fqn, reader=reader,
                            reader_unit=unit_label(read.unit) if read.unit is not None else None, fix_edits=edits)

    @staticmethod
    def _fix(ctx, read, owner, reader) -> str:
        tree, plan = ctx.tree, ctx.plan
        owner_mod = read.fqn.rpartition(".")[0]
        if owner.is_root:
            return "keep the parameter in a module whose forward reads it"
        drop = (f"leave `{owner_mod}` in the enclosing unit (no unit of its own)" if owner.modules == [owner_mod]
                else f"take `{owner_mod}` out of unit {_unit(owner)} (it then belongs to the enclosing unit)")
        if plan.api == "fsdp2" and reader and not tree.is_ancestor(reader, owner_mod) \
                and not tree.is_ancestor(owner_mod, reader):
            group = ", ".join(tree.expr(m) for m in list(owner.modules) + [reader] if m)
            return (f"group the owner with its reader: `fully_shard([{group}])` in place of the call at line "
                    f"{owner.line} (FSDP2 gathers a group for each of its modules' forwards); or {drop}")
        return (f"{drop}; or read it inside a method of `{owner_mod}` registered with "
                f"`torch.distributed.fsdp.register_fsdp_forward_method`" if plan.api == "fsdp2" else drop)


def _unit(unit) -> str:
    if unit is None:
        return "none"
    if unit.is_root:
        return "(root)"
    return ", ".join(f"`{m}`" for m in unit.modules)
