"""Frameworks that wrap the model with FSDP themselves: Lightning, accelerate, the Hugging Face Trainer.

The installed framework decides, fsdp-lint records: during a replay the framework's own code runs on
the meta device with the simulated process group, computes its policy and calls the FSDP APIs, which
are fsdp-lint's recorders. The drivers here only

* fit the framework to the simulated world (Lightning's ``devices``, accelerate's process state),
* stop it at the training boundary (``TrainingBoundary``: Lightning's ``on_fit_start`` or a Fabric
  model's first forward, the HF Trainer's first batch),
* record which framework made each wrap call (``plan.framework``) and the errors it raises for a
  wrap-class name that matches nothing (reported as FSD103),
* read configurations as the framework does (``--accelerate-config``: accelerate's own launcher code
  turns the YAML into the environment ``accelerate launch`` would set),
* build Hugging Face models from a config without downloading (``--hf-config``, ``from_pretrained``).

Nothing here imports a framework (or torch) until a replayed file does.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

# options of the current lint (``--accelerate-config``, ``--hf-config``, ``--hf-class``), set by the
# engine around a replay: the sandbox installs the drivers without knowing the settings
_OPTIONS: List[Any] = []


@contextlib.contextmanager
def configured(options) -> Iterator[None]:
    """Make `options` (a FrameworkOptions) the ones `install` sees while the block runs."""
    _OPTIONS.append(options)
    try:
        yield
    finally:
        _OPTIONS.pop()


def current_options():
    from fsdp_lint.frameworks.options import FrameworkOptions

    return _OPTIONS[-1] if _OPTIONS else FrameworkOptions()


def install(rec, patch) -> None:
    """Called by the replay's sandbox after the FSDP recorders are in place."""
    from fsdp_lint.frameworks import accelerate, hf, lightning, trl
    from fsdp_lint.frameworks.hooks import install_hooks, simulate_ddp, simulate_object_collectives

    options = current_options()
    table: Dict[str, List[Any]] = {}
    for driver in (lightning, accelerate, hf, trl):
        for name, fns in driver.hook_table().items():
            table.setdefault(name, []).extend(fns)
    for driver in (accelerate, hf):
        driver.prepare_environment(rec, patch, options)
    simulate_object_collectives(rec, patch)
    simulate_ddp(rec, patch)
    install_hooks(rec, patch, options, table)


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

    from fsdp_lint.frameworks.options import find_literal
    from fsdp_lint.plan import PolicyInfo

    from fsdp_lint.frameworks.accelerate import apply_upcast

    plan.framework = framework_of(result.wrap_calls)
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

    from fsdp_lint.frameworks.options import find_literal

    for arg in argv:
        candidate = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if candidate.startswith("-") or not os.path.isfile(candidate):
            continue
        spot = find_literal(candidate, name)
        if spot is not None:
            return candidate, spot[0]
    return None
