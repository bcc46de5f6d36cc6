"""FSD401 tied-params-split."""
from typing import List, Optional

from fsdp_lint.check.rule import Example, Rule

_MODEL = '''
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(self.norm(x)).relu())

class GPT(nn.Module):
    def __init__(self, vocab=1000, dim=64, layers=4):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight   # weight tying

    def forward(self, tokens):
        x = self.tok_emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))
'''


def module_expr(fqn: str, root: str = "model") -> str:
    """`layers.0.attn` -> `model.layers[0].attn` (how the user's code names the module)."""
    out = root
    for part in fqn.split(".") if fqn else []:
        if part.isdigit():
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def _common_ancestor(fqns: List[str]) -> str:
    parts = [f.split(".") if f else [] for f in fqns]
    common: List[str] = []
    for level in zip(*parts):
        if all(p == level[0] for p in level):
            common.append(level[0])
        else:
            break
    return ".".join(common)


def _unit_name(unit) -> str:
    if unit is None:
        return "no FSDP unit"
    if unit.is_root:
        return "the root unit"
    return "unit " + ", ".join(f"`{m}`" for m in unit.modules)


class TiedParamsSplit(Rule):
    """A shared (tied) parameter is used by modules that land in different FSDP units.

    ## What it does
    Flags parameters that are registered on several modules (weight tying, e.g. `lm_head.weight =
    tok_emb.weight`) when those modules fall in different FSDP units, and names the modules, the
    units and the wrap call that separates them.

    ## Why is this bad?
    A FSDP unit owns its parameters: it shards them, all-gathers them and reduces their gradients.
    A parameter can belong to only one unit. With FSDP2 the first forward raises ("Parameter
    'lm_head.weight' is shared with a parameter already managed by another FSDP group"). With FSDP1
    and `use_orig_params=False` nothing raises: each unit flattens its own copy of the tensor, the
    two copies receive different gradients and the weights are silently untied after the first
    optimizer step. With `use_orig_params=True` the forward crashes with shape errors such as
    "'weight' must be 2-D".

    ## Example
    ```python
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model.lm_head)      # lm_head.weight is tok_emb.weight
    fully_shard(model)
    ```

    ## Fix
    Put all modules that share the parameter in one unit. FSDP2: shard them as one group,
    ```python
    fully_shard([model.tok_emb, model.lm_head])
    fully_shard(model)
    ```
    FSDP1: do not wrap one of them on its own (leave the head out of the auto-wrap policy and do not
    wrap it by hand) so that both stay in their common parent's unit, usually the root.
    """

    code = "FSD401"
    name = "tied-params-split"
    severity = "error"
    summary = "a shared (tied) parameter's modules fall in different FSDP units"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = GPT()
for block in model.blocks:
    fully_shard(block)
fully_shard([model.tok_emb, model.lm_head])
fully_shard(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = GPT()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
''', note="both tied modules stay in the root group"),
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
model = GPT()
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy)
'''),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = GPT()
for block in model.blocks:
    fully_shard(block)
fully_shard(model.lm_head)
fully_shard(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = GPT()
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block, nn.Embedding}))
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = GPT()
model.lm_head = FSDP(model.lm_head, use_orig_params=True)
model = FSDP(model, use_orig_params=True)
'''),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.origin not in ("file", "cli") or not plan.units:
            return
        ignored = set(plan.ignored_params)
        for info in tree.params.values():
            if not info.aliases or info.fqn in ignored:
                continue
            owners: List[str] = []
            for name in info.all_fqns:
                mod = name.rpartition(".")[0]
                # a path missing from the tree is a module instance registered twice (e.g. one block
                # repeated in a ModuleList): the same module, not a second one sharing the tensor
                if mod in tree.modules and mod not in owners:
                    owners.append(mod)
            unit_of = {m: plan.unit_of_module(m) for m in owners}
            distinct = []
            for u in unit_of.values():
                if not any(u is d for d in distinct):
                    distinct.append(u)
            if len(distinct) < 2:
                continue
            yield self._finding(ctx, info, owners, unit_of)

    def _finding(self, ctx, info, owners, unit_of):
        plan = ctx.plan
        lca = _common_ancestor(owners)
        outer = plan.unit_of_module(lca)
        culprits = sorted({id(u): u for u in unit_of.values() if u is not None and u is not outer}.values(),
                          key=lambda u: u.seq)
        anchor = culprits[0] if culprits else next(u for u in unit_of.values() if u is not None)
        names = f"`{info.fqn}` (also " + ", ".join(f"`{n}`" for n in info.aliases) + ")"
        where = "; ".join(
            f"`{m or '<root>'}` in {_unit_name(u)}" + (f" (line {u.line})" if u is not None and u.line else "")
            for m, u in unit_of.items())
        msg = f"tied parameter {names} is split across FSDP units: "
        detail = f"the modules: {where}"
        details = {}
        if plan.api == "fsdp2":
            if any(u is None for u in unit_of.values()):
                msg += "the weights are no longer tied"
                detail += (": only the sharded module gets the DTensor parameter, the other keeps a plain replicated "
                           "copy, so the weights are no longer tied")
            else:
                msg += "torch raises at the first forward"
                detail += (f": torch raises at the first forward (\"Parameter '{info.aliases[0]}' is shared with a "
                           "parameter already managed by another FSDP group\")")
            fix = self._fsdp2_fix(owners, unit_of, outer)
            details["group"] = self._members(owners, unit_of, outer)
            details["fix_edits"] = self._edits(ctx, details["group"], culprits)
        else:
            if plan.use_orig_params:
                msg += "the forward crashes with a shape error"
                detail += ": with use_orig_params=True the forward crashes with a shape error (\"'weight' must be 2-D\")"
            else:
                msg += "the weights are silently untied after the first optimizer step"
                detail += (": each unit flattens its own copy of the tensor, so the weights are silently untied "
                           "after the first optimizer step")
            fix = self._fsdp1_fix(owners, unit_of, outer, culprits)
            details["fix_edits"] = _fsdp1_edits(ctx, culprits)
        return self.finding(ctx, msg, line=anchor.line, col=anchor.col, path=anchor.path, module=owners[-1],
                            fix=fix, detail=detail, param=info.fqn, modules=owners, **details)

    @staticmethod
    def _edits(ctx, members, culprits):
        return _group_edits(ctx, members, culprits)

    @staticmethod
    def _members(owners, unit_of, outer) -> List[str]:
        """The modules of one merged group: every module of the units that split the tie (keeping the
        user's own grouping, e.g. `[norm, output]`), and the sharing modules left to the outer unit."""
        members: List[str] = []
        for m in owners:
            u = unit_of[m]
            picks = list(u.modules) if u is not None and u is not outer else [m]
            for pick in picks:
                if pick not in members:
                    members.append(pick)
        return [m for m in members
                if not any(o != m and (o == "" or m.startswith(o + ".")) for o in members)]

    def _fsdp2_fix(self, owners, unit_of, outer: Optional[object]) -> str:
        members = self._members(owners, unit_of, outer)
        calls = sorted({(u.line, module_expr(u.modules[0]) if len(u.modules) == 1
                         else "[" + ", ".join(module_expr(x) for x in u.modules) + "]")
                        for u in unit_of.values() if u is not None and u is not outer and not u.is_root})
        instead = ""
        if calls:
            instead = " instead of " + ", ".join(f"`fully_shard({c})` (line {ln})" for ln, c in calls)
        if len(members) >= 2:
            group = ", ".join(module_expr(m) for m in members)
            return (f"shard the modules that share the parameter as one group: `fully_shard([{group}])`{instead}, "
                    "before `fully_shard(model)`")
        return (f"do not shard {', '.join(f'`{module_expr(o)}`' for o in owners[1:])} on its own; keep the modules "
                f"that share the parameter in one `fully_shard` call{instead}")

    @staticmethod
    def _fsdp1_fix(owners, unit_of, outer, culprits) -> str:
        target = _unit_name(outer) if outer is not None else "one FSDP unit"
        parts = []
        for u in culprits:
            mods = ", ".join(f"`{m}`" for m in u.modules)
            if u.origin == "policy":
                parts.append(f"exclude {mods} ({u.cls}) from the auto-wrap policy at line {u.line}")
            else:
                parts.append(f"do not wrap {mods} separately (the FSDP call at line {u.line})")
        how = "; ".join(parts) if parts else "wrap a common parent of the modules instead"
        shown = ", ".join(f"`{o or '<root>'}`" for o in owners)
        return f"keep {shown} in {target}: {how}"


def _group_edits(ctx, members, culprits):
    """FSDP2: the last of the calls that split the tie shards the whole group (`fully_shard([emb, norm,
    output], ...)`, its keyword arguments kept); the other calls go. Only for calls that are statements
    of their own in one file, outside loops."""
    import libcst as cst

    from fsdp_lint.fix import codemods
    from fsdp_lint.fix.edits import SAFE, Fix

    units = [u for u in culprits if not u.is_root]
    if len(members) < 2 or not units or len({u.path for u in units}) != 1:
        return None
    src = codemods.Source.of(units[0].path)
    if src is None:
        return None
    stmts = []
    for u in units:
        call = codemods.wrap_call(src, u.line, u.col)
        stmt = src.statement(call) if call is not None else None
        if stmt is None or not call.args or call.args[0].keyword is not None or src.enclosing_loops(stmt) \
                or not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                        and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call):
            return None
        stmts.append((call, stmt))
    keep, _ = stmts[-1]
    first = keep.args[0].value
    if isinstance(first, cst.List):
        first = first.elements[0].value if first.elements else None
    root = codemods.model_name(src, first, []) if first is not None else None
    if root is None:
        return None
    group = "[" + ", ".join(ctx.tree.expr(m, root=root) for m in members) + "]"
    edits = [src.replace(keep.args[0].value, group)] + [src.remove_statement(st) for _, st in stmts[:-1]]
    return Fix(f"shard the modules that share the parameter as one group: `fully_shard({group}, ...)`", SAFE, edits)


def _fsdp1_edits(ctx, culprits):
    """FSDP1: the units that split the tie go, so the modules stay in their common parent's unit (usually
    the root): a class the auto-wrap policy names is taken out of its class set -- when every unit that
    class makes splits the tie -- and `model.head = FSDP(model.head, ...)` is removed."""
    from fsdp_lint.fix.edits import SAFE, Fix
    from fsdp_lint.fix.policies import unwrap_units

    found = unwrap_units(ctx.plan, ctx.tree, culprits)
    if found is None:
        return None
    edits, named = found
    what = ", ".join(f"`{c}`" for c in named)
    title = (f"take {what} out of the auto-wrap policy" if named else "do not wrap the tied module on its own") + \
        " (the tied modules stay in one unit)"
    return Fix(title, SAFE, edits)
