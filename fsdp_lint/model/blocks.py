"""The model's repeated block: what a per-block FSDP plan wraps, read from the tree's structure.

Models keep their layers as the children of a container (``nn.ModuleList``, ``nn.ModuleDict``,
``nn.Sequential``: ``model.layers``, ``transformer.h``, ``encoder.layer``). The block is the class
of the repeated children of the container that holds the most parameters; a class is not a block
because it is repeated most often (a ``Linear`` used everywhere) or covers most parameters.

* **Leaves are never blocks.** A module is a leaf layer when its class is or derives from one of
  torch's leaf layers (``class Linear(nn.Linear)``, norms, embeddings, convolutions, RNNs; its
  MRO decides, even when it adds children such as LoRA adapters), or when no child of it holds
  parameters (GPT-2's ``Conv1D``, nanoGPT's ``LayerNorm``, an ``RMSNorm``). Only a model made of
  bare layers (``nn.Sequential(nn.Linear, ...)``) has a leaf as its block, and then the layer
  must hold half of the model.
* **Stacks of blocks are not blocks.** Encoder and decoder held as two attributes of one class
  (T5's ``T5Stack``), and stages that differ from each other (every ConvNeXt/Swin/ResNet stage has
  its own width and depth) and keep most of their parameters in containers of blocks, are
  descended into once: their blocks are the blocks. Identical repeated children (a transformer's
  layers, an MoE block whose experts hold most of its parameters) are the blocks themselves.
* **Several stacks.** After the heaviest stack, every other stack (not inside a block, not a
  stack of blocks already found) whose repeated children hold at least as much as the largest
  block found adds its classes: both towers of a vision-language model, the encoder and the
  decoder layers of Whisper. A smaller stack (a two-layer projector) stays with the root.

Everything here is linear in the number of modules and parameters (10,000 units are common in
per-expert MoE plans).
"""
from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

# the trees searched here are `fsdp_lint.model.tree.ModuleTree`s; this module reads them and never
# imports that one (the tree asks this module for its blocks: the dependency goes one way)
ModuleTree = Any

CONTAINER_PREFIX = "torch.nn.modules.container."
# torch's leaf layers: the files of `torch.nn.modules` whose layers hold only their own parameters
_LEAF_PREFIXES = tuple(f"torch.nn.modules.{m}." for m in (
    "linear", "conv", "batchnorm", "instancenorm", "normalization", "sparse", "rnn"))
_LEAF_CLASSES = ("torch.nn.modules.activation.PReLU",)


def torch_base(cls) -> str:
    """Qualified name of the first torch.nn layer or container in `cls`'s MRO (``""``: none
    besides ``nn.Module``): ``class Linear(nn.Linear)`` -> ``torch.nn.modules.linear.Linear``."""
    for k in cls.__mro__:
        mod = getattr(k, "__module__", "") or ""
        if mod.startswith("torch.nn.modules.") and mod != "torch.nn.modules.module":
            return f"{mod}.{k.__qualname__}"
    return ""


def is_container(info) -> bool:
    """A torch container (or a subclass): ``ModuleList``, ``ModuleDict``, ``Sequential``."""
    return (info.torch_base or info.cls_qualname).startswith(CONTAINER_PREFIX)


def is_torch_leaf(info) -> bool:
    """The module's class is or derives from one of torch's leaf layers."""
    base = info.torch_base
    return bool(base) and (base.startswith(_LEAF_PREFIXES) or base in _LEAF_CLASSES)


class _Finder:
    def __init__(self, tree: "ModuleTree"):
        self.tree = tree
        self.mods = tree.modules
        self.sizes = tree.subtree_numels()

    # ---------------------------------------------------------------------------- kinds
    def unit_like(self, fqn: str) -> bool:
        info = self.mods[fqn]
        return bool(fqn) and info.has_forward and self.sizes.get(fqn, 0) > 0 and not is_container(info)

    def leaf(self, fqn: str) -> bool:
        info = self.mods[fqn]
        return is_torch_leaf(info) or not any(self.sizes.get(c, 0) for c in info.children)

    # ---------------------------------------------------------------------------- stacks
    def members(self, parent: str) -> List[str]:
        """The children of `parent`; a container's children that are containers without a
        `forward` are looked through (``layers = ModuleList([ModuleList([Attention,
        FeedForward]), ...])``, lucidrains-style)."""
        out: List[str] = []
        for child in self.mods[parent].children:
            info = self.mods[child]
            if is_container(self.mods[parent]) and is_container(info) and not info.has_forward:
                out += self.members(child)
            else:
                out.append(child)
        return out

    def stacks(self, leaves: bool) -> List[Tuple[int, str, Dict[str, List[str]]]]:
        """(weight, parent, {class: repeated members}) for every module with two or more
        members of one class (non-leaf ones, or leaf ones when `leaves`), heaviest first."""
        order = {f: i for i, f in enumerate(self.mods)}
        out = []
        for parent in self.mods:
            by_cls: Dict[str, List[str]] = {}
            for child in self.members(parent):
                if self.unit_like(child) and self.leaf(child) == leaves:
                    by_cls.setdefault(self.mods[child].cls, []).append(child)
            repeated = {c: kids for c, kids in by_cls.items() if len(kids) >= 2}
            if repeated:
                weight = sum(self.sizes[k] for kids in repeated.values() for k in kids)
                out.append((weight, parent, repeated))
        out.sort(key=lambda s: (-s[0], order[s[1]]))
        return out

    def inner_blocks(self, outer: List[str]) -> Dict[str, List[str]]:
        """For each of the `outer` modules: the outermost non-leaf modules under it that are
        children of a container (its blocks, if it is a stack of blocks)."""
        owners = set(outer)
        found: Dict[str, List[str]] = {o: [] for o in outer}
        taken: Set[str] = set()
        for fqn, info in self.mods.items():
            parent = info.parent
            if not parent or not self.unit_like(fqn) or self.leaf(fqn) or not is_container(self.mods[parent]):
                continue
            up = parent
            while up and up not in owners and up not in taken:
                up = self.mods[up].parent or ""
            if up in owners:
                found[up].append(fqn)
                taken.add(fqn)
        return found

    def descend(self, parent: str, kids: List[str]) -> List[str]:
        """The block classes of a stack: its repeated children's classes, or, for a stack of
        blocks, the classes of their blocks (one level)."""
        own = sorted({self.mods[k].cls for k in kids}, key=lambda c: -sum(self.sizes[k] for k in kids
                                                                          if self.mods[k].cls == c))
        # stacks of blocks: attributes of one class (encoder/decoder), or stages that all differ
        attributes = not is_container(self.mods[parent])
        if not attributes and len({self.sizes[k] for k in kids}) < len(kids):
            return own
        inner = self.inner_blocks(kids)
        if not all(inner[k] and 2 * sum(self.sizes[b] for b in inner[k]) >= self.sizes[k] for k in kids):
            return own
        weight: Dict[str, int] = {}
        for k in kids:
            for b in inner[k]:
                weight[self.mods[b].cls] = weight.get(self.mods[b].cls, 0) + self.sizes[b]
        return sorted(weight, key=lambda c: -weight[c])

    # ---------------------------------------------------------------------------- the blocks
    def find(self) -> List[str]:
        if not self.tree.numel:
            return []
        stacks = self.stacks(leaves=False)
        if not stacks:
            return self.bare_layer()
        classes: List[str] = []
        instances: Set[str] = set()
        ancestors: Set[str] = set()
        largest = 0
        for weight, parent, repeated in stacks:
            kids = [k for ks in repeated.values() for k in ks]
            if classes:
                if any(k in ancestors for k in kids) or self.inside(parent, instances):
                    continue  # a stack of blocks already found, or inside a block (MoE experts)
                if weight < largest:
                    break     # stacks are heaviest first: the rest stay with the root
            new = [c for c in self.descend(parent, kids) if c not in classes]
            if not new:
                continue
            classes += new
            instances = set(self.tree.instances_of(classes))
            largest = max(self.sizes[i] for i in instances)
            ancestors = set(instances)
            for i in instances:
                up = self.mods[i].parent
                while up and up not in ancestors:
                    ancestors.add(up)
                    up = self.mods[up].parent
        return classes

    def inside(self, fqn: str, instances: Set[str]) -> bool:
        while fqn:
            if fqn in instances:
                return True
            fqn = self.mods[fqn].parent or ""
        return False

    def bare_layer(self) -> List[str]:
        """A model of bare layers: the heaviest repeated layer class, if it holds half the model."""
        for weight, parent, repeated in self.stacks(leaves=True):
            cls = max(repeated, key=lambda c: sum(self.sizes[k] for k in repeated[c]))
            cover = sum(self.sizes[f] for f in self.tree.instances_of(cls))
            return [cls] if 2 * cover >= self.tree.numel else []
        return []


def find_repeated_blocks(tree: "ModuleTree") -> List[str]:
    """The block classes of `tree`, the heaviest stack's first (empty: no repeated block)."""
    return _Finder(tree).find()
