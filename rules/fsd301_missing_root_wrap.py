"""FSD301 missing-root-wrap."""
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


class MissingRootWrap(Rule):
    """Sub-modules are wrapped, but the root model is not.

    ## What it does
    Flags plans where blocks are sharded (`fully_shard(block)`, or FSDP1 child wraps such as
    `model.encoder = FSDP(model.encoder)`) but no unit covers the root model, and names the
    parameters left outside every unit.

    ## Why is this bad?
    Parameters outside every unit (typically the embeddings, the final norm and the output head)
    stay ordinary tensors replicated on every rank. Nothing all-reduces or reduce-scatters their
    gradients, so each rank updates them with its own local gradient and the replicas drift apart
    from the first step on. Nothing crashes: the model just trains wrong.

    ## Example
    ```python
    for layer in model.layers:
        fully_shard(layer)
    # the root is never sharded
    ```

    ## Fix
    Shard the root last, after its children:
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```
    For FSDP1, wrap the whole model in an outer `FSDP(model, ...)` after the manual child wraps.
    """

    code = "FSD301"
    name = "missing-root-wrap"
    severity = "error"
    summary = "sub-modules are wrapped but the root is not: leftover params are never synchronised"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
for i, layer in enumerate(model.layers):
    model.layers[i] = FSDP(layer)
'''),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.origin not in ("file", "cli") or not plan.units or plan.root_wrapped:
            return
        leftover = plan.leftover_params
        trainable = [p for p in leftover if tree.params[p].requires_grad]
        if not leftover:
            return
        numel = sum(tree.params[p].numel for p in leftover)
        shown = ", ".join(leftover[:4]) + (f" and {len(leftover) - 4} more" if len(leftover) > 4 else "")
        last = max(plan.units, key=lambda u: u.seq)
        if plan.api == "fsdp2":
            fix = "add `fully_shard(model)` after the per-block calls (children first, root last)"
        else:
            fix = "wrap the root too: `model = FSDP(model, ...)` after the child wraps"
        if trainable:
            msg = (f"the root model is not wrapped: {len(leftover)} parameters ({numel:,} elements) are outside every "
                   f"FSDP unit and their gradients are never synchronised across ranks")
            severity = "error"
        else:
            msg = (f"the root model is not wrapped: {len(leftover)} frozen parameters ({numel:,} elements) stay "
                   f"replicated on every rank")
            severity = "warning"
        yield self.finding(ctx, msg, line=last.line, col=last.col, path=last.path, module="", fix=fix,
                           detail=f"outside every unit: {shown}", severity=severity, params=leftover, fix_edits=self._edits(plan, last))

    @staticmethod
    def _edits(plan, last):
        """The root wrap after the statement (or the loop over the blocks) of the last wrap call, with
        that call's keyword arguments (mesh, mixed precision, ...), those naming the block excepted."""
        from fsdp_lint.fix import codemods
        from fsdp_lint.fix.edits import SAFE, Fix

        src = codemods.Source.of(last.path)
        call = codemods.wrap_call(src, last.line, last.col) if src is not None else None
        if call is None or not call.args or call.args[0].keyword is not None:
            return None
        stmt = src.statement(call)
        loops = src.enclosing_loops(stmt)
        root = codemods.model_name(src, call.args[0].value, loops)
        if root is None or root in ("self", "cls"):
            return None         # a method wrapping its own object's parts: the root wrap is its caller's
        kws = codemods.keywords_text(src, call, without=codemods.loop_targets(loops) | {root})
        callee = src.code(call.func).strip()
        args = ", ".join([root] + kws)
        text = f"{callee}({args})" if plan.api == "fsdp2" else f"{root} = {callee}({args})"
        edit = src.insert_after(loops[-1] if loops else stmt, text)
        return Fix(f"add `{text}` after the last wrap", SAFE, [edit])
