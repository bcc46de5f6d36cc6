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
    torch_base: str = ""          # torch.nn layer/container the class is or derives from (blocks.torch_base)

    @property
    def depth(self) -> int:
        return 0 if not self.fqn else self.fqn.count(".") + 1


@dataclass
class ModuleTree:
    root_class: str
    modules: Dict[str, ModuleInfo]           # in `named_modules()` (pre-order) order
    params: Dict[str, ParamInfo]             # canonical FQN -> info, in `named_parameters()` order
    alias_to_canonical: Dict[str, str]       # every FQN (canonical too) -> canonical FQN
    # module -> modules holding it through a plain Python reference (a tuple, a non-Module holder
    # object such as a `TiedLinear`): their code may read its parameters outside its own forward
    held_outside: Dict[str, List[str]] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params.values())

    @property
    def trainable_numel(self) -> int:
        return sum(p.numel for p in self.params.values() if p.requires_grad)

    def canonical(self, fqn: str) -> str:
        return self.alias_to_canonical[fqn]

    def subtree(self, fqn: str) -> Iterator[ModuleInfo]:
        """The module and all its descendants, pre-order. `modules` is in pre-order, so they are
        the run of names that starts at `fqn` (found by an index: linear in the subtree's size)."""
        if fqn == "":
            yield from self.modules.values()
            return
        names, pos = self._module_index()
        start = pos.get(fqn)
        if start is None:
            return
        prefix = fqn + "."
        yield self.modules[fqn]
        for i in range(start + 1, len(names)):
            if not names[i].startswith(prefix):
                break
            yield self.modules[names[i]]

    def aliases_under(self, fqn: str) -> List[str]:
        """Every parameter FQN (tied aliases too) registered in `fqn`'s subtree, in
        ``named_parameters(remove_duplicate=False)`` order: also a contiguous run (pre-order)."""
        aliases, first = self._alias_index()
        if fqn == "":
            return list(aliases)
        start = first.get(fqn)
        if start is None:
            return []
        prefix = fqn + "."
        out = []
        for i in range(start, len(aliases)):
            if not aliases[i].startswith(prefix):
                break
            out.append(aliases[i])
        return out

    def params_under(self, fqn: str) -> List[str]:
        """Canonical FQNs of the parameters in `fqn`'s subtree, in its `named_parameters()` order
        (each shared tensor once, at its first occurrence inside the subtree)."""
        seen, out = set(), []
        for name in self.aliases_under(fqn):
            canonical = self.alias_to_canonical[name]
            if canonical not in seen:
                seen.add(canonical)
                out.append(canonical)
        return out

    def ancestors(self, fqn: str) -> Iterator[str]:
        """The strict ancestors of `fqn`, nearest first, the root ``""`` last."""
        cur = fqn
        while cur:
            info = self.modules.get(cur)
            cur = info.parent if info is not None and info.parent is not None else cur.rpartition(".")[0]
            yield cur

    def nearest_ancestor_in(self, fqn: str, candidates) -> Optional[str]:
        """The nearest strict ancestor of `fqn` that is in `candidates` (a set), or None: as
        ``any(is_ancestor(c, fqn) for c in candidates)`` but in the depth of `fqn`, not the number
        of candidates."""
        for a in self.ancestors(fqn):
            if a in candidates:
                return a
        return None

    # indexes built on first use (the tree does not change once built); not pickled
    def _module_index(self):
        idx = self.__dict__.get("_idx_modules")
        if idx is None or len(idx[0]) != len(self.modules):
            names = list(self.modules)
            idx = (names, {n: i for i, n in enumerate(names)})
            self.__dict__["_idx_modules"] = idx
        return idx

    def _alias_index(self):
        idx = self.__dict__.get("_idx_aliases")
        if idx is None or len(idx[0]) != len(self.alias_to_canonical):
            aliases = list(self.alias_to_canonical)
            first: Dict[str, int] = {}
            for i, name in enumerate(aliases):
                # the first alias under each module path: walk up until a path already has one
                owner = name.rpartition(".")[0]
                while owner not in first:
                    first[owner] = i
                    if not owner:
                        break
                    owner = owner.rpartition(".")[0]
            idx = (aliases, first)
            self.__dict__["_idx_aliases"] = idx
        return idx

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_idx_")}

    def is_ancestor(self, ancestor: str, fqn: str) -> bool:
        """True when `ancestor` is a strict ancestor of `fqn`."""
        if ancestor == fqn:
            return False
        return ancestor == "" or fqn.startswith(ancestor + ".")

    def subtree_numels(self) -> Dict[str, int]:
        """Elements of the parameters in each module's subtree (a shared tensor once per subtree)."""
        out: Dict[str, int] = {fqn: 0 for fqn in self.modules}
        # an untied parameter counts in its module and every ancestor: summed bottom-up in one
        # pass (reverse pre-order) instead of walking up from each parameter
        for canonical, info in self.params.items():
            if not info.aliases and canonical.rpartition(".")[0] in out:
                out[canonical.rpartition(".")[0]] += info.numel
        for fqn in reversed(list(self.modules)):
            parent = self.modules[fqn].parent
            if parent is not None and parent in out:
                out[parent] += out[fqn]
        for canonical, info in self.params.items():
            if not info.aliases and canonical.rpartition(".")[0] in out:
                continue
            holders = set()
            for alias in info.all_fqns:
                owner = alias.rpartition(".")[0]
                while True:
                    holders.add(owner)
                    if not owner:
                        break
                    owner = owner.rpartition(".")[0]
            for m in holders:
                if m in out:
                    out[m] += info.numel
        return out

    def instances_of(self, cls) -> List[str]:
        """FQNs of the outermost modules of class `cls` (a name, or several), pre-order; the root
        is excluded."""
        names = {cls} if isinstance(cls, str) else set(cls)
        out: List[str] = []
        for fqn, info in self.modules.items():
            # pre-order: a found instance's descendants follow it directly, so only the last one
            # found can be an ancestor (linear, not quadratic, on an 80-layer model)
            if fqn and info.cls in names and not (out and self.is_ancestor(out[-1], fqn)):
                out.append(fqn)
        return out

    def expr(self, fqn: str, root: str = "model") -> str:
        """How user code names module `fqn`: ``layers.0.attn`` -> ``model.layers[0].attn``
        (``model.layers["0"]`` inside a ``ModuleDict``)."""
        out, cur = root, ""
        for part in fqn.split(".") if fqn else []:
            parent = self.modules.get(cur)
            in_dict = parent is not None and "ModuleDict" in parent.mro
            if in_dict or not (part.isidentifier() or part.isdigit()):
                out += f"[{part!r}]"
            elif part.isdigit():
                out += f"[{part}]"
            else:
                out += f".{part}"
            cur = f"{cur}.{part}" if cur else part
        return out

    def repeated_block_class(self) -> Optional[str]:
        """The block the model repeats (the heaviest stack's, see `repeated_blocks`), or None."""
        blocks = self.repeated_blocks()
        return blocks[0] if blocks else None

    def repeated_blocks(self) -> List[str]:
        """The block classes a per-block plan wraps, found structurally (`fsdp_lint.model.blocks`): the
        repeated children of the container that holds most parameters (never a leaf layer such as
        a `class Linear(nn.Linear)`), plus the blocks of other stacks as heavy as a block (both
        towers of a vision-language model). Heaviest first; empty when nothing repeats."""
        found = self.__dict__.get("_repeated_blocks")
        if found is None:
            from fsdp_lint.model.blocks import find_repeated_blocks

            found = self.__dict__["_repeated_blocks"] = find_repeated_blocks(self)
        return list(found)

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


def user_class(module) -> type:
    """The module's class as the user wrote it: FSDP2 (and fsdp-lint's recorder) swap the class for a
    `FSDP<Name>(FSDPModule, <Name>)` subclass."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2 and cls.__bases__[0].__name__ == "FSDPModule":
        cls = cls.__bases__[1]
    return cls


def build_module_tree(model, state: Optional[Dict[int, Tuple[bool, object]]] = None) -> ModuleTree:
    """Read a (meta-device) ``nn.Module`` into a ModuleTree.

    `state` maps ``id(param)`` to the (requires_grad, dtype) the parameter had when it was wrapped,
    which is what FSDP saw; later changes by the file do not count."""
    state = state or {}
    import torch.nn as nn

    from fsdp_lint.model.blocks import torch_base

    modules: Dict[str, ModuleInfo] = {}
    per_class: Dict[type, tuple] = {}     # what depends on the class only, once per class (10,000 experts)
    for fqn, mod in model.named_modules():
        known = per_class.get(type(mod))
        if known is None:
            cls = user_class(mod)
            forward = getattr(cls, "forward", None)
            known = per_class[type(mod)] = (
                cls.__name__, f"{cls.__module__}.{cls.__qualname__}",
                forward is not None and forward is not nn.Module.forward,
                [k.__name__ for k in cls.__mro__], torch_base(cls))
        name, qualname, has_forward, mro, base = known
        modules[fqn] = ModuleInfo(
            fqn=fqn,
            cls=name,
            cls_qualname=qualname,
            parent=None if fqn == "" else fqn.rpartition(".")[0],
            children=[],
            direct_params=[],
            has_forward=has_forward,
            mro=mro,
            torch_base=base,
        )
    for fqn, info in modules.items():
        if info.parent is not None and info.parent in modules:
            modules[info.parent].children.append(fqn)

    params: Dict[str, ParamInfo] = {}
    by_id: Dict[int, str] = {}
    alias_to_canonical: Dict[str, str] = {}
    # (torch's walk: a model that overrides `named_parameters` -- an adapter wrapper listing its adapters only,
    # without torch's keywords -- still holds every parameter its modules register)
    for fqn, p in nn.Module.named_parameters(model, remove_duplicate=False):
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
    return ModuleTree(root_class=root_cls, modules=modules, params=params, alias_to_canonical=alias_to_canonical,
                      held_outside=_held_outside(model, nn.Module))


def _held_outside(model, module_cls) -> Dict[str, List[str]]:
    """Modules referenced from another module's plain attributes: a tuple or list of modules, or a
    non-Module object whose own attributes hold a module (one level: what a holder class does)."""
    name_of = {}
    for fqn, mod in model.named_modules():
        name_of.setdefault(id(mod), fqn)
    out: Dict[str, List[str]] = {}
    for fqn, mod in model.named_modules():
        for key, value in vars(mod).items():
            if key in ("_modules", "_parameters", "_buffers"):
                continue
            if isinstance(value, (tuple, list)):
                held = value[:16]
            elif not isinstance(value, (module_cls, dict, str, bytes, int, float, type)) \
                    and hasattr(value, "__dict__"):
                try:
                    held = list(vars(value).values())[:16]
                except TypeError:
                    continue
            else:
                continue
            for h in held:
                target = name_of.get(id(h)) if isinstance(h, module_cls) else None
                if target is not None and target != fqn and fqn not in out.get(target, []):
                    out.setdefault(target, []).append(fqn)
    return out


# --------------------------------------------------------------------------------------------
# parameter groups inside a unit (for messages and fix suggestions of the FSD2xx rules)
# --------------------------------------------------------------------------------------------
def _rel(fqn: str, within: str) -> str:
    return fqn[len(within) + 1:] if within and fqn.startswith(within + ".") else fqn


def _glob_indices(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _matches_any(pattern: str, names) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(n, pattern + ".*") for n in names)


def param_patterns(tree: ModuleTree, fqns: List[str], *, within: str = "", others=()) -> List[str]:
    """Short patterns (relative to module `within`) that name exactly the parameters `fqns` and none
    of `others`: whole sub-modules (``ln_f.*``), shared leaf names (``*.lora_A.weight``), with
    numeric indices collapsed (``layers.*.norm.*``) where that stays exact."""
    group = [_rel(f, within) for f in fqns]
    rest = [_rel(f, within) for f in others]
    if not group:
        return []
    # 1. whole sub-modules: maximal module paths whose parameters are all in the group
    by_module: List[str] = []
    for name in group:
        parts = name.split(".")
        best = name
        for k in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:k])
            if any(r == prefix or r.startswith(prefix + ".") for r in rest):
                break
            best = prefix + ".*"
        if best not in by_module:
            by_module.append(best)
    # 2. shared leaf names: the shortest suffix no other parameter ends with
    by_suffix: List[str] = []
    for name in group:
        parts = name.split(".")
        pat = name
        for k in range(1, len(parts)):
            suffix = ".".join(parts[-k:])
            if not any(r == suffix or r.endswith("." + suffix) for r in rest):
                pat = "*." + suffix
                break
        if pat not in by_suffix:
            by_suffix.append(pat)

    def collapse(patterns: List[str]) -> List[str]:
        out: List[str] = []
        for p in patterns:
            g = _glob_indices(p)
            q = g if g != p and not _matches_any(g, rest) else p
            if q not in out:
                out.append(q)
        return out

    a, b = collapse(by_module), collapse(by_suffix)
    return a if len(a) <= len(b) else b


def describe_params(tree: ModuleTree, fqns: List[str], *, within: str = "", others=(), limit: int = 4) -> str:
    """``"tok.*, ln_f.* (3 params, 49.2K elements)"``: a parameter group for a message."""
    pats = param_patterns(tree, fqns, within=within, others=others)
    shown = ", ".join(pats[:limit]) + (f" and {len(pats) - limit} more" if len(pats) > limit else "")
    numel = sum(tree.params[f].numel for f in fqns)
    n = len(fqns)
    return f"{shown} ({n} param{'s' if n != 1 else ''}, {numel:,} elements)"


def uniform_cover(tree: ModuleTree, unit_module: str, params: List[str], key) -> Dict[object, Optional[List[str]]]:
    """For each value of ``key(ParamInfo)`` among a unit's `params`: the outermost sub-modules of
    `unit_module` whose unit-owned parameters all have that value (wrapping them as their own units
    leaves the unit without it), or None when some parameter with that value sits directly on a
    module that also holds parameters with another value (no wrapping can separate them)."""
    owned = set(params)
    values = {f: key(tree.params[f]) for f in params}
    under: Dict[str, List[str]] = {}
    for fqn in tree.modules:
        if fqn == unit_module or not (unit_module == "" or fqn.startswith(unit_module + ".")):
            continue
        mine = [p for p in tree.params_under(fqn) if p in owned]
        if mine:
            under[fqn] = mine
    out: Dict[object, Optional[List[str]]] = {}
    for value in dict.fromkeys(values.values()):
        pure = {m for m, ps in under.items() if all(values[p] == value for p in ps)}
        tops = [m for m in pure if not any(tree.is_ancestor(o, m) for o in pure)]
        covered = {p for m in tops for p in under[m]}
        wanted = {p for p, v in values.items() if v == value}
        out[value] = [m for m in tree.modules if m in tops] if covered >= wanted else None
    return out
