"""accelerate driven through its own code.

``Accelerator.prepare`` computes the policy (``FullyShardedDataParallelPlugin.set_auto_wrap_policy``:
``TRANSFORMER_BASED_WRAP`` names or the model's ``_no_split_modules``, ``SIZE_BASED_WRAP`` with its
threshold, ``NO_WRAP``) and calls ``FullyShardedDataParallel(model, ...)`` (``fsdp_version: 1``) or
``fully_shard`` per module, embedding and tail groups, root (``fsdp_version: 2``): fsdp-lint's recorders
see exactly those calls. The configuration comes from the code (``FullyShardedDataParallelPlugin``),
the environment ``accelerate launch`` sets (``ACCELERATE_USE_FSDP``, ``FSDP_*``), or ``--accelerate-config``.
A config that is not FSDP's starts the processes for a script that shards with torch's FSDP itself; an
Accelerator that prepares a model under it would wrap it in DDP, which is said in one line.

Patched for the replay only:

* accelerate's process-wide state (``PartialState``/``AcceleratorState``/``GradientState`` are
  singletons) is fresh for each replay and put back afterwards;
* a wrap-class name that matches no module: accelerate raises ``Could not find the transformer layer
  class ...``; fsdp-lint notes the error (FSD103 quotes it) and lets accelerate continue with the
  names that exist, so the rest of the plan is still linted;
* FSDP2 weight loading (``cpu_ram_efficient_loading``) moves no data in a recorded plan, and data loaders
  are returned as they are (a sampler's generator cannot live on the meta device).
"""
from __future__ import annotations

import re
from typing import Any, Dict, List

FRAMEWORK = "accelerate"
_PLUGIN_IN_CODE = "_fsdp_lint_plugin_in_code"
_NOT_FOUND = re.compile(r"Could not find the transformer layer class (.+?) in the model")


def prepare_environment(rec, patch, options) -> None:
    import os

    os.environ.update(options.accelerate_env)       # the sandbox restores the environment afterwards


def _state(hooks, module) -> None:
    # fresh singletons for this replay; the previous ones come back when the sandbox undoes its patches
    for name in ("PartialState", "AcceleratorState", "GradientState"):
        cls = getattr(module, name, None)
        if cls is not None and isinstance(cls.__dict__.get("_shared_state"), dict):
            hooks.patch(cls, "_shared_state", {})


def _accelerator(hooks, module) -> None:
    for name in ("prepare", "prepare_model"):
        hooks.wrap(module.Accelerator, name, hooks.scope(FRAMEWORK))

    def make(prepare):
        def wrapped(self, *args, **kwargs):
            if _keeps_optimizers_working(self):
                _mark_remapped(hooks, args)
            start = len(hooks.rec.wrap_calls)
            try:
                return prepare(self, *args, **kwargs)
            finally:
                if self.__dict__.get(_PLUGIN_IN_CODE):
                    for call in hooks.rec.wrap_calls[start:]:
                        call.accelerate_plugin_in_code = True
        return wrapped

    def make_init(init):
        def wrapped(self, *args, **kwargs):
            init(self, *args, **kwargs)
            # `Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))`: the configuration is the
            # plugin's arguments (--suggest writes its changes there), not the YAML keys
            if kwargs.get("fsdp_plugin") is not None:
                self.__dict__[_PLUGIN_IN_CODE] = True
        return wrapped

    hooks.wrap(module.Accelerator, "prepare", make)
    hooks.wrap(module.Accelerator, "__init__", make_init)
    hooks.wrap(module.Accelerator, "prepare_model", lambda fn: _not_sharding(hooks, fn))
    if not hooks.rec.real:
        hooks.wrap(module.Accelerator, "prepare_model", lambda fn: _upcast_after(hooks, fn))
        # data loaders do not change the plan, and their samplers' generators cannot live on meta
        hooks.wrap(module.Accelerator, "prepare_data_loader", lambda fn: lambda self, loader, *a, **k: loader)


def _not_sharding(hooks, prepare_model):
    """An accelerate config that is not FSDP's (``distributed_type: MULTI_GPU``) launches the processes a
    script that calls FSDP itself needs; an Accelerator that prepares the model under that config wraps it
    in DDP (or DeepSpeed): nothing to plan, said in one line."""
    def wrapped(self, model, *args, **kwargs):
        kind = str(getattr(self, "distributed_type", "")).rsplit(".", 1)[-1]
        # (without a config -- the HF Trainer without FSDP arguments -- the plan is fsdp-lint's suggestion)
        if getattr(hooks.options, "accelerate_config", None) and kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_HPU", "DEEPSPEED") \
                and not _is_fsdp(model):
            from fsdp_lint.replay.records import ReplayError

            wrapper = "DeepSpeed" if kind == "DEEPSPEED" else "DistributedDataParallel"
            raise ReplayError(f"`Accelerator.prepare` wraps the model in {wrapper} (accelerate's distributed_type is "
                              f"{kind}, not FSDP): nothing is sharded -- set `distributed_type: FSDP` and its "
                              f"fsdp_config in the accelerate config")
        return prepare_model(self, model, *args, **kwargs)
    return wrapped


def _is_fsdp(model) -> bool:
    # a model the script wrapped itself before handing it to accelerate
    return any(type(m).__name__ in ("FullyShardedDataParallel",) or type(m).__name__.startswith("FSDP")
               for m in model.modules()) if hasattr(model, "modules") else True


def _upcast_after(hooks, prepare_model):
    """FSDP1 with mixed precision: after wrapping, accelerate upcasts every trainable FlatParameter that is
    not float32 to float32 (the optimizer's master weights). The recorded wrap calls carry that, and
    `annotate_plan` applies it to the units that own trainable low-precision parameters."""
    def wrapped(self, *args, **kwargs):
        start = len(hooks.rec.wrap_calls)
        try:
            return prepare_model(self, *args, **kwargs)
        finally:
            if getattr(self, "mixed_precision", "no") != "no":
                for call in hooks.rec.wrap_calls[start:]:
                    if call.api == "fsdp1":
                        call.upcast_trainable_to_fp32 = True
    return wrapped


def plugin_in_code(result) -> bool:
    """Whether accelerate wrapped with a ``FullyShardedDataParallelPlugin`` the code passed to
    ``Accelerator(fsdp_plugin=...)`` (not one built from the environment / YAML config)."""
    return any(getattr(call, "accelerate_plugin_in_code", False) for call in result.wrap_calls)


def apply_upcast(plan, result, tree) -> None:
    calls = {call.seq for call in result.wrap_calls if getattr(call, "upcast_trainable_to_fp32", False)}
    for unit in plan.units:
        if unit.seq not in calls or not unit.params:
            continue
        infos = [tree.params[p] for p in unit.params]
        dtypes = {p.dtype for p in infos}
        # a FlatParameter is uniform (else FSDP raised, FSD203), trainable if any of its params is
        if len(dtypes) == 1 and dtypes != {"float32"} and any(p.requires_grad for p in infos):
            for p in infos:
                p.dtype = "float32"


def _keeps_optimizers_working(accelerator) -> bool:
    """Whether an optimizer built over the model's parameters before ``prepare()`` still trains it.
    FSDP2: accelerate points it at the DTensors (``fsdp2_switch_optimizer_parameters``). FSDP1 with
    ``use_orig_params=True``: FSDP keeps the original Parameter objects. FSDP1 with
    ``use_orig_params=False``: accelerate does not remap it (checked with ``--run``: the optimizer holds
    none of the FlatParameters and nothing trains), which is FSD501's failure."""
    if getattr(accelerator, "is_fsdp2", False):
        return True
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    return plugin is None or bool(getattr(plugin, "use_orig_params", True))


def _mark_remapped(hooks, args) -> None:
    """Optimizers handed to ``prepare()`` together with the model, where they keep training it (see
    `_keeps_optimizers_working`): building them before the wrap is no mistake there."""
    import torch

    for obj in args:
        if isinstance(obj, torch.optim.Optimizer):
            ids = {id(p) for group in obj.param_groups for p in group["params"]}
            for call in hooks.rec.optimizers:
                if set(call.param_ids) == ids:
                    call.remapped_by = FRAMEWORK


def _plugin(hooks, module) -> None:
    plugin_cls = module.FullyShardedDataParallelPlugin

    def make(set_auto_wrap_policy):
        def wrapped(self, model, *args, **kwargs):
            try:
                return set_auto_wrap_policy(self, model, *args, **kwargs)
            except ValueError as exc:
                if hooks.rec.real or not _NOT_FOUND.search(str(exc)):
                    raise               # a real session (--run, the tests' oracle) raises as accelerate does
                _note_missing(hooks, self, model, exc)
                return set_auto_wrap_policy(self, model, *args, **kwargs)
        return wrapped

    hooks.wrap(plugin_cls, "set_auto_wrap_policy", make)


def _note_missing(hooks, plugin, model, exc) -> None:
    """accelerate raised for a class name the model lacks: note every missing name, keep the others."""
    from accelerate.utils.dataclasses import get_module_class_from_name

    explicit = plugin.transformer_cls_names_to_wrap is not None
    names = list(plugin.transformer_cls_names_to_wrap if explicit else (getattr(model, "_no_split_modules", None) or []))
    missing = [n for n in names if get_module_class_from_name(model, n) is None]
    found = [n for n in names if n not in missing]
    setting = ("transformer_layer_cls_to_wrap" if explicit
               else f"_no_split_modules of {type(model).__name__} (no transformer_layer_cls_to_wrap given)")
    hooks.note_error(FRAMEWORK, f"{type(exc).__name__}: {exc}", names, missing, setting,
                     api="fsdp2" if getattr(plugin, "fsdp_version", 1) == 2 else "fsdp1")
    plugin.transformer_cls_names_to_wrap = found


def _fsdp_utils(hooks, module) -> None:
    if not hooks.rec.real and hasattr(module, "fsdp2_load_full_state_dict"):
        hooks.patch(module, "fsdp2_load_full_state_dict", lambda *args, **kwargs: None)


def hook_table() -> Dict[str, List[Any]]:
    return {
        "accelerate.state": [_state],
        "accelerate.accelerator": [_accelerator],
        "accelerate.utils.dataclasses": [_plugin],
        "accelerate.utils.fsdp_utils": [_fsdp_utils],
    }
