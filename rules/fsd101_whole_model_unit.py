"""FSD101 whole-model-unit."""

import re
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._frontend import hf_wrap_blocks_text, lightning_policy_text
from fsdp_lint.rules._granularity import (
    _MODEL, block_label, block_wrap_fix, largest_submodule, managed_numel, pct, per_block_layout, where,
)


# the fix in the terms of the framework that built the plan (issue 8)
_FRAMEWORK_FIX = {
    "accelerate": ("`fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` with `fsdp_transformer_layer_cls_to_wrap: "
                   "{block}` in the accelerate config (or `FullyShardedDataParallelPlugin(auto_wrap_policy="
                   "\"transformer_based_wrap\", transformer_cls_names_to_wrap=[\"{block}\"])`)"),
    "transformers": ("`TrainingArguments(fsdp=\"full_shard auto_wrap\", fsdp_config={{\"transformer_layer_cls_to_wrap\": "
                     "[\"{block}\"]}})`"),
    "lightning": "`FSDPStrategy(auto_wrap_policy={{{block}}})`",
}


class WholeModelUnit(Rule):
    """One FSDP unit holds (nearly) the whole model.

    ## What it does
    Flags a plan in which a single unit (usually the root) owns at least
    `whole-model-fraction` (default 90 %) of the parameters FSDP manages, while the model
    repeats a block class (a transformer's layers) that could be the unit. Typical causes:
    `FSDP(model)` without an `auto_wrap_policy`; `size_based_auto_wrap_policy` passed bare, so
    its default `min_num_params=1e8` wraps nothing on a smaller model; a policy whose class
    matches nothing; FSDP2 with only `fully_shard(model)` (or an `isinstance` loop whose class
    never matches). The message names the block class and compares the peak of unsharded
    parameters per rank with the per-block plan's (the layout arithmetic of both plans). The
    block is found from the model's structure: the repeated children of the container holding
    most parameters (never a leaf layer such as a `class Linear(nn.Linear)`), with the blocks of
    a second stack of the same weight (both towers of a vision-language model, Whisper's encoder
    and decoder layers).

    A model without a repeated block class (a single block, an MLP) is never flagged: there is
    no finer unit that would lower the peak. Neither is a plan whose per-block alternative has
    the same peak (two blocks: with prefetching both are in flight anyway), nor a unit whose
    blocks hold under a quarter of it (a toy model with a large vocabulary). A container unit is
    FSD105's and a unit that only holds everything because the root was sharded first is
    FSD302's.

    ## Why is this bad?
    FSDP all-gathers a unit's parameters before its forward. With one unit, every rank holds the
    whole unsharded model during forward and backward: sharding then saves gradient and
    optimizer memory only, never parameter memory, and no all-gather overlaps with compute. The
    code looks sharded, and the first sign is an out-of-memory error at scale.

    ## Example
    ```python
    model = FSDP(model, auto_wrap_policy=size_based_auto_wrap_policy)  # min_num_params=1e8
    ```

    ## Fix
    Make every repeated block a unit:
    ```python
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    ```
    FSDP2: `for block in model.layers: fully_shard(block)`, then `fully_shard(model)`.
    """

    code = "FSD101"
    name = "whole-model-unit"
    severity = "error"
    summary = "one FSDP unit holds (nearly) the whole model: every rank gathers all of it at once"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        Example('''
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 2048)
        self.fc2 = nn.Linear(2048, 10)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())

model = MLP()
fully_shard(model)
''', note="no repeated block: nothing finer to suggest"),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(Net())
''', note="no auto_wrap_policy"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
model = FSDP(Net(), auto_wrap_policy=size_based_auto_wrap_policy)
''', note="the default min_num_params=1e8 wraps nothing"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
fully_shard(model)
''', note="FSDP2, root only"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for m in model.modules():
    if isinstance(m, nn.TransformerEncoderLayer):
        fully_shard(m)
fully_shard(model)
''', note="FSDP2 isinstance loop that matches nothing"),
    ]

    def check(self, ctx):
        plan, tree, layout, settings = ctx.plan, ctx.tree, ctx.layout, ctx.settings
        if plan.origin not in ("file", "cli") or not plan.units or plan.sharding_strategy == "NO_SHARD":
            return
        if any(getattr(p, "error", None) for p in plan.policies):
            return  # a framework raises for a wrap-class name (FSD103): there is no plan to judge
        managed = managed_numel(ctx)
        blocks = tree.repeated_blocks()
        if managed <= 0 or not blocks:
            return
        instances = tree.instances_of(blocks)
        sizes = tree.subtree_numels()
        for ul in layout.units:
            unit = ul.unit
            if ul.numel < settings.whole_model_fraction * managed or max(ul.world_size, 1) == 1:
                continue
            if any(not tree.modules[m].has_forward for m in unit.modules):
                continue  # FSD105
            if any(p.kind == "ancestor-already-sharded" and any(tree.is_ancestor(m, p.module) for m in unit.modules)
                   for p in plan.problems):
                continue  # FSD302: the root was sharded before its blocks
            owned = set(unit.params)
            inside = [f for f in instances if any(p in owned for p in tree.params_under(f))]
            # an auto-wrap policy that wraps nothing was meant to split the model: reported however
            # much of it the blocks hold (a small model with a large vocabulary)
            missed = any(p.matched == 0 and p.path == unit.path and p.line == unit.line for p in plan.policies)
            if len(inside) < 2 or (4 * sum(sizes[f] for f in inside) < ul.numel and not missed):
                continue  # blocks that hold under a quarter of the unit would barely lower its peak
            alt, alt_layout = per_block_layout(ctx, blocks)
            if alt is None:
                continue
            peak = layout.memory.unsharded_peak_bytes
            alt_peak = alt_layout.memory.unsharded_peak_bytes
            if alt_peak >= peak:
                continue
            yield self._finding(ctx, ul, blocks, inside, managed, peak, alt, alt_layout, alt_peak)
            return

    def _finding(self, ctx, ul, blocks, inside, managed, peak, alt, alt_layout, alt_peak):
        from fsdp_lint.humanize import human_bytes, human_count

        plan, tree = ctx.plan, ctx.tree
        unit = ul.unit
        block = block_label(blocks)
        what = "the root unit" if unit.is_root else f"the unit `{unit.module}`"
        cause = self._cause(ctx, unit, ul, managed)
        n_alt = len(alt.units) - 1
        msg = (f"{what} holds {pct(ul.numel, managed)} of the model ({human_count(ul.numel)} of "
               f"{human_count(managed)} parameters): unsharded peak {human_bytes(peak)}/rank vs "
               f"{human_bytes(alt_peak)} with one unit per {block}")
        detail = (f"{len(inside)} {block} blocks in it; {cause}. Every rank all-gathers all of it at once: peak unsharded parameters per rank "
                  f"{human_bytes(peak)} vs {human_bytes(alt_peak)} with one unit per {block} ({n_alt} {block} units "
                  f"+ root)")
        if plan.origin == "cli":
            fix = f"make every {block} a unit: `" + " ".join(f"--wrap {b}" for b in blocks) + "`"
        elif hf_wrap_blocks_text(ctx, block):
            fix = f"make every {block} a unit: " + hf_wrap_blocks_text(ctx, block)
        elif _FRAMEWORK_FIX.get(getattr(plan, "framework", None)):
            fix = f"make every {block} a unit: " + _FRAMEWORK_FIX[plan.framework].format(block=block)
        else:
            fix = "make every " + block + " a unit: " + block_wrap_fix(tree, plan.api, blocks)
        return self.finding(ctx, msg, **where(ctx, unit.path, unit.line, unit.col), module=unit.module, fix=fix,
                            detail=detail, block=block, peak_bytes=peak,
                            per_block_peak_bytes=alt_peak, per_block_units=n_alt + 1,
                            collectives_per_step=ctx.layout.collectives_per_step,
                            per_block_collectives_per_step=alt_layout.collectives_per_step)

    def _cause(self, ctx, unit, ul, managed) -> str:
        from fsdp_lint.humanize import human_count

        plan, tree = ctx.plan, ctx.tree
        others = [u for u in ctx.layout.units if u.unit is not unit and u.numel]
        other_numel = sum(u.numel for u in others)
        if plan.origin == "cli":
            pats = " ".join(f"--wrap {p}" for pol in plan.policies for p in pol.classes)
            return f"`{pats}` selects nothing that holds the model's weight" if not others else \
                f"the modules `{pats}` selects hold only {pct(other_numel, managed)} of the parameters"
        if plan.api == "fsdp1":
            pols = [p for p in plan.policies if p.path == unit.path and p.line == unit.line]
            if not pols and getattr(plan, "framework", None) == "accelerate" and not others:
                return ("accelerate passes no `auto_wrap_policy` to FSDP (`SIZE_BASED_WRAP` with "
                        "`fsdp_min_num_params` 0, or `NO_WRAP`)")
            if not pols:
                if not others:
                    return "`FSDP(...)` has no `auto_wrap_policy` and nothing is wrapped before it"
                return (f"`FSDP(...)` has no `auto_wrap_policy`; the units wrapped before it hold only "
                        f"{pct(other_numel, managed)} of the parameters")
            pol = pols[0]
            desc = lightning_policy_text(pol.desc) if getattr(plan, "framework", None) == "lightning" else pol.desc
            if pol.matched == 0:
                m = re.search(r"min_num_params=(\d+)", pol.desc)
                if pol.desc.startswith("size_based_auto_wrap_policy") and m:
                    threshold = int(m.group(1))
                    default = " (the default when the policy is passed without `functools.partial`)" \
                        if threshold == 100_000_000 else ""
                    big, n = largest_submodule(tree)
                    return (f"`size_based_auto_wrap_policy` with `min_num_params={threshold:,}`{default} wraps "
                            f"nothing: the largest sub-module, `{big}`, holds {human_count(n)} parameters")
                return f"the auto-wrap policy `{desc}` wraps nothing"
            return (f"the auto-wrap policy `{desc}` wraps {pol.matched} module(s) holding only "
                    f"{pct(other_numel, managed)} of the parameters")
        call = f"fully_shard({tree.expr(unit.module)})" if len(unit.modules) == 1 else "fully_shard([...])"
        if not others:
            return f"`{call}` is the only call that shards parameters"
        return f"the groups sharded before `{call}` hold only {pct(other_numel, managed)} of the parameters"
