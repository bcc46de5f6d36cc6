"""FSD203 mixed-dtype-unit."""
from typing import List

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._flat_params import (
    _FSDP1, _MODEL, anchor, event_positions, fsdp1_torch_error, group_units, join_lines, split_grouping,
    uniform_cover, units_brief, units_label, where, wrap_seq, wrapped_how,
)
from fsdp_lint.rules._peft import dtype_fix
from fsdp_lint.model.tree import describe_params, param_patterns
from fsdp_lint.replay.fsdp2_torch import uniform_dtype_includes_frozen

_FSDP2 = '''
from torch.distributed.fsdp import fully_shard
'''


def _dtype_groups(tree, params: List[str]):
    """{dtype: [fqn, ...]} of the floating parameters, in first-seen order."""
    out = {}
    for p in params:
        info = tree.params[p]
        if info.is_floating:
            out.setdefault(info.dtype, []).append(p)
    return out


class MixedDtypeUnit(Rule):
    """A unit mixes parameter dtypes (FSDP1), or a group mixes dtypes among trainable parameters (FSDP2).

    ## What it does
    Flags FSDP1 units whose floating-point parameters do not all have one dtype, and FSDP2
    `fully_shard` groups whose *trainable* parameters do not (on torch 2.6 and 2.7, whose FSDP2 checks
    every parameter of the group, frozen ones too: any parameters), and points at the statement that
    cast part of the model (`model.layers[0].to(torch.bfloat16)`, `model.norm.float()`) and at
    the wrap call.

    ## Why is this bad?
    FSDP1 flattens each unit into one `FlatParameter` of a single dtype and raises at wrap time:
    `ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and
    torch.float32`. FSDP2 accepts the call, but its gradient reduce-scatter needs one dtype per
    group and the first forward fails with `AssertionError: FSDP expects uniform original
    parameter dtype but got {torch.bfloat16, torch.float32}` -- after the job was scheduled.
    Keeping "sensitive" layers (norms, router, head) in float32 by casting them back is the
    usual cause.

    ## Example
    ```python
    model = Net().to(torch.bfloat16)
    model.head.float()                  # keep the head in fp32
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)                  # root group: bf16 embed + fp32 head
    ```

    ## Fix
    Keep the parameters in one dtype and let mixed precision pick the compute dtype
    (`MixedPrecisionPolicy(param_dtype=torch.bfloat16)` for FSDP2, `MixedPrecision(...)` for
    FSDP1), or give the odd modules a group of their own:
    ```python
    fully_shard(model.head)             # the fp32 head is its own group
    fully_shard(model)
    ```
    """

    code = "FSD203"
    name = "mixed-dtype-unit"
    severity = "error"
    summary = "an FSDP1 unit mixes dtypes, or an FSDP2 group mixes dtypes among trainable params (torch raises)"

    VALID = [
        # FSDP1: fp32 parameters, bf16 compute through MixedPrecision
        Example(_MODEL + _FSDP1 + '''
from torch.distributed.fsdp import MixedPrecision
model = Net()
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
             mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
'''),
        # FSDP2: the fp32 head is a group of its own
        Example(_MODEL + _FSDP2 + '''
model = Net().to(torch.bfloat16)
model.head.float()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model.head)
fully_shard(model)
'''),
        # FSDP2: mixed dtypes among frozen parameters only are fine (torch 2.8 and later; 2.6/2.7 raise)
        Example(_MODEL + _FSDP2 + '''
model = Net()
model.embed.to(torch.bfloat16)
model.embed.requires_grad_(False)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
    ]
    INVALID = [
        # FSDP1: one sub-module of every block cast to bf16
        Example(_MODEL + _FSDP1 + '''
model = Net()
for layer in model.layers:
    layer.q.to(torch.bfloat16)
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        # FSDP2: the head cast back to fp32 stays in the root group with the bf16 embedding
        Example(_MODEL + _FSDP2 + '''
model = Net().to(torch.bfloat16)
model.head.float()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
        # FSDP2: trainable bf16 embedding next to the fp32 head
        Example(_MODEL + _FSDP2 + '''
model = Net()
model.embed.to(torch.bfloat16)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if plan.origin not in ("file", "cli") or plan.api not in ("fsdp1", "fsdp2"):
            return
        bad = []
        for u in plan.units:
            if len(_dtype_groups(tree, self._considered(ctx, u))) > 1:
                bad.append(u)

        def sig(u):
            groups = _dtype_groups(tree, self._considered(ctx, u))
            return tuple((d, tuple(param_patterns(tree, fs, within=u.module,
                                                  others=[p for p in u.params if p not in fs])))
                         for d, fs in groups.items())

        for units in group_units(bad, sig):
            yield self._finding(ctx, units)

    def _considered(self, ctx, u) -> List[str]:
        """The parameters that must share one dtype: FSDP1's unit, all of them; FSDP2's group, the
        trainable ones -- all of them, frozen ones too, on a torch that checks those (2.6, 2.7)."""
        tree = ctx.tree
        if ctx.plan.api == "fsdp1" or uniform_dtype_includes_frozen():
            return list(u.params)
        return [p for p in u.params if tree.params[p].requires_grad]

    def _finding(self, ctx, units):
        plan, tree = ctx.plan, ctx.tree
        u = units[0]
        considered = self._considered(ctx, u)
        groups = _dtype_groups(tree, considered)
        seq = wrap_seq(units)
        # the dtype that some statement changed last is the odd one out
        last_change = {}
        for d in groups:
            for x in units:
                for p in _dtype_groups(tree, self._considered(ctx, x)).get(d, []):
                    evs = [e for e in plan.param_events.get(p, []) if e.kind == "dtype" and e.seq < seq]
                    if evs:
                        last_change[d] = max(last_change.get(d, -1), evs[-1].seq)
        parts = []
        for d, fs in groups.items():
            others = [p for p in u.params if p not in fs]
            parts.append(f"{d}: {describe_params(tree, fs, within=u.module, others=others)}")
        odd = max(groups, key=lambda d: (last_change.get(d, -1), -sum(tree.params[p].numel for p in groups[d])))
        odd_params = [p for x in units for p in _dtype_groups(tree, self._considered(ctx, x)).get(odd, [])]
        positions = event_positions(ctx, odd_params, "dtype", seq)
        lines = [where(p, ln, ctx.path) for p, ln in positions]
        cast = (f"cast to {odd} at {join_lines(lines)}" if lines
                else f"the {odd} parameters are created that way by the model")
        mixes = "each mix" if len(units) > 1 else "mixes"
        dtypes_set = "{" + ", ".join(f"torch.{d}" for d in sorted(groups)) + "}"
        if plan.api == "fsdp1":
            torch_says = fsdp1_torch_error(ctx, u) \
                or f"Must flatten tensors with uniform dtype but got torch.{list(groups)[0]} and torch.{list(groups)[1]}"
            msg = f"{units_brief(units)} {mixes} parameter dtypes {dtypes_set}: torch raises at wrap time"
            detail = (f"{units_label(units)} ({wrapped_how(ctx, u)}): {'; '.join(parts)} ({cast}). "
                      f"torch raises at wrap time: `ValueError: {torch_says}`")
            exc, torch_error = "ValueError", torch_says
            remedy = ("keep every parameter in one dtype before wrapping (e.g. `model.to(torch.float32)`) and get "
                      "low-precision compute from `mixed_precision=MixedPrecision(param_dtype=torch.bfloat16)`")
        else:
            label = units_label(units, "FSDP2 group")
            how = wrapped_how(ctx, u).replace("wrapped at", "fully_shard at")
            among = ("parameters (this torch checks frozen ones too)" if uniform_dtype_includes_frozen()
                     else "trainable parameters")
            msg = f"{units_brief(units, 'FSDP2 group')} {mixes} dtypes {dtypes_set} among {among}: the first forward fails"
            detail = (f"{label} ({how}): {'; '.join(parts)} ({cast}). fully_shard accepts it, but the first forward "
                      f"fails: `AssertionError: FSDP expects uniform original parameter dtype but got {dtypes_set}`")
            exc, torch_error = "AssertionError", f"FSDP expects uniform original parameter dtype but got {dtypes_set}"
            remedy = ("keep every parameter in one dtype (e.g. `model.to(torch.float32)`) and get low-precision compute "
                      "from `fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))`")
        split, policy = self._split(ctx, units, odd)
        peft = dtype_fix(ctx, considered)
        if peft:
            remedy, split = peft, ""
        return self.finding(ctx, msg, **anchor(ctx, u, positions), module=u.module, fix=remedy + split, detail=detail,
                            units=[x.module for x in units], dtypes=sorted(groups), policy=policy,
                            torch_exception=exc, torch_error=torch_error)

    def _split(self, ctx, units, odd: str):
        """("; or give the bf16 modules a unit/group of their own: ...", the FSDP1 policy expression)."""
        tree, plan = ctx.tree, ctx.plan
        if plan.api == "fsdp1":
            grouping = split_grouping(ctx, units, key=lambda p: p.dtype,
                                      predicate=lambda v: f"p.dtype == torch.{v}")
            if grouping is None:
                return "", None
            mods = grouping["globs"]
            shown = ", ".join(f"`{m}`" for m in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
            return (f"; or wrap {shown} ({', '.join(grouping['classes'])}) as FSDP units of their own: "
                    f"{grouping['code']}", grouping["policy"])
        # FSDP2: a group of their own for the odd-dtype modules (trainable params only count)
        chosen: List[str] = []
        for u in units:
            considered = self._considered(ctx, u)
            cover = uniform_cover(tree, u.module, considered, key=lambda p: p.dtype).get(odd)
            if not cover:
                return "", None
            chosen += [m for m in cover if m not in chosen]
        calls = [f"fully_shard({tree.expr(m)})" for m in chosen[:3]]
        more = f" (and {len(chosen) - 3} more)" if len(chosen) > 3 else ""
        return (f"; or shard the {odd} modules as groups of their own before "
                f"{'their parents' if len(units) > 1 or units[0].module else 'the root'}: "
                f"`{'`, `'.join(calls)}`{more}", None)
