"""The torch function mode of the replay: every tensor on the target device, and what a node says of it.

Everything the replay builds lives on the meta device (``--run`` and the torch oracle: on the rank's
device), so ``device="cuda"``, ``.cuda()`` and ``.to(device)`` all land there. A node tells apart the
tensors a script put on meta *itself* from those it put on a GPU, and setup code asks:

    with torch.device("meta"):
        model = build(cfg)                              # meta, on purpose
    model.load_state_dict(load_file(path), assign=True)   # real tensors now
    for m in model.modules():                           # what the checkpoint lacked: LoRA layers
        if all(p.is_meta for p in m.parameters()): init(m)
    assert not any(p.is_meta for p in model.parameters())

So the mode keeps the *intent*: a tensor the setup made on meta -- ``device="meta"`` or under its own
``torch.device("meta")`` (accelerate's ``init_empty_weights``, Lightning's ``empty_init`` included),
``.to("meta")``, ``to_empty(device="meta")`` -- and what is computed from one without another device,
answers ``is_meta`` True and ``device`` meta; every other meta tensor answers as the GPU tensor it stands
for: ``is_meta`` False, ``device`` the current CUDA device (``is_cuda``, ``get_device()`` alike) -- also
where a node would hold it on the CPU until ``.cuda()`` or the wrap moves it, a difference no plan
depends on. ``nn.Linear(..., device=base.weight.device)`` (PEFT's adapters) is then made for the GPU, as
on a node. A meta tensor is materialised as on a node: ``to_empty(device=...)``, ``load_state_dict(...,
assign=True)`` of a checkpoint (`fsdp_lint.replay.checkpoints`), a new tensor made for another device.
The intent is kept per storage (views and parameters share it), only while some tensor was put on meta
(other scripts pay nothing), and fsdp-lint's own code is answered the truth.
"""
from __future__ import annotations

import sys

from fsdp_lint.replay import data_values, host_values, rank_values
from fsdp_lint.replay.records import FSDP_LINT_DIR


def parse_to_args(args, kwargs):
    """(device, dtype) of a ``.to(...)`` call's arguments; (None, None) when torch would refuse them."""
    import torch

    try:
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    except Exception:
        return None, None
    return device, dtype


# ------------------------------------------------------------------------------------------------
# the setup's own meta tensors
# ------------------------------------------------------------------------------------------------
def _storages(rec) -> dict:
    # StorageImpl address -> the storage, held so that no other storage reuses the address; meta
    # storages hold no memory
    return rec.__dict__.setdefault("meta_intent", {})


def _key(tensor):
    try:
        storage = tensor.untyped_storage()
    except Exception:  # noqa: BLE001  (a tensor subclass without a storage of its own)
        return None, None
    return storage._cdata, storage


def _is_meta_device(device) -> bool:
    import torch

    if isinstance(device, str):
        return device.split(":")[0] == "meta"
    return isinstance(device, torch.device) and device.type == "meta"


def mark(rec, out) -> None:
    """The tensors of `out` were put on meta by the setup."""
    import torch

    for tensor in _flat(out):
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            key, storage = _key(tensor)
            if key is not None:
                _storages(rec)[key] = storage


def unmark(rec, tensors) -> None:
    """These tensors are real on a node now (materialised, or loaded with ``assign=True``)."""
    storages = rec.__dict__.get("meta_intent")
    if not storages:
        return
    for tensor in tensors:
        key, _ = _key(tensor)
        storages.pop(key, None)


_STAND_IN = "_fsdp_lint_meta_stand_in"


def stand_in(tensor):
    """A tensor fsdp-lint makes in place of torch's own (the recorded FSDP1 wrap's FlatParameter): meta
    for every reader, so code after the wrap that skips meta parameters skips it (fsdp-lint models what
    it would have done: accelerate's fp32 upcast)."""
    tensor.__dict__[_STAND_IN] = True
    return tensor


def intended_meta(rec, tensor) -> bool:
    storages = rec.__dict__.get("meta_intent")
    if not storages:
        return False
    key, _ = _key(tensor)
    return key in storages


def materialise_module(rec, module, device, recurse: bool = True) -> None:
    """``module.to_empty(device=...)``: its tensors are on `device` on a node."""
    tensors = list(module.parameters(recurse=recurse)) + list(module.buffers(recurse=recurse))
    if _is_meta_device(device):
        mark(rec, tensors)
    else:
        unmark(rec, tensors)


def _flat(obj):
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flat(item)
    else:
        yield obj


def _from_intended_meta(rec, args, kwargs) -> bool:
    return any(intended_meta(rec, t) for t in _flat(list(args) + list(kwargs.values()))
               if _is_tensor(t))


def _is_tensor(obj) -> bool:
    import torch

    return isinstance(obj, torch.Tensor)


_ATTRIBUTES: dict = {}    # getset descriptor of ``Tensor.is_meta``/``device``/``is_cuda``/``is_cpu`` -> name


_METHOD_WRAPPER = type(object().__str__)     # the ``__get__`` of a tensor attribute's descriptor


def _asked_attribute(func):
    if type(func) is _METHOD_WRAPPER:
        return _ATTRIBUTES.get(func.__self__)
    return "get_device" if func is _ATTRIBUTES.get("get_device") else None


def _node_answer(rec, name: str, tensor):
    """What a node says of `tensor`: a meta tensor the setup did not put on meta is on the node's GPU
    (current device). fsdp-lint's own code (recorders, hooks) is told the truth."""
    import torch

    caller = sys._getframe(2).f_code.co_filename
    node_gpu = tensor.is_meta and not caller.startswith(FSDP_LINT_DIR) and not intended_meta(rec, tensor) \
        and not tensor.__dict__.get(_STAND_IN)
    if not node_gpu:
        return tensor.get_device() if name == "get_device" else getattr(tensor, name)
    if name == "device":
        return torch.device("cuda", torch.cuda.current_device())
    if name == "get_device":
        return torch.cuda.current_device()
    return name == "is_cuda"


# ------------------------------------------------------------------------------------------------
# the mode
# ------------------------------------------------------------------------------------------------
def device_mode(target_device, rec):
    import torch
    from torch.overrides import TorchFunctionMode

    # small tensors made outside the model hold values (fsdp_lint/replay/host_values.py)
    host = target_device.type == "meta" and not rec.real
    if not _ATTRIBUTES:
        _ATTRIBUTES.update({torch._C.TensorBase.__dict__[n]: n for n in ("is_meta", "device", "is_cuda", "is_cpu")})
        _ATTRIBUTES["get_device"] = torch.Tensor.get_device
    factories = host_values.factories() if host else frozenset()
    set_item = torch.Tensor.__setitem__

    def call(func, args, kwargs, intent):
        read = data_values.reads_a_value(func)
        if read is not None:     # issue 15: `.item()`, `bool(t)` of a tensor with no data here
            return data_values.read_value(read, func, args, kwargs, rec)
        if func is torch.device and len(args) == 1 and type(args[0]) is int and not kwargs:
            return func("cuda", args[0])     # an ordinal names a device of the node's accelerator
        if "device" in kwargs and kwargs["device"] is not None:
            kwargs["device"] = target_device
        if func in factories:
            return host_values.make_on_host(func, args, kwargs)
        if func is set_item and host:
            return rank_values.set_item(func, args, kwargs)   # `t[rank] = 1`: each rank its own slot
        if func is torch.Tensor.cuda or (func is torch.Tensor.cpu and target_device.type == "meta"):
            return args[0]       # every device is the target device, as `.to(device)` is
        if func is torch.Tensor.to:
            device, dtype = parse_to_args(args[1:], kwargs)
            if intent and _is_meta_device(device) and not intended_meta(rec, args[0]):
                # `.to("meta")` of a tensor a node holds on its GPU is a new meta tensor
                return func(args[0], dtype=dtype or args[0].dtype, copy=True)
            if dtype is None:
                return args[0]
            return func(args[0], dtype=dtype)
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as exc:
            if not host or not host_values.is_device_mix(exc):
                raise
            # a host tensor met a meta one: no data in, no data out
            moved_args, moved_kwargs = host_values.to_meta_args(args, kwargs)
            return func(*moved_args, **moved_kwargs)

    def asks_meta(func, args, kwargs) -> bool:
        if "device" in kwargs:
            return _is_meta_device(kwargs["device"])
        return func is torch.Tensor.to and _is_meta_device(parse_to_args(args[1:], kwargs)[0])

    class _DeviceMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not host:
                return call(func, args, kwargs, False)
            attribute = _asked_attribute(func)
            if attribute is not None:
                return _node_answer(rec, attribute, args[0])
            if asks_meta(func, args, kwargs):
                # the setup's own meta tensor (fsdp-lint's stand-ins are not the setup's)
                intent = not sys._getframe(1).f_code.co_filename.startswith(FSDP_LINT_DIR)
            elif kwargs.get("device") is not None:
                intent = False                       # made for a device of the node: real there
            else:
                intent = bool(rec.__dict__.get("meta_intent")) and _from_intended_meta(rec, args, kwargs)
            out = call(func, args, kwargs, intent)
            if intent:
                mark(rec, out)
            return out

    return _DeviceMode()

