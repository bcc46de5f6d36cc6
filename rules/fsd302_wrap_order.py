"""FSD302 wrap-order."""
from typing import Dict, List, Tuple

from fsdp_lint.check.rule import Example, Rule

_MODEL = '''
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(x))

class Net(nn.Module):
    def __init__(self, vocab=256, dim=64, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

model = Net()
'''


def _name(fqn: str) -> str:
    return fqn if fqn else "the root model"


def _shown(names: List[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class WrapOrder(Rule):
    """FSDP2 `fully_shard` runs on a module after its ancestor, or twice on one module.

    ## What it does
    Flags `fully_shard` calls on a module whose ancestor was already sharded (the root first,
    then the blocks; `for m in model.modules(): fully_shard(m)` visits the root first) and
    second `fully_shard` calls on the same module, and says which earlier call is in the way.

    ## Why is this bad?
    `fully_shard` must be applied bottom-up: the call on a parent takes over the parameters
    that no sharded child manages yet, so after the root is sharded its blocks' parameters are
    already DTensors of the root's group, and sharding a block then fails deep inside torch
    with `TypeError: Invariant encountered: value was None when it should not be`, which says
    nothing about the order. A second call on one module raises `AssertionError: Each distinct
    composable distributed API can only be applied to a module once`.

    ## Example
    ```python
    for m in model.modules():           # pre-order: the root comes first
        if isinstance(m, (Block, Net)):
            fully_shard(m)
    ```

    ## Fix
    Shard children first and the root last:
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```
    With a `model.modules()` loop, iterate `reversed(list(model.modules()))`, or leave the
    root out of the loop and call `fully_shard(model)` after it.
    """

    code = "FSD302"
    name = "wrap-order"
    severity = "error"
    summary = "FSDP2 fully_shard on a module after its ancestor, or twice on one module (torch raises)"
    applies_to = ("fsdp2",)

    VALID = [
        Example(_MODEL + '''
for m in reversed(list(model.modules())):
    if isinstance(m, (Block, Net)):
        fully_shard(m)
'''),
        Example(_MODEL + '''
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
    ]
    INVALID = [
        # model.modules() is pre-order: the root is sharded before its blocks
        Example(_MODEL + '''
for m in model.modules():
    if isinstance(m, (Block, Net)):
        fully_shard(m)
'''),
        # the root first, in two statements
        Example(_MODEL + '''
fully_shard(model)
for layer in model.layers:
    fully_shard(layer)
'''),
        # one block twice
        Example(_MODEL + '''
for layer in model.layers:
    fully_shard(layer)
fully_shard(model.layers[0])
fully_shard(model)
'''),
    ]

    def check(self, ctx):
        plan = ctx.plan
        if plan.api != "fsdp2" or plan.origin != "file":
            return
        groups: Dict[Tuple, List] = {}
        for prob in plan.problems:
            if prob.kind not in ("ancestor-already-sharded", "wrapped-twice"):
                continue
            key = (prob.kind, prob.path, prob.line, prob.related if prob.kind == "ancestor-already-sharded" else None,
                   prob.related_line)
            groups.setdefault(key, []).append(prob)
        for (kind, path, line, related, related_line), probs in groups.items():
            first = probs[0]
            mods = list(dict.fromkeys(p.module for p in probs))
            if kind == "ancestor-already-sharded":
                anc = _name(related if related is not None else "")
                classes = sorted({ctx.tree.modules[m].cls for m in mods if m in ctx.tree.modules})
                what = f"{_shown(mods)} ({', '.join(classes)})" if classes else _shown(mods)
                if related_line == line:
                    order = (f"the loop shards {anc} before its sub-modules "
                             f"(`model.modules()` and `named_modules()` visit a parent before its children)")
                else:
                    order = f"{anc} was already sharded at line {related_line}"
                exc, torch_error = "TypeError", "Invariant encountered: value was None when it should not be"
                msg = f"fully_shard on {what} runs after fully_shard on an ancestor: torch fails here"
                detail = (f"{order}. The ancestor's group already manages these parameters, and torch fails here "
                          f"with `{exc}: {torch_error}`")
                if related_line == line:
                    fix = ("shard children before parents: iterate `reversed(list(model.modules()))`, or skip the root "
                           "in the loop and call `fully_shard(model)` after it")
                else:
                    fix = (f"move the fully_shard call on {anc} (line {related_line}) after the calls on its "
                           f"sub-modules: children first, root last")
            else:
                what = _shown([_name(m) for m in mods])
                exc, torch_error = ("AssertionError",
                                    "Each distinct composable distributed API can only be applied to a module once.")
                msg = f"fully_shard is applied to {what} a second time (first at line {first.related_line}): torch raises"
                detail = f"torch raises `{exc}: {torch_error}`"
                fix = (f"remove one of the calls (lines {first.related_line} and {line}): each module belongs to "
                       f"exactly one fully_shard group")
            edits = None
            if kind == "ancestor-already-sharded" and related_line != line:
                edits = self._edits(ctx, path, related, related_line)
            yield self.finding(ctx, msg, line=line, col=first.col, path=path, module=mods[0], fix=fix,
                               fix_edits=edits, detail=detail,
                               modules=mods, related=related, related_line=related_line,
                               torch_exception=exc, torch_error=torch_error)

    @staticmethod
    def _edits(ctx, path, related, related_line):
        """The ancestor's call moved below the last call on its sub-modules (that call's loop when it is in
        one): the same edit from every finding about that ancestor, so it is made once."""
        from fsdp_lint.fix import codemods
        from fsdp_lint.fix.edits import SAFE, Fix

        later = [p.line for p in ctx.plan.problems if p.kind == "ancestor-already-sharded" and p.path == path
                 and p.related == related and p.related_line == related_line]
        src = codemods.Source.of(path)
        if src is None or not later:
            return None
        ancestor = codemods.wrap_call(src, related_line)
        last = codemods.wrap_call(src, max(later))
        if ancestor is None or last is None:
            return None
        last_stmt = src.statement(last)
        loops = src.enclosing_loops(last_stmt)
        edits = codemods.move_below(src, src.statement(ancestor), loops[-1] if loops else last_stmt)
        if edits is None:
            return None
        return Fix(f"move the fully_shard call at line {related_line} below the calls on its sub-modules", SAFE,
                   edits)
