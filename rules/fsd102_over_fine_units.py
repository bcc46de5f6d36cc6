"""FSD102 over-fine-units."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.model.tree import dtype_itemsize
from fsdp_lint.rules._granularity import (_MODEL, block_label, block_wrap_fix, per_block_layout,
                                                     where)


def _collectives(layout) -> str:
    return (f"{layout.collectives_per_step} collectives per step ({layout.all_gathers_per_step} all-gathers + "
            f"{layout.reduce_scatters_per_step} reduce-scatters)")


class OverFineUnits(Rule):
    """Units finer than the repeated block: too many small collectives.

    ## What it does
    Flags two shapes of over-fine plans and compares the number of collectives per training
    step with the per-block plan's:

    - most units (more than `over-fine-fraction`) sit inside instances of the model's repeated
      block class: every `Linear`, every attention projection (`ModuleWrapPolicy({nn.Linear})`,
      `fully_shard(block.attn.q_proj)`, ...);
    - most units all-gather less than `collective-floor-bytes` (default 1 MiB) per rank, and
      together they move at least twice the floor, so merging them would give units above it
      (a toy model whose whole weight is below that is left alone).

    Units inside a block that separate its trainable parameters from its frozen ones (PEFT's
    FSDP1 LoRA policy wraps every adapter) are deliberate and do not count, and neither are units
    that give some of a block's modules another mixed precision than the rest of the block (FSDP2
    groups of the norms with a float32 `MixedPrecisionPolicy` inside bfloat16 blocks).
    A per-block plan with a few extra groups (torchtitan's embedding group and `[norm, output]`
    group) is not flagged for the first reason, and neither is one extra group per block (an MoE
    block's experts).

    ## Why is this bad?
    Every unit costs an all-gather in forward, another in backward and a reduce-scatter of its
    gradients, each with a fixed launch and synchronisation latency. Tiny units make the step
    latency-bound, defeat the overlap of communication with compute (there is too little
    compute per unit to hide the next all-gather behind), and do not lower the peak memory much
    further than per-block units do.

    ## Example
    ```python
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    ```

    ## Fix
    Make the repeated block the unit:
    ```python
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    ```
    FSDP2: `fully_shard(block)` for each block instead of its sub-modules.
    """

    code = "FSD102"
    name = "over-fine-units"
    severity = "warning"
    summary = "units are finer than the repeated block (e.g. every Linear): too many small collectives"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model.head)
fully_shard(model)
''', note="one extra group beside the blocks"),
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

class LoRA(nn.Module):
    def __init__(self, base, r=8):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x))

model = Net()
model.requires_grad_(False)
for layer in model.layers:
    layer.fc1 = LoRA(layer.fc1)
    layer.fc2 = LoRA(layer.fc2)

def lora_leaf(m):
    return not list(m.named_children()) and getattr(m, "weight", None) is not None and m.weight.requires_grad

policy = functools.partial(_or_policy, policies=[
    functools.partial(lambda_auto_wrap_policy, lambda_fn=lora_leaf),
    functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
])
model = FSDP(model, auto_wrap_policy=policy, use_orig_params=False)
''', note="PEFT-style: trainable adapters as units of their own inside frozen blocks"),
        Example('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

class Block(nn.Module):
    def __init__(self, dim=1024):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))

class Net(nn.Module):
    def __init__(self, layers=8):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

model = Net()
fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for module in model.modules():
    if isinstance(module, nn.LayerNorm):
        fully_shard(module, mp_policy=fp32)
for layer in model.layers:
    fully_shard(layer, mp_policy=bf16)
fully_shard(model, mp_policy=bf16)
''', note="FSDP2: the norms as groups of their own to keep them in float32 inside bfloat16 blocks"),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
''', note="every Linear"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer.fc1)
    fully_shard(layer.fc2)
fully_shard(model)
''', note="FSDP2 sub-modules of each block"),
        Example('''
import functools
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(256, 256)
        self.mixers = nn.ModuleList([nn.Linear(256, 256) for _ in range(16)])
        self.head = nn.Linear(256, 1000)

    def forward(self, x):
        x = self.stem(x)
        for m in self.mixers:
            x = m(x).relu()
        return self.head(x)

policy = functools.partial(size_based_auto_wrap_policy, min_num_params=10_000)
model = FSDP(Net(), auto_wrap_policy=policy)
''', note="a size policy below the collective floor on a model of bare layers"),
    ]

    def check(self, ctx):
        plan, tree, layout, settings = ctx.plan, ctx.tree, ctx.layout, ctx.settings
        if plan.origin not in ("file", "cli") or len(plan.units) < 2 or plan.sharding_strategy == "NO_SHARD":
            return
        frac = settings.over_fine_fraction
        classes = tree.repeated_blocks()
        block = block_label(classes) if classes else None
        blocks = tree.instances_of(classes) if classes else []
        nonroot = [ul for ul in layout.units if not ul.unit.is_root and ul.numel]
        if not nonroot:
            return
        alt, alt_layout = per_block_layout(ctx, classes) if classes else (None, None)

        blocks = set(blocks)      # looked up by FQN from each unit's modules (depth, not units x blocks)
        kinds_in: dict = {}       # block -> the requires_grad values of its parameters (once per block)
        owner = {p: units[-1] for p, units in plan.param_units().items()}
        precisions_in: dict = {}  # block -> the mixed precisions of the units holding its parameters
        deliberate = {id(ul.unit) for ul in nonroot
                      if blocks and (self._splits_requires_grad(tree, ul.unit, blocks, kinds_in)
                                     or self._keeps_own_precision(tree, ul.unit, blocks, owner, precisions_in))}
        inner = [ul for ul in nonroot
                 if blocks and all(tree.nearest_ancestor_in(m, blocks) is not None for m in ul.unit.modules)
                 and id(ul.unit) not in deliberate]
        if blocks and len(inner) >= 2 and len(inner) > frac * len(nonroot) \
                and alt_layout is not None and layout.collectives_per_step > alt_layout.collectives_per_step:
            yield self._inner(ctx, block, inner, nonroot, alt_layout)
            return

        ws = max((ul.world_size for ul in layout.units), default=1)
        if ws <= 1:
            return
        with_params = [ul for ul in layout.units if ul.numel and id(ul.unit) not in deliberate]
        floor = settings.collective_floor_bytes
        small = [ul for ul in with_params if ul.all_gather_bytes < floor]
        if len(small) < 2 or len(small) <= frac * len(with_params):
            return
        # only when merging them could give units above the floor (toy models stay quiet)
        if sum(ul.all_gather_bytes for ul in small) < 2 * floor:
            return
        yield self._small(ctx, block, small, with_params, alt_layout, floor)

    @staticmethod
    def _splits_requires_grad(tree, unit, blocks, kinds_in=None) -> bool:
        """A unit inside a block that holds only trainable (or only frozen) parameters while the
        rest of its block holds the other kind: the deliberate FSDP1 way to keep FlatParameters
        uniform (PEFT's LoRA policy wraps every adapter like this), not over-fine wrapping."""
        kinds = {tree.params[p].requires_grad for p in unit.params}
        if len(kinds) != 1:
            return False
        for m in unit.modules:
            b = tree.nearest_ancestor_in(m, blocks)    # `blocks`: a set of FQNs
            if b is not None:
                # the rest of the block holds the other kind: the unit's own parameters are all of
                # its kind, so the block's kinds tell (computed once per block, not once per unit)
                block_kinds = kinds_in.get(b) if kinds_in is not None else None
                if block_kinds is None:
                    block_kinds = {tree.params[p].requires_grad for p in tree.params_under(b)}
                    if kinds_in is not None:
                        kinds_in[b] = block_kinds
                return bool(block_kinds - kinds)
        return False

    @staticmethod
    def _keeps_own_precision(tree, unit, blocks, owner, precisions_in=None) -> bool:
        """A unit inside a block where other units hold parameters in another mixed precision: the
        FSDP2 way to keep a block's norms in float32 while the block computes in bfloat16 (one
        MixedPrecisionPolicy per group), deliberate like the LoRA units above."""
        mine = (unit.param_dtype, unit.reduce_dtype)
        for m in unit.modules:
            b = tree.nearest_ancestor_in(m, blocks)
            if b is None:
                continue
            # the unit's own parameters are all in its precision: another one in the block is another
            # unit's (computed once per block: 10,000 expert units in 8 blocks)
            found = precisions_in.get(b) if precisions_in is not None else None
            if found is None:
                found = {(o.param_dtype, o.reduce_dtype) for o in (owner.get(p) for p in tree.params_under(b))
                         if o is not None}
                if precisions_in is not None:
                    precisions_in[b] = found
            return bool(found - {mine})
        return False

    def _inner(self, ctx, block, inner, nonroot, alt_layout):
        from fsdp_lint.humanize import human_bytes

        plan, tree, layout = ctx.plan, ctx.tree, ctx.layout
        classes = sorted({ul.unit.cls for ul in inner})
        examples = ", ".join(ul.unit.module for ul in inner[:4]) + (f", ... ({len(inner) - 4} more)"
                                                                    if len(inner) > 4 else "")
        avg = sum(ul.all_gather_bytes for ul in inner) // len(inner)
        msg = (f"{len(inner)} of {len(nonroot)} units are inside the repeated block {block}: "
               f"{layout.collectives_per_step} collectives per step vs {alt_layout.collectives_per_step} with one "
               f"unit per {block}")
        detail = (f"the units inside it ({', '.join(classes)}: {examples}); the plan issues {_collectives(layout)} "
                  f"vs {alt_layout.collectives_per_step} with one unit per {block}, each all-gather moving "
                  f"{human_bytes(avg)} per rank on average")
        first = inner[0].unit
        fix = "make the block the unit instead of its sub-modules: " + block_wrap_fix(tree, plan.api,
                                                                                      tree.repeated_blocks())
        return self.finding(ctx, msg, **where(ctx, first.path, first.line, first.col), module=first.module,
                            fix=fix, detail=detail, block=block, units_inside_block=len(inner),
                            collectives_per_step=layout.collectives_per_step,
                            per_block_collectives_per_step=alt_layout.collectives_per_step)

    def _small(self, ctx, block, small, with_params, alt_layout, floor):
        from fsdp_lint.humanize import human_bytes

        plan, tree, layout = ctx.plan, ctx.tree, ctx.layout
        sizes = sorted(ul.all_gather_bytes for ul in small)
        median = sizes[len(sizes) // 2]
        msg = (f"{len(small)} of {len(with_params)} units all-gather less than {human_bytes(floor)} per rank "
               f"(median {human_bytes(median)}): {layout.collectives_per_step} collectives per step")
        detail = f"the plan issues {_collectives(layout)}"
        finer = alt_layout is not None and layout.collectives_per_step > alt_layout.collectives_per_step
        if finer:
            msg += f" vs {alt_layout.collectives_per_step} per {block}"
            detail += f" vs {alt_layout.collectives_per_step} with one unit per {block}"
        if finer:
            fix = "use coarser units: " + block_wrap_fix(tree, plan.api, tree.repeated_blocks())
        else:
            itemsize = dtype_itemsize(small[0].param_dtype)
            ws = max(2, small[0].world_size)
            min_params = -(-floor * ws // ((ws - 1) * itemsize))
            if plan.api == "fsdp1":
                fix = (f"use coarser units: `functools.partial(size_based_auto_wrap_policy, "
                       f"min_num_params={min_params:_})` or a policy on a parent module, so each unit moves at "
                       f"least {human_bytes(floor)}")
            else:
                fix = (f"use coarser groups: pass several neighbouring modules to one call, "
                       f"`fully_shard([{tree.expr(small[0].unit.module)}, ...])`, about {min_params:,} parameters "
                       f"per group, so each all-gather moves at least {human_bytes(floor)}")
        first = min((ul.unit for ul in small if not ul.unit.is_root), key=lambda u: u.seq, default=small[0].unit)
        return self.finding(ctx, msg, **where(ctx, first.path, first.line, first.col), module=first.module,
                            fix=fix, detail=detail, small_units=len(small),
                            collectives_per_step=layout.collectives_per_step,
                            per_block_collectives_per_step=alt_layout.collectives_per_step if alt_layout else None)
