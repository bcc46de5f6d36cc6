"""FSD202 mixed-requires-grad-memory."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.humanize import human_bytes
from fsdp_lint.rules._flat_params import (
    _FSDP1, _LORA, _MODEL, anchor, describe_mix, freeze_positions, freeze_story, grad_numels, group_units,
    mix_signature, mixed_units, split_fix, units_brief, units_label, wrapped_how,
)
from fsdp_lint.rules._peft import requires_grad_fix


class MixedRequiresGradMemory(Rule):
    """An FSDP1 unit mixes frozen and trainable parameters with `use_orig_params=True`.

    ## What it does
    Flags FSDP1 units whose parameters are partly frozen and partly trainable when
    `use_orig_params=True`, and gives the gradient elements FSDP allocates for the unit against
    the trainable elements it actually needs, in torch's own words ("N numel instead of M numel
    before sharding").

    ## Why is this bad?
    FSDP1 keeps one `FlatParameter` per unit, and its gradient covers the whole `FlatParameter`:
    the frozen parameters' share of it is allocated, zero-filled and reduce-scattered every step
    for nothing. In a LoRA fine-tune, where the adapters are a fraction of a percent of each
    block, the gradient memory and the reduce-scatter traffic are those of full fine-tuning.
    torch only warns about it for units chosen by a `ModuleWrapPolicy`/`CustomPolicy`.
    Below `memory-info-share` (default 5 %) of the usable memory of the device (see FSD801) the
    finding is info: the wasted gradient memory fits easily.

    ## Example
    ```python
    model.requires_grad_(False)
    add_adapters(model)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
    ```

    ## Fix
    Wrap the trainable (or the frozen) modules as units of their own, so that every
    `FlatParameter` is uniformly frozen or trainable:
    ```python
    model = FSDP(model, use_orig_params=True, auto_wrap_policy=CustomPolicy(
        lambda m: isinstance(m, Block)
        or (not list(m.children()) and any(p.requires_grad for p in m.parameters()))))
    ```
    If the adapters live directly on the same module as the frozen weight, move them into a
    sub-module first, or accept the cost.
    """

    code = "FSD202"
    name = "mixed-requires-grad-memory"
    severity = "warning"
    summary = "an FSDP1 unit mixes frozen and trainable params with use_orig_params=True: gradient memory for frozen params"
    applies_to = ("fsdp1",)

    VALID = [
        Example(_LORA + '''
policy = CustomPolicy(lambda m: isinstance(m, Block)
                      or (not list(m.children()) and any(p.requires_grad for p in m.parameters())))
model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
'''),
        Example(_MODEL + _FSDP1 + '''
model = Net()
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
'''),
    ]
    INVALID = [
        Example(_LORA + '''
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
'''),
        Example(_MODEL + _FSDP1 + '''
model = Net()
model.embed.requires_grad_(False)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
'''),
    ]

    def check(self, ctx):
        plan = ctx.plan
        if plan.api != "fsdp1" or not plan.use_orig_params or plan.origin not in ("file", "cli"):
            return
        for units in group_units(mixed_units(ctx), mix_signature(ctx)):
            u = units[0]
            frozen_desc, trainable_desc = describe_mix(ctx, u)
            story = freeze_story(ctx, units)
            total, trainable = grad_numels(ctx, u)
            ul = ctx.layout.for_unit(u) if ctx.layout is not None else None
            per_rank = ""
            if ul is not None and ul.grad_numel:
                per_rank = f"; each of the {ul.world_size} ranks holds a {ul.grad_numel:,}-element gradient shard for it"
            mixes = "each mix" if len(units) > 1 else "mixes"
            detail = (f"{units_label(units)} ({wrapped_how(ctx, u)}): the gradient memory usage will be higher than "
                   f"expected ({total:,} numel instead of {trainable:,} numel before sharding via reduce-scatter"
                   f"{', per unit' if len(units) > 1 else ''}{per_rank}); frozen: {frozen_desc}; "
                   f"trainable: {trainable_desc}" + (f" ({story})" if story else ""))
            split = split_fix(ctx, units)
            if split:
                fix = split["text"]
            else:
                from fsdp_lint.rules._flat_params import shared_owner

                fix = (f"frozen and trainable parameters sit directly on the same module "
                       f"({shared_owner(ctx.tree, u.params, lambda p: p.requires_grad)}), so no FSDP1 grouping "
                       f"separates them: move the trainable parameters into a sub-module of their own and wrap "
                       f"it separately, or accept the extra gradient memory")
            peft = requires_grad_fix(ctx, u.params)
            if peft:
                fix = peft
            from fsdp_lint.plan.budget import budget_for, share_text

            budget = budget_for(ctx.layout.memory, ctx.settings)
            itemsize = max([ctx.tree.params[p].itemsize for p in u.params] or [4])
            ws = ul.world_size if ul is not None else 1
            extra = -(-(total - trainable) // ws) * itemsize * len(units)
            share = budget.share(extra)
            detail += (f"; {extra:,} bytes of gradients per rank for frozen parameters, {share_text(share)} of the usable "
                       f"memory of the device ({budget.device})")
            msg = (f"{units_brief(units)} {mixes} frozen and trainable parameters (use_orig_params=True): "
                   f"{human_bytes(extra)}/rank of gradients for the frozen ones")
            severity = "info" if share < ctx.settings.memory_info_share else None
            yield self.finding(ctx, msg, **anchor(ctx, u, freeze_positions(ctx, units)), module=u.module, fix=fix,
                               detail=detail, severity=severity, extra_grad_bytes=extra, device_share=share,
                               units=[x.module for x in units], grad_numel=total, trainable_numel=trainable,
                               policy=split["policy"] if split else None)
