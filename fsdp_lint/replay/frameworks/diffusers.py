"""diffusers' models (``ModelMixin``: a video or image DiT, a UNet, a VAE) built from their config, as the
Hugging Face models are: a lint reads no weights and downloads nothing.

``WanModel.from_pretrained(checkpoint_dir)`` / ``FluxTransformer2DModel.from_pretrained(repo,
subfolder="transformer", torch_dtype=torch.bfloat16)`` on a node reads the folder's config.json and
loads the weights; the weights change no unit, dtype aside. So the model is diffusers' own
``from_config`` of the config ``load_config`` finds locally (the folder, the local cache), built under
the dtype asked for, with diffusers' ``_keep_in_fp32_modules`` kept in float32 and floating point
parameters and buffers in the dtype asked for (or float32), as diffusers' loader leaves them; in eval
mode, as ``from_pretrained`` returns it. A config that is not here ends the replay naming it: what it
holds decides the model."""
from __future__ import annotations

import os
from typing import Any, Dict, List

# from_pretrained's arguments about loading, not about the model (diffusers 0.2x-0.4x)
_LOADING = {"cache_dir", "ignore_mismatched_sizes", "force_download", "from_flax", "resume_download", "proxies",
            "output_loading_info", "local_files_only", "token", "use_auth_token", "revision", "torch_dtype",
            "dtype", "subfolder", "device_map", "max_memory", "offload_folder", "offload_state_dict",
            "low_cpu_mem_usage", "variant", "use_safetensors", "quantization_config", "disable_mmap",
            "parallel_config", "use_flashpack", "flashpack_kwargs", "mirror", "dduf_entries"}


def missing_model_config(name: str, subfolder) -> str:
    where = f"{name}/{subfolder}" if subfolder else str(name)
    if os.path.isabs(str(name)) or str(name).startswith((".", "~")) or os.path.isdir(str(name)):
        return (f"no config.json in {where} here (the model's checkpoint folder): its config decides the model "
                f"and fsdp-lint reads no weights -- put the checkpoint's config.json there")
    from fsdp_lint.replay.frameworks.hf import missing_config_message

    return missing_config_message(str(name)) + (f" (its `{subfolder}/config.json`)" if subfolder else "")


def _modeling(hooks, module) -> None:
    import torch

    from fsdp_lint.replay.frameworks.hf import HubConfigMissing

    def make(from_pretrained):
        def wrapped(cls, pretrained_model_name_or_path=None, **kwargs):
            name = pretrained_model_name_or_path
            subfolder = kwargs.get("subfolder")
            dtype = kwargs.get("dtype") if kwargs.get("dtype") is not None else kwargs.get("torch_dtype")
            if dtype is not None and not isinstance(dtype, torch.dtype):
                dtype = torch.float32           # as diffusers: a dtype that is not one is float32
            overrides = {k: v for k, v in kwargs.items() if k not in _LOADING}
            try:
                config, unused = cls.load_config(name, subfolder=subfolder, local_files_only=True,
                                                 cache_dir=kwargs.get("cache_dir"), revision=kwargs.get("revision"),
                                                 return_unused_kwargs=True, **overrides)
            except (OSError, ValueError):
                if os.path.isfile(os.path.join(str(name), subfolder or "", "config.json")):
                    raise           # a config that is here and that diffusers refuses: a node fails there too
                raise HubConfigMissing(missing_model_config(name, subfolder)) from None
            previous = torch.get_default_dtype()
            if dtype is not None and dtype.is_floating_point:
                torch.set_default_dtype(dtype)
            try:
                with module.no_init_weights():
                    model = cls.from_config(config, **unused)
            finally:
                torch.set_default_dtype(previous)
            _loaded_dtypes(model, dtype, cls._keep_in_fp32_modules)
            return model.eval()
        return wrapped

    hooks.wrap(module.ModelMixin, "from_pretrained", make)


def _loaded_dtypes(model, dtype, keep_in_fp32) -> None:
    """The dtypes diffusers' loader gives the checkpoint's tensors: `dtype` (float32 for those of a
    module named in `keep_in_fp32`), or what the model was built with when no dtype was asked for."""
    import torch

    if dtype is None:
        return
    keep: List[str] = list(keep_in_fp32) if isinstance(keep_in_fp32, (list, tuple)) else \
        [keep_in_fp32] if keep_in_fp32 else []
    persistent = set(model.state_dict(keep_vars=True))
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name not in persistent or not tensor.is_floating_point():
                continue
            want = torch.float32 if any(m in name.split(".") for m in keep) else dtype
            if tensor.dtype != want:
                tensor.data = tensor.data.to(want)


def hook_table() -> Dict[str, List[Any]]:
    return {"diffusers.models.modeling_utils": [_modeling]}
