"""Values that differ from rank to rank on the simulated node, carried with what every rank holds.

The replay runs rank 0. A collective that gathers a value each rank derives from its own place in the
job -- ``all_gather(slots, torch.tensor([dist.get_rank()]))``, ``all_gather_object(hosts,
socket.gethostname())``, ``all_reduce(torch.tensor([local_rank]), MAX)`` -- must give rank i's value in
rank i's slot, or the code that builds node-local groups from the result puts every rank on one node.

So the node's own answers are tagged with the value of every rank (``at(r)``, `r` a global rank), where
the code asking for them exchanges values with the other ranks (its function calls a collective:
`exchanges`; elsewhere they are plain, since configs that store them -- OmegaConf, PyYAML -- take exact
types only):

* ``dist.get_rank()`` is `r` (of a group: `r`'s index among the group's ranks, -1 outside it);
* ``dist.get_node_local_rank()`` / ``dist.get_local_rank()``: ``r % gpus_per_node``;
* ``socket.gethostname()`` / ``platform.node()``: node ``r // gpus_per_node``'s host name -- this
  machine's own for node 0, ``<host>-node<k>`` for node k (the node has as many GPUs as
  ``LOCAL_WORLD_SIZE``, the profile's or ``--gpus-per-node``).

A tagged int (`RankInt`) is an ``int`` everywhere; ``+ - * // %`` with plain ints keep the tag
(``rank // local_world_size`` is the node index on every rank). A tagged str (`RankStr`) keeps it through
``strip``/``lower``/``upper``/``split``/slices. A small host tensor made by a factory call from tagged
values (``torch.tensor([rank, local_rank])``) is made again with rank i's values for rank i's slot.
Anything else (a value read with ``int(os.environ["LOCAL_RANK"])``, whose ``int()`` Python turns into a
plain int) is rank 0's in every slot, as before, with the note the collective gives.
"""
from __future__ import annotations

import operator
import os
import sys
from typing import Any, Callable, List, Optional

_ATTR = "_fsdp_lint_at_rank"          # on a host tensor: r -> the tensor rank r would hold


class RankInt(int):
    """Rank 0's value; ``at(r)``: rank r's."""

    def __new__(cls, value: int, at: Callable[[int], Any]):
        obj = int.__new__(cls, value)
        obj.at = at
        return obj

    def __reduce__(self):           # pickles, copies and JSON as the plain int it is on rank 0
        return (int, (int(self),))


def _binary(name: str, reflected: bool = False):
    op = getattr(operator, name)
    base = getattr(int, f"__{'r' if reflected else ''}{name}__")

    def method(self, other):
        out = base(self, other)
        if type(out) is not int or not isinstance(other, int) or isinstance(other, bool):
            return out
        if reflected:
            return RankInt(out, lambda r: op(value_at(other, r), self.at(r)))
        return RankInt(out, lambda r: op(self.at(r), value_at(other, r)))
    return method


for _name in ("add", "sub", "mul", "floordiv", "mod"):
    setattr(RankInt, f"__{_name}__", _binary(_name))
    setattr(RankInt, f"__r{_name}__", _binary(_name, reflected=True))
RankInt.__neg__ = lambda self: RankInt(-int(self), lambda r: -self.at(r))


class RankStr(str):
    """Rank 0's string; ``at(r)``: rank r's."""

    def __new__(cls, value: str, at: Callable[[int], Any]):
        obj = str.__new__(cls, value)
        obj.at = at
        return obj

    def __reduce__(self):
        return (str, (str(self),))

    def __getitem__(self, key):
        return RankStr(str.__getitem__(self, key), lambda r: str(self.at(r))[key])

    def split(self, *args, **kwargs):
        parts = str.split(self, *args, **kwargs)
        return [RankStr(p, (lambda i: lambda r: _part(self.at(r), i, args, kwargs))(i)) for i, p in enumerate(parts)]


def _part(value, i, args, kwargs):
    parts = str(value).split(*args, **kwargs)
    return parts[i] if i < len(parts) else ""


def _str_method(name):
    base = getattr(str, name)

    def method(self, *args, **kwargs):
        return RankStr(base(self, *args, **kwargs), lambda r: base(str(self.at(r)), *args, **kwargs))
    return method


for _name in ("strip", "lstrip", "rstrip", "lower", "upper", "casefold"):
    setattr(RankStr, _name, _str_method(_name))


def value_at(obj, rank: int):
    """What `obj` (rank 0's) is on `rank`: tagged leaves and tensors made again, containers rebuilt."""
    if isinstance(obj, (RankInt, RankStr)):
        return obj.at(rank)
    at = _tensor_at(obj)
    if at is not None:
        return at(rank)
    if isinstance(obj, (list, tuple)) and has_rank_values(obj):
        items = [value_at(x, rank) for x in obj]
        return type(obj)(items) if type(obj) in (list, tuple) else items
    if isinstance(obj, dict) and has_rank_values(obj):
        return {k: value_at(v, rank) for k, v in obj.items()}
    return obj


def has_rank_values(obj, depth: int = 0) -> bool:
    if isinstance(obj, (RankInt, RankStr)) or _tensor_at(obj) is not None:
        return True
    if depth > 4:
        return False
    if isinstance(obj, (list, tuple)):
        return any(has_rank_values(x, depth + 1) for x in obj[:4096])
    if isinstance(obj, dict):
        return any(has_rank_values(v, depth + 1) for v in list(obj.values())[:4096])
    return False


def _tensor_at(obj) -> Optional[Callable[[int], Any]]:
    try:
        return obj.__dict__.get(_ATTR) if hasattr(obj, "__dict__") and hasattr(obj, "is_meta") else None
    except Exception:  # noqa: BLE001
        return None


def tag_factory_result(out, func, args, kwargs) -> None:
    """`out` (a host tensor made by ``func(*args, **kwargs)``) from tagged values: remember how rank r
    makes it."""
    if not (has_rank_values(args) or has_rank_values(kwargs)):
        return
    import torch

    def at(rank):
        with torch._C.DisableTorchFunction():
            return func(*value_at(list(args), rank), **{k: value_at(v, rank) for k, v in kwargs.items()})
    try:
        out.__dict__[_ATTR] = at
    except Exception:  # noqa: BLE001
        pass


def set_item(func, args, kwargs):
    """``t[key] = value`` (``Tensor.__setitem__``, `func`) on a host tensor where `key` or `value` is
    tagged -- ``is_in_the_same_node[rank] = 1`` before an ``all_reduce``: rank r's tensor has rank r's
    key set to rank r's value (on top of what rank r held before). Any other assignment runs as it is."""
    tensor = args[0] if args else None
    if len(args) < 3 or getattr(tensor, "is_meta", True) or not (has_rank_values(args[1]) or has_rank_values(args[2])):
        return func(*args, **kwargs)
    import torch

    prior = _tensor_at(tensor)
    with torch._C.DisableTorchFunction():
        before = tensor.clone() if prior is None else None
    out = func(*args, **kwargs)
    key, value = args[1], args[2]

    def at(rank):
        with torch._C.DisableTorchFunction():
            held = prior(rank).clone() if prior is not None else before.clone()
            held[value_at(key, rank)] = value_at(value, rank)
            return held
    try:
        tensor.__dict__[_ATTR] = at
    except Exception:  # noqa: BLE001
        pass
    return out


def tensor_values(tensor, ranks: List[int]):
    """Each of `ranks`' value of the tagged `tensor`, or None (not tagged)."""
    at = _tensor_at(tensor)
    if at is None:
        return None
    try:
        return [at(r) for r in ranks]
    except Exception:  # noqa: BLE001 - a factory call rank r's values make fail: rank 0's everywhere
        return None


# --------------------------------------------------------------------------------------------
# the node's answers
# --------------------------------------------------------------------------------------------
# what code that exchanges values with the other ranks calls (names in its code object)
_COLLECTIVES = frozenset({"all_gather", "all_gather_object", "all_gather_into_tensor", "_all_gather_base",
                          "gather_object", "gather", "all_reduce", "reduce", "broadcast", "broadcast_object_list"})


def exchanges(frame) -> bool:
    """Whether the code that asks for its rank (or host) exchanges values with the other ranks: its own
    function (or module) calls a collective. Only there the answer carries every rank's value; elsewhere
    it is the plain int / str (a config stores it: OmegaConf and PyYAML take exact types only)."""
    return frame is not None and bool(_COLLECTIVES.intersection(frame.f_code.co_names))


def gpus_per_node(rec) -> int:
    ws = rec.world_size
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ws))
    except ValueError:
        local = ws
    return max(1, min(getattr(rec, "gpus_per_node", None) or local, ws))


def host_name(base: str, node: int) -> str:
    return base if node == 0 else f"{base}-node{node}"


def install(rec, patch, dist, groups_of: Callable[[Any], Optional[List[int]]]) -> None:
    """Tag the rank, local rank and host name the simulated rank 0 answers (see the module)."""
    import platform
    import socket

    real_hostname = socket.gethostname
    base = real_hostname()

    answer = dist.get_rank          # the sandbox's: rank 0, of the world or of a group

    def get_rank(group=None, *args, **kwargs):
        mine = answer(group, *args, **kwargs)
        if not exchanges(sys._getframe(1)):
            return mine
        if group is None:
            return RankInt(0, lambda r: r)
        ranks = groups_of(group)
        if ranks is None or not isinstance(mine, int):
            return mine
        return RankInt(mine, lambda r: ranks.index(r) if r in ranks else -1)

    def local_rank(*args, **kwargs):
        if not exchanges(sys._getframe(1)):
            return 0
        return RankInt(0, lambda r: r % gpus_per_node(rec))

    def hostname():
        if not exchanges(sys._getframe(1)):
            return base
        return RankStr(base, lambda r: host_name(base, r // gpus_per_node(rec)))

    patch(dist, "get_rank", get_rank)
    for name in ("get_node_local_rank", "get_local_rank"):
        if hasattr(dist, name):
            patch(dist, name, local_rank)
    patch(socket, "gethostname", hostname)
    patch(platform, "node", hostname)

