"""Tensors that hold values on the simulated node: the small tensors setup code makes outside the
model, and what the collectives of a real world would leave in them.

Setup code builds small tensors "on the GPU", exchanges them and reads them back on the host to decide
something: a run id broadcast as bytes (``torch.tensor(list(s.encode())).cuda()``, ``dist.broadcast``,
``bytes(buf.cpu().numpy())``), the ranks of each node (``all_gather_into_tensor`` of the local world
size, then ``.tolist()``), model-parallel groups from a rank grid (``torch.arange(ws).reshape(dp, mp)``,
``torch.where(grid == rank)``, ``grid[:, k].tolist()``). On the meta device these reads raise or answer
zeros, and the code takes the wrong branch (no data-parallel group, one "node" of every rank).

So a tensor made by a factory call (``torch.tensor``, ``arange``, ``zeros``, ``empty``, ``full``, ...)
outside the construction of a module, and small (at most `HOST_NUMEL` elements), is a real CPU tensor
whatever device it names; so is a small integer or bool one a module's ``__init__`` makes (an index: document
ids from a list of lengths, then ``repeat_interleave``, whose result's shape depends on the values), and a small
floating-point one it makes from values (``linspace``, ``arange``, ``tensor``, ``full``: frequencies it checks
with ``assert freqs.isfinite().all()``). Every other floating-point tensor a module builds in its ``__init__``
(parameters: ``empty``, ``zeros``, ``randn``), every buffer, and every large tensor, stays on meta. A parameter or buffer given such a tensor later
(``model.pos = nn.Parameter(torch.zeros(1, 16, 64))``) is moved to meta when it is registered, and an
operation mixing one with a meta tensor runs on meta: values with no data give no data.

The collectives answer what a real world gives rank 0. A value the node knows for every rank (its rank,
local rank, host name, and small tensors made from them: `fsdp_lint.replay.rank_values`) is each rank's
own; for any other value every rank is taken to hold rank 0's (only rank 0's is known). ``broadcast`` leaves rank 0's tensor as it is (rank 0 is the
usual source); ``all_reduce`` applies its op over `world` equal values (SUM multiplies by the group
size, MAX/MIN/AVG/BAND/BOR keep the value, PRODUCT raises it to the power); ``all_gather``, ``gather``
(to rank 0) and ``all_gather_into_tensor`` fill every rank's slot with rank 0's value (right for the local
world size, the world size, a flag; a value each rank derives from its own rank, such as its local rank, is noted
as rank 0's in every slot); ``reduce_scatter_tensor`` gives the reduction of equal chunks. A tensor with
no data (meta) is left as it is.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import List, Optional

from fsdp_lint.replay import rank_values

HOST_NUMEL = 1 << 16          # elements: a rank grid, a byte string, a schedule -- never a weight

_FACTORY_NAMES = ("tensor", "as_tensor", "asarray", "arange", "range", "linspace", "logspace", "zeros", "ones",
                  "empty", "full", "eye", "rand", "randn", "randint", "randperm", "scalar_tensor",
                  "tril_indices", "triu_indices", "empty_strided")
_factories: Optional[frozenset] = None
# the factories that make a tensor of given values, not an empty, zero or random one (a weight to initialise)
_VALUE_FACTORIES = frozenset({"tensor", "as_tensor", "asarray", "arange", "range", "linspace", "logspace", "full",
                              "scalar_tensor"})


def factories() -> frozenset:
    global _factories
    if _factories is None:
        import torch

        _factories = frozenset(getattr(torch, n) for n in _FACTORY_NAMES if hasattr(torch, n))
    return _factories


# >0 while a file that exists is read (torch.load in a module's __init__ included): its tensors are the file's,
# real CPU tensors as on a node, not what the module builds
_reading_file = [0]


@contextlib.contextmanager
def reading_a_file():
    """The tensors made meanwhile are a file's contents, made on the host whoever's ``__init__`` runs."""
    _reading_file[0] += 1
    try:
        yield
    finally:
        _reading_file[0] -= 1


def in_module_construction() -> bool:
    """Whether a module's ``__init__`` is running (a frame of one on the stack), not reading a file."""
    import torch.nn as nn

    if _reading_file[0]:
        return False
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and frame.f_code.co_argcount:
            owner = frame.f_locals.get(frame.f_code.co_varnames[0])
            if isinstance(owner, nn.Module):
                return True
        frame = frame.f_back
    return False


def make_on_host(func, args, kwargs):
    """The factory call `func` on the CPU, or None when its tensor belongs on meta (large, or made
    while a module is built). Called by the replay's device mode, which passes the call on otherwise."""
    import torch

    out = func(*args, **kwargs)          # on the target device (meta): cheap, and gives the size
    if not isinstance(out, torch.Tensor) or not out.is_meta or out.numel() > HOST_NUMEL \
            or (in_module_construction() and (out.is_floating_point() or out.is_complex())
                and getattr(func, "__name__", "") not in _VALUE_FACTORIES):
        # (a small integer or bool tensor a module's __init__ makes is an index -- document ids from a list of
        # lengths, a permutation -- that shapes are computed from: it holds values, and is moved to meta if it
        # is registered as a buffer; so does a small float one made from values, `2.0 ** torch.linspace(0, 8,
        # 16)` that the module checks (`assert freqs.isfinite().all()`); weights are made empty, zeros or random)
        return out
    host = dict(kwargs)
    host["device"] = "cpu"
    try:
        made = func(*args, **host)
    except Exception:  # noqa: BLE001 - a call the CPU refuses keeps its meta result
        return out
    rank_values.tag_factory_result(made, func, args, host)    # made from rank-dependent values
    return made


def is_device_mix(exc: BaseException) -> bool:
    text = str(exc)
    # (`param.data = host_tensor`: "`variable` and `tensor` have incompatible tensor type", naming no device)
    return "meta" in text and ("device" in text or "cpu" in text) or "have incompatible tensor type" in text


def to_meta_args(args, kwargs):
    """`args`/`kwargs` with every CPU tensor of more than one element on meta (a 0-d CPU tensor mixes
    with any device)."""
    import torch
    from torch.utils._pytree import tree_map

    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() > 0:
            with torch._C.DisableTorchFunction():
                return x.to("meta")
        return x
    return tree_map(move, args), tree_map(move, kwargs)


def on_meta(tensor, keep_scalar: bool = False):
    """A parameter or buffer registered with a host tensor, moved to meta (None: leave it). `keep_scalar`: a
    0-dim integer buffer keeps its value (``register_buffer("embed_dim", torch.tensor(dim))``, then a weight
    sized by it: a size is read from it as on the node)."""
    import torch
    import torch.nn as nn

    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or _is_fake(tensor):
        return None
    if keep_scalar and tensor.dim() == 0 and not (tensor.is_floating_point() or tensor.is_complex()):
        return None
    with torch._C.DisableTorchFunction():
        data = tensor.detach().to("meta")
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data


# --------------------------------------------------------------------------------------------
# collectives of a world of identical ranks
# --------------------------------------------------------------------------------------------
def _group_size(group, world: int) -> int:
    if group is None:
        return world
    try:
        import torch.distributed as dist

        return dist.get_world_size(group)
    except Exception:  # noqa: BLE001
        return world


def groups_of(group) -> Optional[List[int]]:
    """The global ranks of `group` in group-rank order (None: not a group the replay made)."""
    if group is None:
        return None
    try:
        from torch.distributed import distributed_c10d as c10d   # torch's own (``dist``'s is simulated)

        return [int(r) for r in c10d.get_process_group_ranks(group)]
    except Exception:  # noqa: BLE001
        return None


def _ranks(group, world: int) -> List[int]:
    return groups_of(group) or list(range(_group_size(group, world)))


def _reduce_values(values, op):
    """The reduction `op` of the ranks' `values` (tensors of one shape)."""
    import functools

    import torch

    name = str(getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]).upper()
    stacked = torch.stack([v.reshape(values[0].shape) for v in values])
    if name == "SUM":
        return stacked.sum(0).to(values[0].dtype)
    if name == "AVG":
        return stacked.to(torch.float64).mean(0).to(values[0].dtype)
    if name == "PRODUCT":
        return stacked.prod(0).to(values[0].dtype)
    if name == "MAX":
        return stacked.amax(0)
    if name == "MIN":
        return stacked.amin(0)
    fold = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}.get(name)
    return functools.reduce(fold, values) if fold is not None else values[0]


def _has_values(tensor) -> bool:
    import torch

    return isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and not _is_fake(tensor)


def _is_fake(tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(tensor, FakeTensor)


def _reduce_equal(tensor, op, n: int):
    """The reduction `op` of `n` ranks that each hold `tensor` (in place)."""
    import torch

    name = str(getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]).upper()
    with torch.no_grad():
        if tensor.dtype == torch.bool:
            return tensor       # SUM/MAX of flags is their OR, PRODUCT/MIN their AND: equal flags stay
        if name == "SUM":
            tensor.mul_(n)
        elif name == "PRODUCT":
            tensor.pow_(n)
        elif name == "BXOR" and n % 2 == 0:
            tensor.zero_()
        # MAX, MIN, AVG, BAND, BOR of equal values are the value
    return tensor


def install(rec, patch, dist) -> None:
    """The collectives of `dist` for rank 0 of `rec.world_size` identical ranks (see the module)."""
    import torch

    world = rec.world_size

    def work(async_op):
        if not async_op:
            return None

        class _Done:
            def wait(self, *a, **k):
                return True

            def is_completed(self):
                return True
        return _Done()

    def broadcast(tensor, src=None, group=None, async_op=False, **kwargs):
        values = rank_values.tensor_values(tensor, [src]) if src not in (None, 0) else None
        if values is not None:
            with torch.no_grad():
                tensor.copy_(values[0].reshape(tensor.shape))       # what rank `src` made
        elif src not in (None, 0) and _has_values(tensor):
            _note(rec, f"broadcast from rank {src} kept rank 0's values")
        return work(async_op)

    def _reduce(tensor, op, group) -> None:
        op = op if op is not None else dist.ReduceOp.SUM
        values = rank_values.tensor_values(tensor, _ranks(group, world))
        if values is None:
            _reduce_equal(tensor, op, _group_size(group, world))
            return
        with torch.no_grad():
            tensor.copy_(_reduce_values(values, op).reshape(tensor.shape))

    def all_reduce(tensor, op=None, group=None, async_op=False, **kwargs):
        if _has_values(tensor):
            _reduce(tensor, op, group)
        return work(async_op)

    def reduce(tensor, dst=None, op=None, group=None, async_op=False, **kwargs):
        if _has_values(tensor) and dst in (None, 0):
            _reduce(tensor, op, group)
        return work(async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False, **kwargs):
        if _has_values(tensor):
            values = rank_values.tensor_values(tensor, _ranks(group, world)[: len(tensor_list)])
            with torch.no_grad():
                for i, slot in enumerate(tensor_list):
                    if _has_values(slot):
                        slot.copy_(values[i].reshape(slot.shape) if values is not None else tensor)
            if values is None:
                _note_gather(rec, tensor)
        return work(async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, **kwargs):
        if _has_values(output_tensor) and _has_values(input_tensor):
            ranks = _ranks(group, world)
            values = rank_values.tensor_values(input_tensor, ranks)
            with torch.no_grad():
                flat = output_tensor.view(-1) if output_tensor.is_contiguous() else None
                if flat is not None and flat.numel() == len(ranks) * input_tensor.numel():
                    flat.copy_(torch.cat([v.reshape(-1) for v in values]) if values is not None
                               else input_tensor.reshape(-1).repeat(len(ranks)))
            if values is None:
                _note_gather(rec, input_tensor)
        return work(async_op)

    def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, **kwargs):
        # the replay is rank 0: as the destination it receives every rank's tensor, as a source it only sends
        if gather_list is not None and dst in (None, 0):
            all_gather(gather_list, tensor, group=group)
        return work(async_op)

    def all_gather_object(object_list, obj, group=None, **kwargs):
        ranks = _ranks(group, world)
        for i in range(len(object_list)):
            # rank i's own value where it is one the node knows (its rank, local rank, host name)
            object_list[i] = rank_values.value_at(obj, ranks[i]) if i < len(ranks) else obj
        return None

    def reduce_scatter_tensor(output, input, op=None, group=None, async_op=False, **kwargs):
        if _has_values(output) and _has_values(input):
            n = _group_size(group, world)
            with torch.no_grad():
                chunk = input.reshape(-1)[: output.numel()].reshape(output.shape)
                output.copy_(chunk)
                _reduce_equal(output, op if op is not None else dist.ReduceOp.SUM, n)
        return work(async_op)

    for name, fn in (("broadcast", broadcast), ("all_reduce", all_reduce), ("reduce", reduce),
                     ("all_gather", all_gather), ("all_gather_into_tensor", all_gather_into_tensor),
                     ("_all_gather_base", all_gather_into_tensor), ("all_gather_object", all_gather_object),
                     ("reduce_scatter_tensor", reduce_scatter_tensor), ("gather", gather)):
        if hasattr(dist, name):
            patch(dist, name, fn)


def _note_gather(rec, tensor) -> None:
    _note(rec, "all_gather filled every rank's slot with rank 0's value (a value each rank derives from its "
               "own rank, such as its local rank, would differ)")


def _note(rec, what: str) -> None:
    rec.__dict__["approximated_by_collective"] = True      # (replay.own_raises: no certain refusal after it)
    pos = rec.position()
    where = f"{os.path.basename(pos.path)}:{pos.line}" if pos.line else os.path.basename(pos.path)
    seen = rec.__dict__.setdefault("_host_value_lines", set())
    if (pos.path, pos.line) in seen:
        return
    seen.add((pos.path, pos.line))
    rec.__dict__.setdefault("framework_notes", []).append(f"{where}: {what}")
