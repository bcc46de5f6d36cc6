"""FSD105 container-unit."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import _MODEL, where


def _fsdp1_edits(ctx, unit, info, kid_classes, is_dict: bool):
    """FSDP1: the policy names the element class instead of the container's (when every container of
    that class the policy wrapped holds one element class); a container wrapped by hand,
    `model.layers = FSDP(model.layers, **kw)`, becomes a loop that wraps each element in its place."""
    from fsdp_lint.fix import policies
    from fsdp_lint.fix.edits import SAFE, Fix

    plan, tree = ctx.plan, ctx.tree
    if unit.origin == "call" and len(unit.modules) == 1:
        edits = policies.wrap_elements(unit.path, unit.line, unit.col, is_dict)
        return Fix("wrap each element of the container in its place", SAFE, edits) if edits else None
    if unit.origin != "policy" or len(kid_classes) != 1:
        return None
    found = policies.named_in_policy(plan, unit, [c for c in info.mro if c not in ("Module", "object")])
    if found is None:
        return None
    path, named = found
    wrapped = [m for u in plan.units if u.origin == "policy" for m in u.modules
               if m and named in tree.modules[m].mro]
    if {tree.modules[c].cls for m in wrapped for c in tree.modules[m].children} != set(kid_classes):
        return None       # containers of that class hold other elements too: which class is meant is a choice
    module = policies.class_module(tree, kid_classes[0])
    edits = policies.replace_class(path, named, kid_classes[0], module) if module else None
    return Fix(f"name `{kid_classes[0]}` instead of `{named}` in the auto-wrap policy", SAFE, edits) if edits else None


class ContainerUnit(Rule):
    """A container without `forward` (`ModuleList`, `ModuleDict`) is an FSDP unit.

    ## What it does
    Flags units whose module has no `forward` of its own: `fully_shard(model.layers)` or
    `FSDP(model.layers)` on an `nn.ModuleList`/`nn.ModuleDict`, `ModuleWrapPolicy({nn.ModuleList})`,
    or a custom module class that only holds other modules. It points at the wrap call and
    names the elements that should be the units instead.

    ## Why is this bad?
    FSDP all-gathers a unit's parameters in hooks around the unit's `forward`. A container's
    `forward` is never called: its parent iterates over it and calls the elements. FSDP2 refuses
    a lone `ModuleList`/`ModuleDict` (`ValueError: fully_shard does not support containers that do
    not implement forward`); inside a `fully_shard([...])` list, or as a custom class, it is
    accepted and its parameters are never gathered in time. FSDP1 accepts the container
    with only a warning and never all-gathers its FlatParameter: the layers inside run on sharded
    storage.
    Even where it worked, one unit holding every layer would all-gather the whole stack at once.

    ## Example
    ```python
    fully_shard(model.layers)  # nn.ModuleList
    fully_shard(model)
    ```

    ## Fix
    Shard the elements, one unit each:
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```
    """

    code = "FSD105"
    name = "container-unit"
    severity = "error"
    summary = "a container without forward (ModuleList, ModuleDict) is an FSDP unit"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        return self.head(self.blocks(x))

model = Stack()
fully_shard(model.blocks)
fully_shard(model)
''', note="nn.Sequential has a forward"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

class WithHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Net()
        self.extra_heads = nn.ModuleList()       # no extra heads in this configuration

    def forward(self, x):
        return self.net(x)

# a LoRA-style rule, `all(p.requires_grad for p in m.parameters())`, is True for the empty container too
def wrap_it(m):
    return isinstance(m, Block) or (isinstance(m, nn.ModuleList) and all(p.requires_grad for p in m.parameters())
                                    and not any(True for _ in m.parameters()))

def policy(module, recurse, nonwrapped_numel):
    return recurse or lambda_auto_wrap_policy(module, recurse, nonwrapped_numel, wrap_it)

model = FSDP(WithHeads(), auto_wrap_policy=policy)
''', note="FSDP1: a container without parameters gathers nothing"),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
fully_shard(model.layers)
fully_shard(model)
''', note="FSDP2 raises ValueError"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net()
model.layers = FSDP(model.layers)
model = FSDP(model)
''', note="FSDP1 only warns"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({nn.ModuleList}))
''', note="FSDP1 policy naming the container class"),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.origin not in ("file", "cli"):
            return
        for unit in plan.units:
            for m in unit.modules:
                info = tree.modules.get(m)
                if info is None or info.has_forward or not m:
                    continue
                if plan.api != "fsdp2" and not any(True for _ in tree.params_under(m)):
                    continue        # FSDP1 gathers nothing for it: no element runs on sharded parameters
                yield self._finding(ctx, unit, m)

    def _finding(self, ctx, unit, fqn):
        from fsdp_lint.humanize import human_count

        plan, tree = ctx.plan, ctx.tree
        info = tree.modules[fqn]
        is_dict = "ModuleDict" in info.mro
        torch_container = is_dict or "ModuleList" in info.mro
        kids = [tree.modules[c] for c in info.children]
        kid_classes = sorted({k.cls for k in kids})
        numel = sum(tree.params[p].numel for p in tree.params_under(fqn))
        expr = tree.expr(fqn)
        what = (f"`{expr}` ({info.cls}, {len(kids)} element(s): {', '.join(kid_classes) or 'none'}; "
                f"{human_count(numel)} parameters) is an FSDP unit, but it has no `forward`")
        if plan.api == "fsdp2":
            if len(unit.modules) == 1 and torch_container:
                why = ("torch raises `ValueError: fully_shard does not support containers that do not implement "
                       "forward`")
            else:
                why = ("its forward is never called, so FSDP2's hooks never all-gather its parameters before the "
                       "elements use them")
            it = expr + (".values()" if is_dict else "")
            fix = f"shard the elements instead: `for layer in {it}: fully_shard(layer)`, then `fully_shard(model)`"
        else:
            why = ("FSDP1 accepts it with only a warning (\"FSDP will not all-gather parameters for containers "
                   "that do not implement forward\"): it gathers a unit in the wrapper's forward, which the parent "
                   "never calls (it iterates the container), so the elements run on sharded parameters")
            if unit.origin == "policy" and len(kid_classes) == 1:
                fix = (f"name the element class in the policy, not the container: "
                       f"`ModuleWrapPolicy({{{kid_classes[0]}}})`")
            elif len(kid_classes) == 1:
                fix = (f"wrap the elements, not the container: `auto_wrap_policy=ModuleWrapPolicy("
                       f"{{{kid_classes[0]}}})` on the outer `FSDP(model)`")
            else:
                fix = "wrap the elements of the container, not the container"
        if plan.api == "fsdp2":
            edits = self._edits(unit, is_dict) if len(unit.modules) == 1 else None
        else:
            edits = _fsdp1_edits(ctx, unit, info, kid_classes, is_dict)
        return self.finding(ctx, what, **where(ctx, unit.path, unit.line, unit.col), module=fqn, fix=fix,
                            detail=why, container_class=info.cls, fix_edits=edits)

    @staticmethod
    def _edits(unit, is_dict: bool):
        """`fully_shard(model.layers, **kw)` as a statement of its own becomes a loop over the elements
        with the same keyword arguments."""
        import libcst as cst

        from fsdp_lint.fix import codemods
        from fsdp_lint.fix.edits import SAFE, Fix

        src = codemods.Source.of(unit.path)
        call = codemods.wrap_call(src, unit.line, unit.col) if src is not None else None
        if call is None or not call.args or call.args[0].keyword is not None:
            return None
        stmt = src.statement(call)
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call):
            return None      # its result is used (assigned, returned): not a plain statement to replace
        container = src.code(call.args[0].value).strip() + (".values()" if is_dict else "")
        var = next(n for n in ("block", "layer", "element", "_block") if n not in codemods.names_in(call))
        kws = codemods.keywords_text(src, call, without=set())
        callee = src.code(call.func).strip()
        indent = src.indent_of(stmt)
        line = src.start(stmt)[0]
        end = src.end(stmt.body[0])     # a comment after the call stays where it was
        text = f"for {var} in {container}:\n{indent}    {callee}({', '.join([var] + kws)})"
        start_col = len(indent) + 1
        from fsdp_lint.fix.edits import Edit

        return Fix(f"shard the elements: `for {var} in {container}: {callee}({var}, ...)`", SAFE,
                   [Edit(unit.path, line, start_col, end[0], end[1], text)])
