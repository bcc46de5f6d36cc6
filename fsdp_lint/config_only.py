"""``fsdp-lint --hf-config CONFIG [--accelerate-config FSDP.yaml]``: a Hugging Face model alone.

The model is built from its config on the meta device (``--hf-class``, else the config's
``architectures``, else ``AutoModelForCausalLM``). With an accelerate config, accelerate wraps it as
``accelerate launch --config_file FSDP.yaml`` would (``Accelerator().prepare(model, optimizer)``): "will
this config work on this model". Without one, the plan is fsdp-lint's suggested per-block plan.
Findings point at the accelerate config (or the model config).
"""
from __future__ import annotations

import os

from fsdp_lint.engine import FileResult, LintError


def build_hf_model(options):
    """The model of `options.hf_config`, of class `options.hf_class`, on the meta device."""
    try:
        import transformers
    except ImportError:
        raise LintError("--hf-config needs transformers: pip install 'fsdp-lint[hf]'") from None
    config = transformers.AutoConfig.from_pretrained(options.hf_config, local_files_only=True)
    name = options.hf_class or ((getattr(config, "architectures", None) or [None])[0]) or "AutoModelForCausalLM"
    cls = getattr(transformers, name, None)
    if cls is None or not hasattr(cls, "from_config") and not hasattr(cls, "_from_config"):
        raise LintError(f"--hf-class {name}: transformers {transformers.__version__} has no model class of that name")
    try:
        if hasattr(cls, "_model_mapping"):           # AutoModel*
            return cls.from_config(config)
        return cls._from_config(config)
    except Exception as exc:
        raise LintError(f"--hf-config {options.hf_config}: {name} cannot be built from it: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def lint_config(settings) -> FileResult:
    from fsdp_lint.api import Recording
    from fsdp_lint.replay.frameworks.options import FrameworkOptions, OptionError

    try:
        options = FrameworkOptions.from_settings(settings)
    except OptionError as exc:
        raise LintError(str(exc)) from None
    path = os.path.abspath(options.accelerate_config or options.hf_config)
    rec = Recording(settings.world_size, settings=settings, path=path)
    try:
        with rec:
            model = build_hf_model(options)
            if options.accelerate_config:
                import torch
                from accelerate import Accelerator

                optimizer = torch.optim.AdamW(model.parameters())
                Accelerator().prepare(model, optimizer)
    except LintError:
        raise
    except Exception as exc:
        raise LintError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if options.accelerate_config:
        line = options.yaml_lines().get("fsdp_config", (1, 1))[0]
        for call in rec.rec.wrap_calls:
            if call.pos.line == 0:
                call.pos.line = line
    report = rec.report(model)
    return report.result
