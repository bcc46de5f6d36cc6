"""Checkpoint files the setup reads that this machine does not have: a stand-in state dict.

Setup code loads base weights before or while wrapping, from files that exist only on the cluster:
``torch.load(folder / "consolidated.00.pth", map_location="cpu")``, ``safetensors.torch.load_file(...)``,
``safe_open(...)``, then ``model.load_state_dict(sd, strict=False)`` or ``(sd, assign=True)``. Like a
missing data set, a missing weights file is something the simulated node lacks, not a bug of the script:
the load returns a `StandInStateDict`, the state dict of the model's own parameters as meta tensors of
their shapes and dtypes (weights never change a plan; shapes and dtypes must not):

* ``module.load_state_dict(stand_in, ...)`` loads nothing and reports no missing or unexpected keys, so
  the module keeps its own parameters (``assign=True`` included; a module the setup built on meta is then
  real, as the checkpoint's tensors are on a node: `fsdp_lint.replay.device_mode`);
* read before any module loads it (``for k, v in sd.items(): if model_sd[k].shape != v.shape``), it holds
  the state dict of the largest model built so far;
* a key that is no parameter name (``ckpt["model"]``, ``ckpt["ema"]``: a checkpoint of sub-dicts) is a
  stand-in again, bound the same way.

Only a path that does not exist stands in; an existing file is loaded for real, and a file the setup only
checks for (``os.path.exists(...)``) answers the truth -- that check is the script's own decision (it
asserts the weights are there), which fsdp-lint reports with the path.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

from fsdp_lint.replay import device_mode, host_values


class StandInStateDict(dict):
    """The state dict of a checkpoint file this machine lacks (see the module)."""

    def __init__(self, rec, path: str, where: str):
        super().__init__()
        self._rec, self._path, self._where = rec, path, where
        self._bound = False

    # -- binding to a model ---------------------------------------------------------------------
    def _bind(self, module=None) -> None:
        if self._bound:
            return
        self._bound = True
        module = module if module is not None else _largest_model(self._rec)
        if module is None:
            return
        import torch

        with torch._C.DisableTorchFunction():
            for name, value in module.state_dict(keep_vars=False).items():
                if isinstance(value, torch.Tensor):
                    dict.__setitem__(self, name, torch.empty(value.shape, dtype=value.dtype, device="meta"))
                else:
                    dict.__setitem__(self, name, value)

    def __missing__(self, key):
        same = self._same_parameter(key)
        if same is not None:
            return same
        if isinstance(key, str) and not self._bound_has_prefix(key):
            child = StandInStateDict(self._rec, self._path, self._where)
            dict.__setitem__(self, key, child)
            return child
        raise KeyError(key)

    def _same_parameter(self, key):
        """The model's tensor a checkpoint key names under another prefix (``model.embed_tokens.weight`` of a
        hub checkpoint read for a head whose own name is ``embed_tokens.weight``), when exactly one matches."""
        if not isinstance(key, str) or "." not in key:
            return None
        found = [k for k in dict.keys(self) if isinstance(dict.__getitem__(self, k), StandInStateDict) is False
                 and (key.endswith("." + k) or k.endswith("." + key))]
        return dict.__getitem__(self, found[0]) if len(found) == 1 else None

    def _bound_has_prefix(self, key: str) -> bool:
        return any(k.startswith(key + ".") for k in dict.keys(self))

    def __getitem__(self, key):
        self._bind()
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._bind()
        return dict.get(self, key, default)

    def __contains__(self, key):
        self._bind()
        return dict.__contains__(self, key) or self._same_parameter(key) is not None

    def __iter__(self):
        self._bind()
        if not dict.__len__(self) and _largest_model(self._rec) is None:
            # (`mean, std = torch.load(stats)` before any model: what the file holds decides what comes next)
            exc = TypeError(f"cannot unpack {type(self).__name__} of {self._path!r}: its contents are not here")
            exc._fsdp_lint_stand_in = self._path
            raise exc
        return dict.__iter__(self)

    def __len__(self):
        self._bind()
        return dict.__len__(self)

    def keys(self):
        self._bind()
        return dict.keys(self)

    def values(self):
        self._bind()
        return dict.values(self)

    def items(self):
        self._bind()
        return dict.items(self)

    def pop(self, key, *default):
        self._bind()
        return dict.pop(self, key, *default)

    def __repr__(self) -> str:
        return f"<state dict of {self._path!r}: not on this machine>"

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_path", "_rec", "_where", "_bound"):
            raise AttributeError(name)
        # `load_state_dict_from_url(url).state_dict()` of a file holding a pickled module: which file, said
        exc = AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        exc.name, exc._fsdp_lint_stand_in = name, self._path
        raise exc


def used_as_module(exc: BaseException, any_attribute: bool = False) -> Optional[str]:
    """The missing file whose stand-in the setup used as a module, where `exc` says so, else None.

    ``model.layers[i] = torch.load(f"{dir}/{i}.pth", weights_only=False)``: a file that holds a pickled
    ``nn.Module`` (a quantized layer, a whole model) decides the model itself -- its classes and shapes, which no
    state dict stands in for. torch refuses the stand-in as a child module, as a callable, as a module's
    methods; the cause is the file this machine lacks, not torch's check nor anything a node lacks. Any
    attribute a state dict lacks counts where the failure already ends the lint (`any_attribute`: ``for layer
    in model.layers`` of a pickled whole model, a line deciding the wrap); a statement that may be skipped is
    refused only for a module's own attributes."""
    marked = getattr(exc, "_fsdp_lint_stand_in", None)     # (raised by the stand-in itself: no frame holds it)
    if marked and not isinstance(exc, AttributeError):
        return marked
    if not isinstance(exc, (TypeError, AttributeError)) or StandInStateDict.__name__ not in str(exc):
        return None
    if isinstance(exc, AttributeError) and not (any_attribute or _module_attribute(exc)):
        return None         # (`args = torch.load("args.bin")`, then `args.lr`: a pickled object, may be skipped)
    tb = exc.__traceback__
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            if isinstance(value, StandInStateDict):
                return value._path
        tb = tb.tb_next
    return marked


def _module_attribute(exc: AttributeError) -> bool:
    """Whether the attribute `exc` misses is one every ``nn.Module`` has (``.to``, ``.eval``, ``.parameters``)."""
    import torch.nn as nn

    name = getattr(exc, "name", None)
    if not name:
        found = re.search(r"has no attribute '(\w+)'", str(exc))
        name = found.group(1) if found else None
    return bool(name) and hasattr(nn.Module, name)


def module_use(exc: BaseException) -> str:
    """How the setup used what a missing file holds (`used_as_module`), in words."""
    import torch

    text = str(exc)
    if getattr(exc, "_fsdp_lint_stand_in", None) and isinstance(exc, TypeError):
        return "unpacked (its values decide the tensors built from them)"
    found = re.search(r"has no attribute '(\w+)'", text)
    if found and hasattr(torch.Tensor, found.group(1)) and not _module_attribute(exc):
        return f"as tensors (`.{found.group(1)}` of what it holds: their shapes decide what is built from them)"
    use = "assigned as a child module" if "child module" in text else "called" if "not callable" in text else \
        f"its `.{found.group(1)}` used" if found else "used as a module"
    return f"as a module ({use}: the file holds a pickled nn.Module, a quantized layer or a whole model)"


def _tensors(module):
    yield from module.named_parameters()
    yield from module.named_buffers()


def _largest_model(rec) -> Optional[Any]:
    """The largest top-level module built so far (none of its ancestors was built)."""
    best, best_numel = None, 0
    for module, _ in getattr(rec, "constructed", ()):
        if id(module) in rec.parents:
            continue
        numel = sum(p.numel() for p in module.parameters())
        if numel > best_numel:
            best, best_numel = module, numel
    return best


# the bytes a downloaded file stood in for reads as (frameworks.hf): a loader given them stands in too
NOT_DOWNLOADED_BYTES = b"\x00fsdp-lint: not downloaded\x00"


def _missing_path(f) -> Optional[str]:
    if hasattr(f, "getvalue") and hasattr(f, "read"):
        try:
            data = f.getvalue()
        except Exception:  # noqa: BLE001
            return None
        if isinstance(data, bytes) and data.startswith(NOT_DOWNLOADED_BYTES):
            return os.fsdecode(data[len(NOT_DOWNLOADED_BYTES):])
        return None
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        # (a download stood in for exists to the script, not here: frameworks.hf)
        if f"{os.sep}snapshots{os.sep}not-downloaded{os.sep}" in path or not os.path.exists(path):
            return path
    return None


def _where(rec) -> str:
    pos = rec.position()
    return f"{os.path.basename(pos.path)}:{pos.line}" if pos.line else os.path.basename(pos.path)


def _stand_in(rec, path: str, how: str) -> StandInStateDict:
    where = _where(rec)
    rec.__dict__.setdefault("framework_notes", []).append(
        f"{where}: {how} of `{path}`, which is not on this machine, stands in as the model's own state dict "
        f"(shapes and dtypes kept; no weights are loaded)")
    return StandInStateDict(rec, path, where)


def _on_host(map_location):
    """Where a file that is here loads: a node maps it onto its GPU (``map_location="cuda"``, ``{"cuda:1":
    "cuda:0"}``, ``lambda storage, loc: storage.cuda(rank)``); the simulated GPU's tensors are the host's."""
    import torch

    if isinstance(map_location, (str, torch.device)):
        try:
            return "cpu" if torch.device(map_location).type == "cuda" else map_location
        except (RuntimeError, ValueError, TypeError):
            return map_location
    if isinstance(map_location, dict):
        return {k: _on_host(v) for k, v in map_location.items()}
    if callable(map_location):
        return lambda storage, location: storage
    return map_location


def _with_host_location(args, kwargs, position: int):
    """`args`/`kwargs` of a load whose `map_location` (keyword, or argument `position`) is on the host."""
    if "map_location" in kwargs:
        kwargs = dict(kwargs, map_location=_on_host(kwargs["map_location"]))
    elif len(args) > position:
        args = args[:position] + (_on_host(args[position]),) + args[position + 1:]
    return args, kwargs


def install(rec, patch) -> None:
    import torch
    import torch.nn as nn

    real_load = torch.load
    real_jit_load = torch.jit.load

    def load(f, *args, **kwargs):
        path = _missing_path(f)
        if path is not None:
            return _stand_in(rec, path, "torch.load")
        args, kwargs = _with_host_location(args, kwargs, 0)
        with host_values.reading_a_file():      # in a module's __init__ too: the file's real tensors
            return real_load(f, *args, **kwargs)

    def jit_load(f, *args, **kwargs):
        args, kwargs = _with_host_location(args, kwargs, 0)
        with host_values.reading_a_file():
            return real_jit_load(f, *args, **kwargs)

    patch(torch, "load", load)
    patch(torch.jit, "load", jit_load)
    _install_hub_weights(rec, patch, load)

    real_load_state_dict = nn.Module.load_state_dict

    def load_state_dict(self, state_dict, *args, **kwargs):
        if isinstance(state_dict, StandInStateDict):
            state_dict._bind(self)
            if kwargs.get("assign", args[1] if len(args) > 1 else False):
                # the checkpoint's tensors replace the module's: a setup's meta model is real now
                device_mode.unmark(rec, [t for name, t in _tensors(self) if name in state_dict])
            from torch.nn.modules.module import _IncompatibleKeys

            return _IncompatibleKeys([], [])
        return real_load_state_dict(self, state_dict, *args, **kwargs)

    patch(nn.Module, "load_state_dict", load_state_dict)
    _install_safetensors(rec, patch)


def _install_hub_weights(rec, patch, load) -> None:
    """``torch.hub.load_state_dict_from_url(URL)`` (torchvision's and many repositories' pretrained weights): the
    file the node downloaded into torch's hub cache, where it is here too, else the model's own state dict stands
    in (the weights decide no shape; a lint downloads nothing)."""
    import torch.hub
    import torch.utils.model_zoo as model_zoo
    from urllib.parse import urlparse

    def load_state_dict_from_url(url, model_dir=None, map_location=None, progress=True, check_hash=False,
                                 file_name=None, weights_only=False):
        folder = model_dir or os.path.join(torch.hub.get_dir(), "checkpoints")
        cached = os.path.join(folder, file_name or os.path.basename(urlparse(url).path))
        if os.path.isfile(cached):
            return load(cached, map_location=map_location, weights_only=weights_only)
        return _stand_in(rec, url, "torch.hub.load_state_dict_from_url")

    patch(torch.hub, "load_state_dict_from_url", load_state_dict_from_url)
    patch(model_zoo, "load_url", load_state_dict_from_url)


def _install_safetensors(rec, patch) -> None:
    try:
        import safetensors
        import safetensors.torch as st
    except ImportError:
        return
    real_load_file = st.load_file

    def load_file(filename, *args, **kwargs):
        path = _missing_path(filename)
        if path is not None:
            return _stand_in(rec, path, "safetensors.load_file")
        with host_values.reading_a_file():
            return real_load_file(filename, *args, **kwargs)

    patch(st, "load_file", load_file)
    real_safe_open = safetensors.safe_open

    class _StandInKeys(list):
        """The stand-in file's keys: `key in f.keys()` answers as the stand-in state dict does (a key under
        another prefix, ``model.embed_tokens.weight``, names the model's one matching tensor)."""

        def __init__(self, state):
            super().__init__(state.keys())
            self._state = state

        def __contains__(self, key):
            return key in self._state

    class _OpenStandIn:
        def __init__(self, state):
            self._state = state

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            return _StandInKeys(self._state)

        def get_tensor(self, name):
            return self._state[name]

        def metadata(self):
            return {}

    class _ReadingFile:
        """A real safe_open handle whose tensors are the file's (host tensors in a module's __init__ too)."""

        def __init__(self, handle):
            self._handle = handle

        def __enter__(self):
            self._handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self._handle.__exit__(*exc)

        def __getattr__(self, name):
            real = getattr(self._handle, name)
            if name not in ("get_tensor", "get_slice"):
                return real

            def read(*args, **kwargs):
                with host_values.reading_a_file():
                    return real(*args, **kwargs)
            return read

    def safe_open(filename, *args, **kwargs):
        path = _missing_path(filename)
        if path is not None:
            return _OpenStandIn(_stand_in(rec, path, "safetensors.safe_open"))
        return _ReadingFile(real_safe_open(filename, *args, **kwargs))

    patch(safetensors, "safe_open", safe_open)
