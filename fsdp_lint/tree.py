"""`tree`: the model's module and parameter tree, read from a model built on the meta device.

The tree is plain data: later stages (plan, layout, rules) never touch the ``nn.Module``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple


@dataclass
class ParamInfo:
    fqn: str                      # canonical FQN: the first name `named_parameters()` gives it
    shape: Tuple[int, ...]
    dtype: str                    # "float32", "bfloat16", "int64", ...
    requires_grad: bool
    numel: int
    is_floating: bool
    aliases: List[str] = field(default_factory=list)  # other FQNs of the same tensor (tied weights)

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def module(self) -> str:
        return self.fqn.rpartition(".")[0]

    @property
    def all_fqns(self) -> List[str]:
        return [self.fqn, *self.aliases]


@dataclass
class ModuleInfo:
    fqn: str                      # "" for the root
    cls: str                      # class name, e.g. "TransformerBlock"
    cls_qualname: str             # "package.module.TransformerBlock"
    parent: Optional[str]
    children: List[str]
    direct_params: List[str]      # FQNs (as registered on this module, aliases included)
    has_forward: bool             # False for ModuleList/ModuleDict and other pure containers
    mro: List[str] = field(default_factory=list)  # class names of the MRO, for isinstance-style checks

    @property
    def depth(self) -> int:
        return 0 if not self.fqn else self.fqn.count(".") + 1


@dataclass
class ModuleTree:
    root_class: str
    modules: Dict[str, ModuleInfo]           # in `named_modules()` (pre-order) order
    params: Dict[str, ParamInfo]             # canonical FQN -> info, in `named_parameters()` order
    alias_to_canonical: Dict[str, str]       # every FQN (canonical too) -> canonical FQN

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params.values())

    @property
    def trainable_numel(self) -> int:
        return sum(p.numel for p in self.params.values() if p.requires_grad)

    def canonical(self, fqn: str) -> str:
        return self.alias_to_canonical[fqn]

    def subtree(self, fqn: str) -> Iterator[ModuleInfo]:
        """The module and all its descendants, pre-order."""
        prefix = fqn + "."
        for name, info in self.modules.items():
            if fqn == "" or name == fqn or name.startswith(prefix):
                yield info

    def params_under(self, fqn: str) -> List[str]:
        """Canonical FQNs of the parameters in `fqn`'s subtree, in its `named_parameters()` order
        (each shared tensor once, at its first occurrence inside the subtree)."""
        prefix = fqn + "." if fqn else ""
        seen, out = set(), []
        for name, canonical in self.alias_to_canonical.items():
            if fqn == "" or name.startswith(prefix):
                if canonical not in seen:
                    seen.add(canonical)
                    out.append(canonical)
        return out

    def is_ancestor(self, ancestor: str, fqn: str) -> bool:
        """True when `ancestor` is a strict ancestor of `fqn`."""
        if ancestor == fqn:
            return False
        return ancestor == "" or fqn.startswith(ancestor + ".")

    def repeated_block_class(self) -> Optional[str]:
        """The class that the model repeats (two or more instances) holding the most parameters:
        what a transformer's per-block plan wraps."""
        totals: Dict[str, int] = {}
        counts: Dict[str, int] = {}
        for info in self.modules.values():
            if not info.fqn or not info.has_forward:
                continue
            n = sum(self.params[p].numel for p in self.params_under(info.fqn))
            if n == 0:
                continue
            counts[info.cls] = counts.get(info.cls, 0) + 1
            totals[info.cls] = totals.get(info.cls, 0) + n
        candidates = [c for c, k in counts.items() if k >= 2]
        if not candidates:
            return None
        best = max(candidates, key=lambda c: totals[c])
        # a block must hold a real share of the model; skip e.g. a repeated LayerNorm
        if totals[best] * 2 < self.numel:
            return None
        return best

    def to_json(self) -> dict:
        return {"class": self.root_class, "numel": self.numel, "trainable_numel": self.trainable_numel}


_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


def dtype_itemsize(dtype: str) -> int:
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        import torch

        return getattr(torch, dtype).itemsize


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def build_module_tree(model, state: Optional[Dict[int, Tuple[bool, object]]] = None) -> ModuleTree:
    """Read a (meta-device) ``nn.Module`` into a ModuleTree.

    `state` maps ``id(param)`` to the (requires_grad, dtype) the parameter had when it was wrapped,
    which is what FSDP saw; later changes by the file do not count."""
    state = state or {}
    import torch.nn as nn

    modules: Dict[str, ModuleInfo] = {}
    for fqn, mod in model.named_modules():
        cls = type(mod)
        # FSDP2 swaps the class for a `FSDP<Name>(FSDPModule, <Name>)` subclass: report the user's
        if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2 and cls.__bases__[0].__name__ == "FSDPModule":
            cls = cls.__bases__[1]
        forward = getattr(cls, "forward", None)
        has_forward = forward is not None and forward is not nn.Module.forward
        modules[fqn] = ModuleInfo(
            fqn=fqn,
            cls=cls.__name__,
            cls_qualname=f"{cls.__module__}.{cls.__qualname__}",
            parent=None if fqn == "" else fqn.rpartition(".")[0],
            children=[],
            direct_params=[],
            has_forward=has_forward,
            mro=[k.__name__ for k in cls.__mro__],
        )
    for fqn, info in modules.items():
        if info.parent is not None and info.parent in modules:
            modules[info.parent].children.append(fqn)

    params: Dict[str, ParamInfo] = {}
    by_id: Dict[int, str] = {}
    alias_to_canonical: Dict[str, str] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        owner = fqn.rpartition(".")[0]
        if owner in modules:
            modules[owner].direct_params.append(fqn)
        key = id(p)
        if key in by_id:
            canonical = by_id[key]
            params[canonical].aliases.append(fqn)
        else:
            canonical = fqn
            by_id[key] = fqn
            requires_grad, dtype = state.get(key, (p.requires_grad, p.dtype))
            params[fqn] = ParamInfo(
                fqn=fqn,
                shape=tuple(int(d) for d in p.shape),
                dtype=dtype_name(dtype),
                requires_grad=bool(requires_grad),
                numel=int(p.numel()),
                is_floating=bool(p.is_floating_point() or p.is_complex()),
            )
        alias_to_canonical[fqn] = canonical
    root_cls = modules[""].cls if "" in modules else type(model).__name__
    return ModuleTree(root_class=root_cls, modules=modules, params=params, alias_to_canonical=alias_to_canonical)
