"""FSDP1 auto-wrap policies resolved against live modules exactly as torch resolves them (torch's
own `_run_policy`/`_recursive_wrap`), called by the replay's recorder while the modules exist."""
from __future__ import annotations

from typing import Any, List, Set, Tuple


def resolve_fsdp1_auto_wrap(root_module, policy, ignored_modules=None, ignored_states=None,
                            mixed_precision=None):
    """The modules torch's auto-wrap would wrap under `root_module`, post-order (root excluded),
    plus a description of the policy and the class names it names."""
    import functools

    from torch.distributed.fsdp import wrap as wrap_mod

    ignored = _ignored_modules(root_module, ignored_modules, ignored_states)
    ignored_params = {p for m in ignored for p in m.parameters()}
    if ignored_states is not None:
        ignored_params |= {s for s in ignored_states if not hasattr(s, "parameters")}
    wrapped: List[Any] = []

    def record(module, *args, **kwargs):
        wrapped.append(module)
        return module

    desc, classes = describe_policy(policy)
    if isinstance(policy, wrap_mod._Policy):
        targets = policy._run_policy(root_module, ignored, {})
        if mixed_precision is not None and getattr(mixed_precision, "_module_classes_to_ignore", None):
            targets = wrap_mod._run_mixed_precision_override_policy(
                root_module, mixed_precision._module_classes_to_ignore, ignored, {}, targets)
        wrap_mod._post_order_apply(root_module, wrap_mod._construct_wrap_fn(root_module, targets, record))
    else:
        if mixed_precision is not None and getattr(mixed_precision, "_module_classes_to_ignore", None):
            policy = functools.partial(
                wrap_mod._or_policy,
                policies=[policy, functools.partial(wrap_mod._wrap_module_cls_individually,
                                                    module_classes=mixed_precision._module_classes_to_ignore)])
        wrap_mod._recursive_wrap(root_module, auto_wrap_policy=policy, wrapper_cls=record,
                                 ignored_modules=ignored, ignored_params=ignored_params, only_wrap_children=True)
    return wrapped, desc, classes


def _ignored_modules(root_module, ignored_modules, ignored_states) -> Set[Any]:
    mods = list(ignored_modules or [])
    if ignored_states is not None:
        mods += [s for s in ignored_states if hasattr(s, "parameters")]
    out: Set[Any] = set()
    for m in mods:
        for sub in m.modules():
            out.add(sub)
    return out


def describe_policy(policy) -> Tuple[str, List[str]]:
    import functools

    def cls_names(classes) -> List[str]:
        out = []
        for c in classes or ():
            out.append(c if isinstance(c, str) else getattr(c, "__name__", repr(c)))
        return sorted(out)

    if isinstance(policy, functools.partial):
        fn = getattr(policy.func, "__name__", repr(policy.func))
        kw = dict(policy.keywords)
        classes = cls_names(kw.get("transformer_layer_cls") or kw.get("module_classes"))
        parts = []
        for k, v in kw.items():
            if isinstance(v, (set, frozenset, list, tuple)):
                v = "{" + ", ".join(cls_names(v)) + "}"
            elif callable(v):
                v = getattr(v, "__name__", "<callable>")
            parts.append(f"{k}={v}")
        return f"{fn}({', '.join(parts)})", classes
    module_classes = getattr(policy, "_module_classes", None)
    if module_classes is not None:
        classes = cls_names(module_classes)
        return f"{type(policy).__name__}({{{', '.join(classes)}}})", classes
    name = getattr(policy, "__name__", type(policy).__name__)
    if name == "size_based_auto_wrap_policy":
        return "size_based_auto_wrap_policy(min_num_params=100000000)", []
    return name, []
