"""The Hugging Face Trainer driven through its own code, and Hugging Face models without downloads.

``Trainer(args=TrainingArguments(fsdp="full_shard auto_wrap", fsdp_config={...}))`` turns its arguments
into an accelerate FSDP plugin; ``trainer.train()`` builds the data loader, then (PEFT models: after
``update_fsdp_plugin_peft``) hands the model to ``accelerator.prepare``. All of that runs as the
installed transformers does it; the replay stops right after, before the first batch.

Patched for the replay only:

* ``Trainer._prepare_for_training`` ends the replay once the model is wrapped and the optimizer built;
* ``Trainer.init_hf_repo`` (``--push_to_hub``) creates no repository on the hub;
* a train data set that cannot be loaded here (no network, ``datasets`` not installed), or whose loader
  has no length because the statements that fill it could not run here, is replaced by a one-sample
  loader: the data does not change the plan, and no batch is ever drawn;
* ``datasets.load_dataset`` that cannot load here returns a real, tiny ``datasets`` object
  (`fsdp_lint.replay.data_standins`);
* ``from_pretrained("org/name")`` builds the model from its config on the meta device: the config comes
  from ``--hf-config`` or the local Hugging Face cache (the hub is never contacted); weights are never
  loaded. The dtype is resolved as ``from_pretrained`` resolves it (``dtype="auto"``: the config's).
"""
from __future__ import annotations

import inspect
import os
import sys
import types
from typing import Any, Dict, List

from fsdp_lint.replay.frameworks.hf_saves import save_pretrained_hook
from fsdp_lint.replay.frameworks.hub_snapshots import NOT_DOWNLOADED, WEIGHT_SUFFIXES, snapshot_download_hook
from fsdp_lint.replay.hub_commands import RERUN_HINT, SETUP_FILES, bare_name, download_command, is_hub_id
from fsdp_lint.replay.network import HUB_FILE, NotDownloaded
from fsdp_lint.replay.records import IN_TRAINING

FRAMEWORK = "transformers"


def prepare_environment(rec, patch, options) -> None:
    pass


class HubConfigMissing(NotDownloaded):
    """A model named by its hub id has no config here (fsdp-lint never downloads)."""


class TokenizerMissing(NotDownloaded):
    """A tokenizer named by its hub id has no files here (fsdp-lint never downloads)."""


class HubFileMissing(NotDownloaded):
    """A file the project's code asks the hub for (``hf_hub_download(repo_id, filename)``) is not in the
    local cache (fsdp-lint never downloads)."""


def missing_config_message(name: str) -> str:
    cache = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    if bare_name(name):
        return f"{bare_name(name)}; pass --hf-config path/to/config.json, or the folder's path in the script's arguments"
    if not is_hub_id(name):
        return (f"no model folder {name!r} here (no config.json in it): a path of the node the job runs on -- a "
                f"checkpoint it trained or downloaded before -- that this machine does not have; pass "
                f"--hf-config path/to/config.json, or the folder's path in the script's arguments")
    code = _missing_code(name)
    if code:
        # the config is here; the model's own code (`auto_map`, trust_remote_code) is not
        return (f"the hub model {name!r} has its config.json here but not its own code ({', '.join(code)}; "
                f"trust_remote_code), and fsdp-lint never downloads: put them in the local Hugging Face cache "
                f"({cache}) with `{download_command(name, code)}`")
    return (f"no config.json for the hub model {name!r} here, and fsdp-lint never downloads: pass "
            f"--hf-config path/to/config.json (or the model's directory), or put its config and tokenizer (no "
            f"weights) in the local Hugging Face cache ({cache}) with `{download_command(name, include=SETUP_FILES)}`"
            f"{RERUN_HINT}")


def _missing_code(name: str) -> List[str]:
    """The code files a cached config.json's ``auto_map`` names that are not in the cache (``[]`` without
    a cached config)."""
    import json

    try:
        from huggingface_hub import try_to_load_from_cache

        # (the cache the environment names now: huggingface_hub reads it once, at its import)
        home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
        cache = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
        config = try_to_load_from_cache(name, "config.json", cache_dir=cache)
        if not isinstance(config, str):
            return []
        with open(config, encoding="utf-8") as fh:
            auto_map = json.load(fh).get("auto_map") or {}
    except Exception:  # noqa: BLE001  (not a hub id, an unreadable config: the plain message)
        return []
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, list) else [v]) if isinstance(r, str)]
    files = sorted({r.split("--")[-1].rsplit(".", 1)[0] + ".py" for r in refs if "." in r})
    return [f for f in files if not isinstance(try_to_load_from_cache(name, f, cache_dir=cache), str)]


def load_config(name_or_path, options, **kwargs):
    """The model's config for ``from_pretrained``: `--hf-config` if given, else the one found locally."""
    from transformers import AutoConfig

    keep = {k: kwargs[k] for k in ("revision", "subfolder", "trust_remote_code", "cache_dir") if k in kwargs}
    if options.hf_config:
        return AutoConfig.from_pretrained(options.hf_config, local_files_only=True)
    try:
        return AutoConfig.from_pretrained(name_or_path, local_files_only=True, **keep)
    except (OSError, ValueError):
        if os.path.exists(str(name_or_path)):
            raise       # a config that is here: transformers' own refusal (a model type nothing registered) is the cause
        raise HubConfigMissing(missing_config_message(str(name_or_path))) from None


def _resolve_dtype(config, kwargs):
    """`from_pretrained`'s dtype: ``dtype``/``torch_dtype`` if given; else "auto" (transformers >= 5,
    the config's dtype) or the default dtype (transformers 4)."""
    import torch
    import transformers

    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype is None:
        dtype = "auto" if int(transformers.__version__.split(".")[0]) >= 5 else None
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()


def _modeling(hooks, module) -> None:
    import transformers

    options = hooks.options

    def make(from_pretrained):
        def wrapped(cls, pretrained_model_name_or_path=None, *model_args, **kwargs):
            config = kwargs.get("config")
            if config is None or isinstance(config, (str, os.PathLike)):
                config = load_config(config or pretrained_model_name_or_path, options, **kwargs)
            dtype = _resolve_dtype(config, kwargs)
            _quantized(hooks, kwargs, config, dtype)
            extra = {k: kwargs[k] for k in ("attn_implementation",) if k in kwargs}
            impl = extra.get("attn_implementation") or getattr(config, "_attn_implementation_internal", None)
            kernel = _absent_attention_kernel(impl)
            if kernel:
                # a GPU attention kernel holds no parameters: the plan is the one of the default attention
                extra.pop("attn_implementation", None)
                if getattr(config, "_attn_implementation_internal", None) == impl:
                    config._attn_implementation = None      # the Auto classes put it on the config
                _note(hooks.rec, f"attn_implementation={impl!r} needs `{kernel}`, which is not installed here: "
                                 f"the model was built with the default attention (kernels hold no parameters; "
                                 f"the plan is the same)")
            # transformers 4 names the argument `torch_dtype` (5 renamed it `dtype`)
            key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
            return cls._from_config(config, **{key: dtype}, **extra)
        return wrapped

    hooks.wrap(module.PreTrainedModel, "from_pretrained", make)


def _quantized(hooks, kwargs, config, dtype) -> None:
    """``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))`` (or a checkpoint
    saved quantized): transformers' own quantizer checks its environment first -- without bitsandbytes it
    refuses, as on a node -- and the quantized layers (bitsandbytes' Params4bit, GPTQ/AWQ packed weights) are
    not modelled: planned unquantized they would scale every unit wrongly, so the plan is refused even with
    --allow-partial (said, never silently shown in the base dtype)."""
    quant = kwargs.get("quantization_config")
    if quant is None and (kwargs.get("load_in_4bit") or kwargs.get("load_in_8bit")):
        quant = {"quant_method": "bitsandbytes", "load_in_4bit": bool(kwargs.get("load_in_4bit")),
                 "load_in_8bit": bool(kwargs.get("load_in_8bit"))}
    pre_quantized = quant is None and getattr(config, "quantization_config", None) is not None
    quant = quant if quant is not None else getattr(config, "quantization_config", None)
    if quant is None:
        return
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quant, pre_quantized=pre_quantized)
    quantizer.validate_environment(dtype=dtype, device_map=kwargs.get("device_map"), weights_only=True)
    method = getattr(quantizer.quantization_config, "quant_method", "")
    method = getattr(method, "value", method)
    pos = hooks.rec.position()
    state = getattr(hooks.rec, "parallel", None)
    if state is not None:
        from fsdp_lint.model.mesh import Unsupported

        state.unsupported.append(Unsupported(
            "quantization", pos.path, pos.line,
            f"{type(quantizer).__name__.replace('HfQuantizer', '')} quantization ({method}): its quantized layers "
            f"hold packed weights FSDP shards as they are stored, which the plan does not model", blocks_partial=True))


# attention implementations that need a kernel package a CPU machine rarely has
_ATTENTION_KERNELS = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _absent_attention_kernel(impl) -> str:
    """The kernel package `attn_implementation` needs when it is not installed here, else ""."""
    import importlib.util

    package = _ATTENTION_KERNELS.get(impl) if isinstance(impl, str) else None
    return package if package and importlib.util.find_spec(package) is None else ""


def _note(rec, text: str) -> None:
    from fsdp_lint.replay.frameworks.hooks import framework_note

    framework_note(rec, text)


def _loads_tokenizers(attr: str):
    """``AutoTokenizer.from_pretrained("org/name")`` (`attr`; ``AutoProcessor`` alike, whose tokenizer is a part)
    that finds no tokenizer files here fails with whatever the tokenizer class says (with `--hf-config`,
    transformers picks the class from that config and fails with "Couldn't instantiate the backend tokenizer"; an
    AutoProcessor with "Unrecognized processing class"): the cause is that the tokenizer is not here."""
    def install(hooks, module) -> None:
        def make(from_pretrained):
            def wrapped(cls, pretrained_model_name_or_path, *args, **kwargs):
                name = str(pretrained_model_name_or_path)
                kwargs.pop("force_download", None)      # (a lint never downloads: what the cache holds is the answer)
                try:
                    loaded = from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs)
                except (OSError, ValueError) as exc:
                    if os.path.isdir(name) and any(f.startswith(("tokenizer", "preprocessor", "processor"))
                                                   for f in os.listdir(name)):
                        raise               # a local tokenizer that fails on its own
                    raise TokenizerMissing(_tokenizer_missing(name, type(exc).__name__)) from None
                if _empty_vocabulary(getattr(loaded, "tokenizer", None) or loaded):
                    # transformers 5 builds the config's tokenizer class with no vocabulary when no tokenizer file
                    # is found (`len()` 1: its special tokens): the length a script resizes the embeddings to
                    # (`resize_token_embeddings(len(tokenizer))`) would shrink the model to a handful of rows
                    raise TokenizerMissing(_tokenizer_missing(name, "no vocabulary file"))
                return loaded
            return wrapped

        hooks.wrap(getattr(module, attr), "from_pretrained", make)
    return install


def _tokenizer_missing(name: str, why: str) -> str:
    if isinstance(name, str) and bare_name(name):
        return f"{bare_name(name)} ({why})"
    if isinstance(name, str) and not is_hub_id(name):       # `/path/to/pretrained/model`: a folder, not a hub id
        return (f"no tokenizer folder {name!r} here: a path of the node the job runs on (or a placeholder of the "
                f"recipe, to be set) that this machine does not have; pass a local tokenizer folder in the script's "
                f"arguments ({why})")
    return (f"no tokenizer for {name!r} here, and fsdp-lint never downloads: put it in the local Hugging "
            f"Face cache (`{download_command(name, include=SETUP_FILES)}`: its configs and tokenizer, no weights; or "
            f"rerun with --fetch-configs) "
            f"or pass a local tokenizer folder in the script's arguments ({why})")


def _empty_vocabulary(tokenizer) -> bool:
    try:
        return tokenizer.vocab_size == 0
    except Exception:               # a tokenizer class without a vocabulary size of its own
        return False


def _auto_config(hooks, module) -> None:
    """``AutoConfig.from_pretrained("org/name")``: `--hf-config`, else the local cache, never the hub. The
    ``AutoModel*`` classes load their config through it, then call the concrete class's ``from_pretrained``
    (patched in `_modeling`); each of them holds its own copy of ``from_pretrained``, so they are not
    patched themselves."""
    hooks.wrap(module.AutoConfig, "from_pretrained", _read_locally(hooks.options, lambda cls: True))


def _concrete_config(hooks, module) -> None:
    """``LlamaConfig.from_pretrained("org/name")`` -- a concrete config class, not AutoConfig: `--hf-config`
    when it is a config of that class's model type, else the local cache, never the hub (a local folder
    or file is read as given)."""
    import json

    options = hooks.options
    base = getattr(module, "PreTrainedConfig", None) or getattr(module, "PretrainedConfig")

    def given_type():
        try:
            with open(options.hf_config) as fh:
                return json.load(fh).get("model_type")
        except (OSError, ValueError, AttributeError):
            return None

    hooks.wrap(base, "from_pretrained", _read_locally(
        options, lambda cls: bool(options.hf_config) and given_type() == getattr(cls, "model_type", None),
        local_first=True))


def _read_locally(options, applies, local_first: bool = False):
    """A config class's ``from_pretrained`` for the replay: `--hf-config` where `applies(cls)`, else the
    local cache only (`local_first`: a folder or file that is here is read as given); a config that
    cannot be had is `HubConfigMissing`, naming it."""
    def make(from_pretrained):
        def wrapped(cls, pretrained_model_name_or_path, *args, **kwargs):
            name = pretrained_model_name_or_path
            if local_first and os.path.exists(str(name)):
                return from_pretrained(cls, name, *args, **kwargs)
            if options.hf_config and applies(cls):
                kwargs.pop("subfolder", None)
                name = options.hf_config
            kwargs["local_files_only"] = True
            kwargs.pop("force_download", None)
            try:
                return from_pretrained(cls, name, *args, **kwargs)
            except (OSError, ValueError) as exc:
                if options.hf_config and name == options.hf_config:
                    raise HubConfigMissing(f"--hf-config {options.hf_config}: transformers cannot read it: "
                                           f"{exc}") from None
                if os.path.exists(str(name)):
                    raise       # here, and refused by transformers itself (an unknown model type): the node's failure
                raise HubConfigMissing(missing_config_message(str(name))) from None
        return wrapped
    return make


def _reporting(get_callbacks, rec):
    """``report_to="wandb"`` with the logger's package not installed here: its callback refuses to be built
    ("WandbCallback requires wandb to be installed") where a node's logs the run. A logger never changes the
    plan: a callback that does nothing stands in for it, in a note."""
    from transformers import TrainerCallback

    def wrapped(report_to):
        out = []
        for callback in get_callbacks(report_to):
            try:
                out.append(callback() if isinstance(callback, type) else callback)
            except (RuntimeError, ImportError) as exc:
                if "install" not in str(exc):
                    raise
                _note(rec, f"report_to: {getattr(callback, '__name__', callback)} needs a package not installed here "
                           f"({str(exc).splitlines()[0]}); a callback that does nothing stood in for it (a logger "
                           f"does not change the plan)")
                out.append(TrainerCallback())
        return out
    return wrapped


def _trainer(hooks, module) -> None:
    from fsdp_lint.replay.records import TrainingBoundary

    Trainer = module.Trainer
    hooks.wrap(Trainer, "train", hooks.scope(FRAMEWORK))

    def make_init(init):
        def __init__(self, *args, **kwargs):
            # the Trainer creates `output_dir` at once; nothing is written before training, so the
            # replay creates no directory in the user's tree
            real_makedirs = os.makedirs
            os.makedirs = lambda *a, **k: None
            try:
                init(self, *args, **kwargs)
            finally:
                os.makedirs = real_makedirs
            own = type(self).get_train_dataloader
            if own is not Trainer.get_train_dataloader:     # a subclass's own loader: a data set not here too
                self.get_train_dataloader = types.MethodType(make_loader(own, own=True), self)
        return __init__

    hooks.wrap(Trainer, "__init__", make_init)
    trainer_module = sys.modules.get(Trainer.__module__)
    if hasattr(trainer_module, "get_reporting_integration_callbacks"):
        hooks.wrap(trainer_module, "get_reporting_integration_callbacks", lambda real: _reporting(real, hooks.rec))
    if hasattr(Trainer, "init_hf_repo"):
        # `--push_to_hub`: the Trainer creates the hub repository in __init__; a lint never touches the hub
        hooks.patch(Trainer, "init_hf_repo", lambda self, *args, **kwargs: None)

    def make_prepare(prepare):
        def _prepare_for_training(self, *args, **kwargs):
            prepare(self, *args, **kwargs)
            raise TrainingBoundary("Trainer.train: the first batch")
        return _prepare_for_training

    if hasattr(Trainer, "_prepare_for_training"):
        hooks.wrap(Trainer, "_prepare_for_training", make_prepare)
    else:
        # transformers 4 has no `_prepare_for_training`: `_inner_training_loop` wraps the model and
        # builds the optimizer inline, then tells the callbacks `on_train_begin` before the first batch
        def make_begin(on_train_begin):
            def wrapped(self, *args, **kwargs):
                on_train_begin(self, *args, **kwargs)
                raise TrainingBoundary("Trainer.train: the first batch")
            return wrapped

        hooks.wrap(module.CallbackHandler, "on_train_begin", make_begin)

    def make_loader(get_train_dataloader, own: bool = False):
        def wrapped(self, *args, **kwargs):
            from torch.utils.data import DataLoader

            try:
                loader = get_train_dataloader(self, *args, **kwargs)
            except Exception as exc:
                if own and _has_real_rows(getattr(self, "train_dataset", None)):
                    raise       # the project's own loader failing over data that is here: as on a node
                setattr(exc, IN_TRAINING, True)       # the Trainer's training was reached
                hooks.rec.record_skip(hooks.rec.position().path, hooks.rec.position().line, exc)
                return DataLoader([0], batch_size=1)
            if not _has_rows(loader):
                # a map-style data set whose length fails or is 0 here (its samples were to be read from data
                # not here, the statements that fill it were skipped): on the node it has rows; the Trainer demands
                # max_steps here, a consequence of the data, not of the plan
                return DataLoader([0], batch_size=1)
            return loader
        return wrapped

    hooks.wrap(Trainer, "get_train_dataloader", make_loader)


def _has_real_rows(dataset) -> bool:
    """Whether `dataset` holds rows that are not stand-ins (data that is here)."""
    from fsdp_lint.replay.data_standins import is_standin, length_was_stood_in

    try:
        return dataset is not None and not is_standin(dataset) and not length_was_stood_in(dataset) and len(dataset) > 0
    except Exception:      # noqa: BLE001 - a length that fails here: its data is not here
        return False


def _has_rows(loader) -> bool:
    """Whether the Trainer can size its schedule from `loader` (``has_length`` and at least one batch)."""
    try:
        return len(loader) > 0
    except Exception:      # noqa: BLE001 - a data set's __len__ that fails here has no length
        return getattr(loader, "dataset", None) is not None and not hasattr(loader.dataset, "__len__")


def _hub(hooks, module) -> None:
    """``push_to_hub=True`` (a Trainer's ``init_hf_repo``, TRL's completion logs): creating a hub
    repository is the hub's business, not the plan's; a lint never touches the hub. The repository
    is taken as created, and the note says so."""
    RepoUrl = getattr(module, "RepoUrl", None)

    def create_repo(*args, **kwargs):
        repo_id = kwargs.get("repo_id") or next((a for a in args if isinstance(a, str)), "repo")
        _note(hooks.rec, f"push_to_hub: the hub repository {repo_id} is not created by a lint")
        endpoint = getattr(module, "ENDPOINT", None) or "https://huggingface.co"
        return RepoUrl(f"{endpoint}/{repo_id}", endpoint=endpoint) if RepoUrl is not None else f"{endpoint}/{repo_id}"

    hooks.patch(module.HfApi, "create_repo", lambda self, *args, **kwargs: create_repo(*args, **kwargs))
    if hasattr(module, "create_repo"):
        hooks.patch(module, "create_repo", create_repo)


_WEIGHTS = WEIGHT_SUFFIXES       # the files of pretrained weights (never a config, a tokenizer or an index)


def _hub_file(hooks, module) -> None:
    """``hf_hub_download(repo_id=..., filename=...)`` of a file the local cache lacks. Pretrained weights
    (a library building a vision tower with ``pretrained=True``) are not needed for a plan: their path
    is given, and loading it stands in. Any other file the project's own code asks for (a checkpoint's
    config): huggingface_hub's offline error says neither which file nor how to get it; the error names
    both. The libraries' own calls for other files (their probes for optional files expect the hub's
    errors) are left as they are."""
    from fsdp_lint.entry.project import is_local

    real = module.hf_hub_download

    _downloaded_exists(hooks)

    def hf_hub_download(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except (OSError, ValueError) as exc:
            if not type(exc).__module__.startswith("huggingface_hub"):
                raise
            repo = kwargs.get("repo_id", args[0] if args else "?")
            name = kwargs.get("filename", args[1] if len(args) > 1 else "?")
            name = f"{kwargs['subfolder']}/{name}" if kwargs.get("subfolder") else name
            if str(name).endswith(_WEIGHTS):
                # pretrained weights a library loads into the model it built (open_clip's, timm's): the
                # path of a file that is not here, whose load stands in as the model's own state dict
                # (fsdp_lint.replay.checkpoints), as a missing checkpoint file's does
                folder = f"models--{str(repo).replace('/', '--')}"
                return os.path.join(module.constants.HF_HUB_CACHE, folder, "snapshots", "not-downloaded", str(name))
            kind = kwargs.get("repo_type")
            if not is_local(sys._getframe(1).f_code.co_filename):
                # a library's own call: its probes for optional files expect the hub's error, which ends
                # the lint naming the file if nothing catches it
                setattr(exc, HUB_FILE, (repo, name, kind))
                raise
            raise HubFileMissing(f"{name} of the hub repository {repo} is not here, and fsdp-lint never downloads: "
                                 f"`{download_command(repo, [name], repo_type=kind)}` "
                                 f"puts it in the local Hugging Face cache ({type(exc).__name__})") from None

    hooks.patch(module, "hf_hub_download", hf_hub_download)
    package = sys.modules.get("huggingface_hub")
    if package is not None and package.__dict__.get("hf_hub_download") is real:
        hooks.patch(package, "hf_hub_download", hf_hub_download)


_NOT_DOWNLOADED = NOT_DOWNLOADED


def _downloaded_exists(hooks) -> None:
    """The weights `hf_hub_download` stood in for exist, as the downloaded file does on a node (``assert
    os.path.exists(path), path`` after the download): ``os.path.exists``/``isfile`` and ``Path.exists``/``is_file``
    answer True for their path; loading it stands in (`fsdp_lint.replay.checkpoints`)."""
    import pathlib

    def answering(real):
        def check(path, *args, **kwargs):
            try:
                if _NOT_DOWNLOADED in os.fspath(path):
                    return True
            except TypeError:
                pass
            return real(path, *args, **kwargs)
        return check

    for name in ("exists", "isfile"):
        hooks.patch(os.path, name, answering(getattr(os.path, name)))
    for name in ("exists", "is_file"):
        hooks.patch(pathlib.Path, name, answering(getattr(pathlib.Path, name)))
    import builtins
    import io

    from fsdp_lint.replay.checkpoints import NOT_DOWNLOADED_BYTES

    real_open = builtins.open

    def opening(file, mode="r", *args, **kwargs):
        # its bytes read for a loader (`torch.load(io.BytesIO(f.read()))`: mmengine's and easy_io's file
        # clients): a marked stand-in that loading stands in for
        # (a snapshot's own files, linked into a stood-in snapshot folder, are read for real)
        if isinstance(file, (str, os.PathLike)) and _NOT_DOWNLOADED in os.fspath(file) and "b" in mode \
                and not any(c in mode for c in "wax+") and os.fspath(file).endswith(_WEIGHTS):
            return io.BytesIO(NOT_DOWNLOADED_BYTES + os.fsencode(os.fspath(file)))
        return real_open(file, mode, *args, **kwargs)

    hooks.patch(builtins, "open", opening)
    hooks.patch(io, "open", opening)


def hook_table() -> Dict[str, List[Any]]:
    return {
        "huggingface_hub.hf_api": [_hub],
        "huggingface_hub.file_download": [_hub_file],
        "transformers.modeling_utils": [_modeling, save_pretrained_hook],
        "transformers.models.auto.configuration_auto": [_auto_config],
        "transformers.configuration_utils": [_concrete_config],
        "transformers.models.auto.tokenization_auto": [_loads_tokenizers("AutoTokenizer")],
        "transformers.models.auto.processing_auto": [_loads_tokenizers("AutoProcessor")],
        "transformers.trainer": [_trainer],
        "datasets": [_datasets],
        "huggingface_hub._snapshot_download": [snapshot_download_hook],
    }


def _datasets(hooks, module) -> None:
    """A data set that cannot be loaded here (the hub is offline for a lint, its files are not here) stands
    in as a real, tiny ``datasets`` object (`fsdp_lint.replay.data_standins`): the library's own functions
    work on it, the plan does not depend on the data, and no sample is ever drawn."""
    from fsdp_lint.replay import data_standins

    def make(load):
        def wrapped(*args, **kwargs):
            try:
                inspect.signature(load).bind(*args, **kwargs)
            except TypeError:
                return load(*args, **kwargs)     # a call the function refuses (`load_dataset()`): as on a node
            except ValueError:
                pass                             # (no signature to check)
            try:
                return load(*args, **kwargs)
            except Exception as exc:
                saved = data_standins.saved_by_rank_0(kwargs.get("dataset_path", args[0] if args else None)) \
                    if load.__name__ == "load_from_disk" else None
                if saved is not None:       # another rank's folder, saved before a barrier: rank 0's
                    _note(hooks.rec, f"load_from_disk of another rank's folder loads rank 0's ({saved})")
                    return load(saved, *args[1:], **{k: v for k, v in kwargs.items() if k != "dataset_path"})
                pos = hooks.rec.position()
                exc.fsdp_lint_data_stand_in = True      # (a later failure on its placeholder rows names it)
                hooks.rec.record_skip(pos.path, pos.line, exc)
                return data_standins.standin_for(load, args, kwargs)
        return wrapped

    for name in ("load_dataset", "load_from_disk"):
        if hasattr(module, name):
            hooks.wrap(module, name, make)
    if hasattr(module, "Dataset"):
        def on_failure(exc):
            pos = hooks.rec.position()
            hooks.rec.record_skip(pos.path, pos.line, exc)

        data_standins.install_columns_on_demand(hooks.patch, module, on_failure,
                                                lambda text: _note(hooks.rec, text))
        data_standins.install_loader_length(hooks.patch)
