"""FSD103 wrap-class-not-found."""
import difflib
import re
from typing import Dict, List

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import _MODEL, where
from fsdp_lint.rules._frontend import lightning_policy_text as _lightning_desc

_CONTAINERS = ("torch.nn.modules.container.",)


def close_names(name: str, names: List[str], n: int = 3) -> List[str]:
    """Names close to `name`, case-insensitively (difflib ratio), best first; an exact
    case-insensitive match first of all."""
    lower: Dict[str, str] = {}
    for cand in names:
        lower.setdefault(cand.lower(), cand)
    key = name.lower().rpartition(".")[2]
    if key in lower:
        return [lower[key]]
    hits = difflib.get_close_matches(key, list(lower), n=n, cutoff=0.6)
    # a name that contains the other ("TransformerDecoderLayer" / "DecoderLayer") is a good guess too
    for low, cand in lower.items():
        if len(hits) < n and low not in hits and len(low) >= 4 and (low in key or key in low):
            hits.append(low)
    return [lower[h] for h in hits]


def _names_a_block(name: str) -> bool:
    """A class name that says it is a transformer block (`...Layer`, `...Block`)."""
    return name.lower().rpartition(".")[2].endswith(("layer", "block"))


def policy_with(pol, missing: str, replacement: str) -> str:
    """The policy's description with `missing` replaced by `replacement` in its class set."""
    classes = [c for c in pol.classes if c != missing]
    if replacement not in classes:
        classes.append(replacement)
    new_set = "{" + ", ".join(sorted(classes)) + "}"
    if re.search(r"\{[^{}]*\}", pol.desc):
        return re.sub(r"\{[^{}]*\}", lambda m: new_set, pol.desc, count=1)
    return pol.desc


def class_inventory(tree) -> List[tuple]:
    """(class, instances, parameters under its outermost instances) for the model's classes that
    could be units (no containers, no root), most parameters first."""
    sizes = tree.subtree_numels()
    counts: Dict[str, int] = {}
    for fqn, info in tree.modules.items():
        if fqn and info.has_forward and not info.cls_qualname.startswith(_CONTAINERS) and sizes.get(fqn, 0):
            counts[info.cls] = counts.get(info.cls, 0) + 1
    out = [(c, k, sum(sizes[f] for f in tree.instances_of(c))) for c, k in counts.items()]
    out.sort(key=lambda t: (-t[2], -t[1], t[0]))
    return out


def _setting_words(pol, setting: str) -> str:
    """The setting as the user wrote it: the HF Trainer's flag, fsdp_config key or kwarg; else its key."""
    written = getattr(pol, "written", None)
    return written if written else f"`{setting}`"


def _policy_edit(ctx, pol, name: str, best, close):
    """The class set of the Python policy (`ModuleWrapPolicy({...})`, `transformer_layer_cls={...}`) with
    `best` -- the one close name, or the repeated block when nothing is close -- in place of `name`.
    Unsafe, as for a config: the name may be meant for another model the same code wraps."""
    if not best or len(close) > 1:
        return None
    from fsdp_lint.fix.edits import UNSAFE, Fix
    from fsdp_lint.fix.policies import class_module, replace_class

    module = class_module(ctx.tree, best)
    edits = replace_class(pol.path, name, best, module) if module else None
    return Fix(f"name `{best}` instead of `{name}` in the auto-wrap policy", UNSAFE, edits) if edits else None


class WrapClassNotFound(Rule):
    """An auto-wrap class (or `--wrap` name) matches no module of the model.

    ## What it does
    Checks every class that an FSDP1 auto-wrap policy names
    (`transformer_auto_wrap_policy(transformer_layer_cls={...})`, `ModuleWrapPolicy({...})`) and
    every `--wrap` class name or FQN glob against the model's modules. For a name that matches
    nothing it lists the classes the model does have and suggests close names (case-insensitive,
    by edit distance), or the model's repeated block class. A class of a Python policy's set whose
    other classes are the model's units (one set written for a family of models, `{Block, MBlock}`)
    is reported as info: torch wraps this model as intended. A class a framework looks up by name
    (accelerate's `transformer_layer_cls_to_wrap`) stays an error: the framework raises on it.

    ## Why is this bad?
    FSDP1 does not complain about a policy that matches nothing: it silently wraps the whole
    model as one unit (see FSD101), so every rank all-gathers all parameters at once. This
    happens when a policy is copied from a tutorial (`nn.TransformerEncoderLayer` for a model
    with its own `EncoderLayer`), after a refactoring renames the block, or when a class is
    imported from another model family (`LlamaDecoderLayer` for a Mistral model).

    ## Example
    ```python
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={nn.TransformerDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy)  # the model's blocks are `DecoderLayer`
    ```

    ## Fix
    Name the class the model really repeats:
    ```python
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    ```
    The FSDP2 equivalent, `for m in model.modules(): if isinstance(m, X): fully_shard(m)` with an
    `X` that matches nothing, leaves only the root group and is reported by FSD101.
    """

    code = "FSD103"
    name = "wrap-class-not-found"
    severity = "error"
    summary = "an auto-wrap class or --wrap name matches no module of the model"

    VALID = [
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(Net(), auto_wrap_policy=policy)
'''),
        Example(_MODEL + '''
model = Net()
''', options={"wrap": ["Block"]}, note="--wrap Block"),
    ]
    INVALID = [
        Example(_MODEL + '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.TransformerEncoderLayer})
model = FSDP(Net(), auto_wrap_policy=policy)
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

class Blok(nn.Module):
    pass

model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Block, Blok}))
''', note="one of two classes matches nothing (info: the other is the units)"),
        Example(_MODEL + '''
model = Net()
''', options={"wrap": ["block"]}, note="--wrap with the wrong case"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(Net(), auto_wrap_policy=ModuleWrapPolicy({Net}))
''', note="the policy names only the root class"),
    ]

    def check(self, ctx):
        plan, tree = ctx.plan, ctx.tree
        if not plan.policies:
            return
        inventory = class_inventory(tree)
        all_classes = sorted({info.cls for f, info in tree.modules.items() if f})
        for pol in plan.policies:
            cli = pol.path == "<cli>"
            for name in pol.classes:
                if cli:
                    from fsdp_lint.plan.build import wrap_pattern_matches

                    if wrap_pattern_matches(tree, name):
                        continue
                    yield self._missing(ctx, pol, name, inventory, all_classes, cli=True)
                    continue
                holders = [f for f, info in tree.modules.items() if name in info.mro]
                if not holders:
                    # the policy's other classes that are units (one set for a family of models: `{Block, MBlock}`)
                    others = [c for c in pol.classes if c != name and
                              any(c in info.mro for f, info in tree.modules.items() if f)]
                    yield self._missing(ctx, pol, name, inventory, all_classes, cli=False, others=others)
                elif holders == [""] and pol.matched == 0:
                    yield self._root_only(ctx, pol, name, inventory)

    def _suggest(self, tree, name, inventory, all_classes):
        block = tree.repeated_block_class()
        close = close_names(name, [c for c, _, _ in inventory] or all_classes)
        best = close[0] if close else block
        if block and close and (block in close or _names_a_block(name) and not _names_a_block(close[0])):
            best = block    # `GPT2Layer` means the repeated `GPT2Block`, not the closer-spelled `GPT2MLP`
        found = ", ".join(f"{c} ×{k}" if k > 1 else c for c, k, _ in inventory[:6])
        return best, close, block, found

    def _missing(self, ctx, pol, name, inventory, all_classes, *, cli: bool, others=()):
        tree = ctx.tree
        best, close, block, found = self._suggest(tree, name, inventory, all_classes)
        if others and not cli and not getattr(pol, "framework", None):
            return self._unused_in_set(ctx, pol, name, others, found, close)
        hints = []
        if close and best == block and block not in close:
            hints.append(f"did you mean the repeated block `{block}`? (" + ", ".join(f"`{c}`" for c in close)
                         + " only looks alike)")
        else:
            if close:
                hints.append("did you mean " + " or ".join(f"`{c}`" for c in close) + "?")
            if block and block not in close:
                hints.append(f"the repeated block is `{block}`")
        hint = "; ".join(hints)
        hint = (" " + hint[0].upper() + hint[1:] + ("." if hint.endswith(")") else "")) if hint else ""
        if getattr(pol, "framework", None):
            return self._framework_missing(ctx, pol, name, best, close, block, found, hint)
        if cli:
            msg = f"`--wrap {name}` matches no module (class name or FQN glob) of {tree.root_class}.{hint}"
            detail = f"the model has {found}"
            fix = f"`--wrap {best}`" if best else "pass a class name or FQN glob the model has"
            loc = where(ctx, "<cli>", 0)
        else:
            lightning = getattr(ctx.plan, "framework", None) == "lightning"
            desc = _lightning_desc(pol.desc) if lightning else pol.desc
            msg = f"the auto-wrap policy names `{name}`, but no module of {tree.root_class} is a `{name}`.{hint}"
            detail = f"the policy is `{desc}`; the model has {found}"
            if best:
                fixed = policy_with(pol, name, best)
                fix = f"name the model's class: `{_lightning_desc(fixed) if lightning else fixed}`"
            else:
                fix = "name a class the model has"
            loc = where(ctx, pol.path, pol.line)
            if lightning:      # the strategy argument, where the set names the class
                from fsdp_lint.fix.policies import written_at

                spot = written_at(pol.path, name)
                loc = where(ctx, pol.path, spot[0], spot[1]) if spot else loc
            edits = _policy_edit(ctx, pol, name, best, close)
            return self.finding(ctx, msg, **loc, module="", fix=fix, missing=name, detail=detail,
                                suggestions=close, block=block, fix_edits=edits)
        return self.finding(ctx, msg, **loc, module="", fix=fix, missing=name, detail=detail,
                            suggestions=close, block=block)

    def _unused_in_set(self, ctx, pol, name, others, found, close):
        """A class of the policy's set that this model does not have while others of the set are its units: a
        set written for several models of a family wraps this one as intended (torch ignores a class nothing
        is an instance of); info, in case the name was meant for this model. A misspelling of one of the
        set's own classes (`{Blok, Block}`) can be dropped (an unsafe fix)."""
        lightning = getattr(ctx.plan, "framework", None) == "lightning"
        desc = _lightning_desc(pol.desc) if lightning else pol.desc
        units = ", ".join(f"`{c}`" for c in others)
        msg = f"the auto-wrap policy names `{name}`, which no module of {ctx.tree.root_class} is ({units} are the units)"
        typo = next((c for c in close if c in others), None)
        fix = (f"drop `{name}` from the set if it misspells `{typo}`" if typo else
               f"nothing to change if `{name}` is another model's block")
        edits = _policy_edit(ctx, pol, name, typo, [typo]) if typo else None
        return self.finding(ctx, msg, **where(ctx, pol.path, pol.line), module="", severity="info", fix=fix,
                            missing=name, suggestions=[typo] if typo else [], block=None, fix_edits=edits,
                            detail=f"the policy is `{desc}`: a set written for several models of a family wraps "
                                   f"this one as intended, unless `{name}` was meant for it; the model has {found}")

    def _framework_missing(self, ctx, pol, name, best, close, block, found, hint):
        """A class name a framework (accelerate, the HF Trainer) looks up in the model: it raises."""
        tree = ctx.tree
        setting = pol.setting or "transformer_layer_cls_to_wrap"
        where_named = f"`{setting}`" if "_no_split_modules" not in setting else setting
        if getattr(pol, "written", None) and "_no_split_modules" not in setting:
            where_named = pol.written     # the HF Trainer's flag, fsdp_config key or kwarg, as written
            where_named = where_named[0].upper() + where_named[1:] if where_named.startswith("the ") else where_named
        msg = f"{where_named} names `{name}`, but no module of {tree.root_class} is a `{name}`.{hint}"
        detail = f"the model has {found}; {pol.framework} raises at wrap time: `{pol.error}`"
        target = best or block
        if "_no_split_modules" in setting:
            fix = (f"name the block class to wrap: transformer_layer_cls_to_wrap = `{target}`" if target
                   else "name the classes to wrap in transformer_layer_cls_to_wrap")
        elif target:
            fix = f"write `{target}` instead of `{name}` in {_setting_words(pol, setting)}"
        else:
            fix = f"remove `{name}` from {_setting_words(pol, setting)}"
        edits = None
        if target and "_no_split_modules" not in setting and len(close) <= 1:
            # a unique close name (or the block when none is close) in place of the name, where it
            # is written; unsafe: the name may be meant for another model the config also serves
            from fsdp_lint.fix.configs import replace_word
            from fsdp_lint.fix.edits import UNSAFE, Fix

            edit = replace_word(pol.path, pol.line, name, target)
            edits = Fix(f"write `{target}` instead of `{name}` in {_setting_words(pol, setting)}", UNSAFE,
                        [edit]) if edit else None
        return self.finding(ctx, msg, **where(ctx, pol.path, pol.line), module="", fix=fix, missing=name,
                            suggestions=close, block=block, fix_edits=edits, detail=detail)

    def _root_only(self, ctx, pol, name, inventory):
        tree = ctx.tree
        block = tree.repeated_block_class()
        msg = (f"the auto-wrap policy names only the root class `{name}`, so it wraps nothing"
               + (f"; the repeated block is `{block}`" if block else ""))
        detail = f"an auto-wrap policy never wraps the root again (the policy is `{pol.desc}`)"
        fix = f"name the block class: `{policy_with(pol, name, block)}`" if block else "name a sub-module class"
        return self.finding(ctx, msg, **where(ctx, pol.path, pol.line), module="", fix=fix,
                            missing=name, block=block, detail=detail)
