"""The plan of a framework's wrap calls: which framework made them (``plan.framework``), the wrap-class
names it could not match (policy entries for FSD103, at the line or argument that set them) and
accelerate's upcast of low-precision trainable parameters."""
from __future__ import annotations

from typing import List, Optional

from fsdp_lint.replay.frameworks import current_options

def framework_of(wrap_calls) -> Optional[str]:
    """The framework that made the plan's wrap calls (the last call's), or None (the file's own code)."""
    for call in reversed(wrap_calls):
        name = getattr(call, "framework", None)
        if name:
            return name
    return None


def framework_errors(wrap_calls) -> List[dict]:
    out: List[dict] = []
    for call in wrap_calls:
        out.extend(getattr(call, "framework_errors", []))
    return out


def annotate_plan(plan, result, tree) -> None:
    """`plan.framework`, and a policy entry (for FSD103) for each wrap-class name a framework could not
    find, located where the name is written: the linted file, the accelerate config, or the call."""
    import os

    from fsdp_lint.replay.frameworks.options import find_literal
    from fsdp_lint.plan.build import PolicyInfo

    from fsdp_lint.replay.frameworks.accelerate import apply_upcast, plugin_in_code

    plan.framework = framework_of(result.wrap_calls)
    # where the framework's configuration is written (accelerate: the plugin in code, else the YAML)
    plan.framework_config = "plugin" if plan.framework == "accelerate" and plugin_in_code(result) else None
    apply_upcast(plan, result, tree)
    for call, info in zip(result.optimizers, plan.optimizers):
        info.remapped_by = getattr(call, "remapped_by", None)
    options = current_options()
    yaml_lines = options.yaml_lines()
    from_yaml = "FSDP_TRANSFORMER_CLS_TO_WRAP" in options.accelerate_env
    for err in framework_errors(result.wrap_calls):
        for name in err["missing"]:
            path, line, setting = err["path"], err["line"], err["setting"]
            explicit = setting == "transformer_layer_cls_to_wrap"
            spot = find_literal(path, name) if explicit and os.path.isfile(path) else None
            if spot is not None:
                line = spot[0]
                if options.accelerate_config and os.path.abspath(path) == os.path.abspath(options.accelerate_config):
                    setting = "fsdp_transformer_layer_cls_to_wrap"
            elif explicit and from_yaml and "fsdp_transformer_layer_cls_to_wrap" in yaml_lines:
                path, line = options.accelerate_config, yaml_lines["fsdp_transformer_layer_cls_to_wrap"][0]
                setting = "fsdp_transformer_layer_cls_to_wrap"
            elif explicit and _spelled_in_arguments(getattr(result, "argv", None) or [], name):
                # a config file named on the script's command line (the HF Trainer's --fsdp_config fsdp.json)
                path, line = _spelled_in_arguments(result.argv, name)
            desc = f"{setting}: {', '.join(err['names'])}"
            plan.policies.append(PolicyInfo(path, line, desc, [name], 0, setting=setting,
                                            framework=err["framework"], error=err["message"]))


def _spelled_in_arguments(argv, name: str):
    """(path, line) where a file named in the script's arguments (``--fsdp_config fsdp.json``,
    ``--config=train.yaml``) spells the wrap-class `name`, or None."""
    import os

    from fsdp_lint.replay.frameworks.options import find_literal

    for arg in argv:
        candidate = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if candidate.startswith("-") or not os.path.isfile(candidate):
            continue
        spot = find_literal(candidate, name)
        if spot is not None:
            return candidate, spot[0]
    return None
