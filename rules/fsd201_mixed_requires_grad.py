"""FSD201 mixed-requires-grad."""

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._flat_params import (
    _FSDP1, _LORA, _MODEL, anchor, describe_mix, freeze_positions, freeze_story, fsdp1_torch_error,
    grad_numels, group_units, mix_signature, mixed_units, shared_owner, split_fix, units_brief, units_label, wrapped_how,
)
from fsdp_lint.rules._peft import requires_grad_fix


class MixedRequiresGrad(Rule):
    """An FSDP1 unit mixes frozen and trainable parameters with `use_orig_params=False`.

    ## What it does
    Flags FSDP1 units (auto-wrapped blocks, manual wraps and the root unit with the leftovers)
    whose parameters are partly frozen (`requires_grad=False`) and partly trainable while
    `use_orig_params=False` (the default). It names the unit, the frozen and the trainable
    parameters, the statement that froze them and the wrap call, and the grouping that fixes it.

    ## Why is this bad?
    FSDP1 flattens each unit's parameters into one `FlatParameter`, which has a single
    `requires_grad`. With `use_orig_params=False` torch refuses to build it and raises at wrap
    time: `ValueError: Must flatten tensors with uniform requires_grad when use_orig_params=False`
    (with a `ModuleWrapPolicy`/`CustomPolicy`: `<module> has both parameters with
    requires_grad=True and False`). Fine-tuning setups hit it all the time: LoRA adapters inside
    frozen blocks, or a frozen embedding left in the root unit next to a trainable head.

    ## Example
    ```python
    model.requires_grad_(False)          # freeze the pretrained model
    add_adapters(model)                  # new trainable lora_a / lora_b inside every Block
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    ```

    ## Fix
    Give the frozen and the trainable parameters their own units, e.g. wrap the adapters
    separately:
    ```python
    model = FSDP(model, auto_wrap_policy=CustomPolicy(
        lambda m: isinstance(m, Block)
        or (not list(m.children()) and any(p.requires_grad for p in m.parameters()))))
    ```
    or pass `use_orig_params=True`, which accepts mixed units but allocates gradient memory for
    the frozen parameters too (FSD202).
    """

    code = "FSD201"
    name = "mixed-requires-grad"
    severity = "error"
    summary = "an FSDP1 unit mixes frozen and trainable params with use_orig_params=False (torch raises)"
    applies_to = ("fsdp1",)

    VALID = [
        # the adapters are units of their own: every unit is uniformly frozen or trainable
        Example(_LORA + '''
policy = CustomPolicy(lambda m: isinstance(m, Block)
                      or (not list(m.children()) and any(p.requires_grad for p in m.parameters())))
model = FSDP(model, auto_wrap_policy=policy)
'''),
        # the frozen embedding is its own unit; the root keeps only the trainable head
        Example(_MODEL + _FSDP1 + '''
model = Net()
model.embed.requires_grad_(False)
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block, nn.Embedding}))
'''),
        # manual wraps: the frozen blocks by hand, the trainable leftovers in the root
        Example(_MODEL + _FSDP1 + '''
model = Net()
for layer in model.layers:
    layer.requires_grad_(False)
for i, layer in enumerate(model.layers):
    model.layers[i] = FSDP(layer)
model = FSDP(model)
'''),
        # use_orig_params=True accepts mixed units (at a gradient-memory cost, FSD202)
        Example(_LORA + '''
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
'''),
    ]
    INVALID = [
        # LoRA: frozen base weights and trainable adapters share each Block unit (callable policy)
        Example(_LORA + '''
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy)
'''),
        # a partly frozen model: the root unit keeps the frozen embedding and the trainable head
        Example(_MODEL + _FSDP1 + '''
model = Net()
model.embed.requires_grad_(False)
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        # frozen norms inside trainable blocks, manual wraps
        Example(_MODEL + _FSDP1 + '''
model = Net()
for n, p in model.named_parameters():
    if "norm" in n:
        p.requires_grad = False
for i, layer in enumerate(model.layers):
    model.layers[i] = FSDP(layer, use_orig_params=False)
model = FSDP(model)
'''),
        # a policy object: torch checks every target before wrapping ("has both parameters with ...")
        Example(_LORA + '''
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
    ]

    def check(self, ctx):
        plan = ctx.plan
        if plan.api != "fsdp1" or plan.use_orig_params or plan.origin not in ("file", "cli"):
            return
        for units in group_units(mixed_units(ctx), mix_signature(ctx)):
            u = units[0]
            frozen_desc, trainable_desc = describe_mix(ctx, u)
            story = freeze_story(ctx, units)
            total, trainable = grad_numels(ctx, u)
            torch_error = fsdp1_torch_error(ctx, u) or \
                "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
            torch_says = f"ValueError: {torch_error}"
            mixes = "each mix" if len(units) > 1 else "mixes"
            msg = (f"{units_brief(units)} {mixes} frozen and trainable parameters with use_orig_params=False: "
                   f"torch raises at wrap time")
            detail = (f"{units_label(units)} ({wrapped_how(ctx, u)}): frozen: {frozen_desc}; trainable: {trainable_desc}"
                      + (f" ({story})" if story else "") + f". torch raises at wrap time: `{torch_says}`")
            split = split_fix(ctx, units)
            orig = (f"{_orig_params_setting(ctx)}: FSDP1 then accepts the unit but allocates gradients for the whole "
                    f"FlatParameter ({total:,} numel instead of {trainable:,} numel before sharding{', per unit' if len(units) > 1 else ''})")
            if split:
                fix = f"{split['text']}; or {orig}"
            else:
                fix = (f"frozen and trainable parameters sit directly on the same module "
                       f"({shared_owner(ctx.tree, u.params, lambda p: p.requires_grad)}), so no FSDP1 grouping "
                       f"separates them: {orig}, or move the trainable parameters into a sub-module of their own")
            peft = requires_grad_fix(ctx, u.params)
            if peft:
                fix = f"{peft}; or {orig}"
            edits = self._edits(ctx, total, trainable, len(units) > 1)
            yield self.finding(ctx, msg, **anchor(ctx, u, freeze_positions(ctx, units)), module=u.module, fix=fix,
                               fix_edits=edits, detail=detail,
                               units=[x.module for x in units], policy=split["policy"] if split else None,
                               torch_exception="ValueError", torch_error=torch_error,
                               grad_numel=total, trainable_numel=trainable)

    @staticmethod
    def _edits(ctx, total: int, trainable: int, per_unit: bool):
        framework = getattr(ctx.plan, "framework", None)
        if framework == "accelerate":
            return _accelerate_edit(ctx, total, trainable, per_unit)
        if framework:
            return None     # the framework builds the FSDP call: its own setting, in the text fix
        """`use_orig_params=True` in every FSDP1 call of the file (an auto-wrap root's applies to the
        units it wraps). Unsafe: FSDP1 then allocates gradients for the frozen parameters too."""
        from fsdp_lint.fix import codemods
        from fsdp_lint.fix.edits import UNSAFE, Fix

        edits = []
        for unit in ctx.plan.units:
            if unit.origin != "call":
                continue
            src = codemods.Source.of(unit.path)
            call = codemods.wrap_call(src, unit.line, unit.col) if src is not None else None
            edit = codemods.set_keyword(src, call, "use_orig_params", "True") if call is not None else None
            if edit is None:
                return None
            if edit not in edits:
                edits.append(edit)
        if not edits:
            return None
        return Fix(f"pass `use_orig_params=True` (gradient memory for the whole FlatParameter: {total:,} numel "
                   f"instead of {trainable:,}{' per unit' if per_unit else ''})", UNSAFE, edits)


def _orig_params_setting(ctx) -> str:
    """How the plan's front-end spells use_orig_params=True."""
    framework = getattr(ctx.plan, "framework", None)
    if framework == "accelerate":
        return "set `fsdp_use_orig_params: true` in the accelerate config"
    if framework == "transformers":
        from fsdp_lint.rules._frontend import hf_config_text

        return hf_config_text(ctx, "use_orig_params", True) or \
            "pass `fsdp_config={\"use_orig_params\": True}` to `TrainingArguments` (`--fsdp_config` JSON)"
    if framework == "lightning":
        return "pass `FSDPStrategy(use_orig_params=True)`"
    return "pass `use_orig_params=True`"


def _accelerate_edit(ctx, total: int, trainable: int, per_unit: bool):
    """`fsdp_use_orig_params: false` -> `true` where the accelerate config writes it (layout kept)."""
    import re

    from fsdp_lint.fix.configs import replace_word
    from fsdp_lint.fix.edits import UNSAFE, Fix

    path = getattr(ctx.settings, "accelerate_config", None)
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, TypeError, UnicodeDecodeError):
        return None
    line = next((i for i, text in enumerate(lines, start=1)
                 if re.match(r"\s*fsdp_use_orig_params\s*:\s*false\b", text, re.IGNORECASE)), None)
    edit = replace_word(path, line, re.search(r":\s*(\w+)", lines[line - 1]).group(1), "true") if line else None
    if edit is None:
        return None
    return Fix(f"set `fsdp_use_orig_params: true` (gradient memory for the whole FlatParameter: {total:,} numel "
               f"instead of {trainable:,}{' per unit' if per_unit else ''})", UNSAFE, [edit])
