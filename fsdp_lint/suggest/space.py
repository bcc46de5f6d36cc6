"""The plans a user can write instead of the file's: one `Choice` per axis, and the plan it makes.

Axes (each only where the plan's API and front-end can express it, see ``changes.expressible``):

* granularity: the file's units; one unit per repeated block (when the file's plan is not that);
  blocks plus the embeddings and the output head as units of their own (modules outside the blocks
  holding parameters: ``Embedding``/``Linear`` layers not tied to another unit); per expert in a
  mixture-of-experts block (each expert of a ``ModuleList`` of same-class experts, or a grouped
  ``*Experts`` module, a unit);
* activation checkpointing of the blocks: none, selective (every second block, torchtitan's
  ``selective`` layer mode with ``ac_freq=2``), full (every block);
* mixed precision: bf16 parameters with bf16 or float32 gradient reduction (float32 parameters only);
* ``reshard_after_forward`` (FSDP2): the root resharded too, the last block kept gathered (it is
  the first one backward needs), every block kept gathered (ZeRO-2), or resharded to groups of the
  GPUs of a node (an int); FSDP1: ``SHARD_GRAD_OP``;
* HSDP: shards within a node (``gpus-per-node``) and replicas across nodes;
* CPU offload of parameters, gradients and optimizer state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from fsdp_lint.plan.alternatives import alternative_plan
from fsdp_lint.plan.build import WrapPlan

Unit = Union[str, Tuple[str, ...]]      # a granularity entry: a module, or modules sharded as one group
GRANULARITIES = ("file", "blocks", "blocks+embeddings", "experts")
AC_MODES = ("file", "none", "selective", "full")
PRECISIONS = ("file", "bf16", "bf16-fp32-reduce")
RESHARDS = ("file", "root", "last-block", "none", "node")


@dataclass(frozen=True)
class Choice:
    granularity: str = "file"
    ac: str = "file"
    precision: str = "file"
    reshard: str = "file"
    hsdp: bool = False
    offload: bool = False

    @property
    def kinds(self) -> List[str]:
        """What it changes, as JSON names it (empty: the file's plan)."""
        out = []
        if self.granularity != "file":
            out.append({"blocks": "wrap-blocks", "blocks+embeddings": "wrap-embeddings-head",
                        "experts": "wrap-experts"}[self.granularity])
        if self.ac != "file":
            out.append(f"ac-{self.ac}")
        if self.precision != "file":
            out.append(self.precision)
        if self.reshard != "file":
            out.append({"root": "root-reshard", "last-block": "last-block-no-reshard", "none": "no-reshard",
                        "node": "reshard-to-node"}[self.reshard])
        if self.hsdp:
            out.append("hsdp")
        if self.offload:
            out.append("offload")
        return out


@dataclass
class Space:
    """What each axis can take for this plan (the file's value first)."""
    granularity: Dict[str, List[Unit]]      # name -> the non-root units (a module, or a tuple: one group)
    blocks: List[str]                       # the repeated blocks' outermost instances
    ac: List[str]
    precision: List[str]
    reshard: List[str]
    hsdp: List[bool]
    offload: List[bool]
    node: int                               # GPUs per node (HSDP's shard group, the int reshard)


def search_space(tree, plan: WrapPlan, trace, settings, expressible) -> Space:
    """The axes for `plan`; `expressible(axis, value, modules=(), blocks=())`: whether the file's
    front-end can write it (``changes.expressible``)."""
    blocks = tree.instances_of(tree.repeated_blocks()) if tree.repeated_blocks() else []
    own = [u.modules[0] for u in plan.units if not u.is_root and len(u.modules) == 1]
    gran: Dict[str, List[str]] = {"file": []}
    if blocks and sorted(own) != sorted(blocks) and expressible("granularity", "blocks"):
        gran["blocks"] = list(blocks)
    extra = _embeddings_and_head(tree, blocks, group_ties=expressible("granularity", "tied-group"))
    if blocks and extra and expressible("granularity", "blocks+embeddings", extra, blocks):
        gran["blocks+embeddings"] = list(blocks) + extra
    experts = _experts(tree, blocks)
    if experts and expressible("granularity", "experts", experts, blocks):
        gran["experts"] = experts + list(blocks)
    checkpointed = trace is not None and not trace.error and trace.checkpointed
    ac = ["file"]
    if blocks and not checkpointed:
        ac += [m for m in ("selective", "full") if expressible("ac", m) and (m != "selective" or len(blocks) > 2)]
    floats = [p for p in tree.params.values() if p.is_floating]
    precision = ["file"]
    if floats and all(p.dtype == "float32" for p in floats) and not any(u.param_dtype for u in plan.units):
        precision += [m for m in ("bf16", "bf16-fp32-reduce") if expressible("precision", m)]
    ws = plan.world_size
    node = max(1, int(getattr(settings, "gpus_per_node", 8) or 8))
    reshard = ["file"]
    root = plan.root_unit
    if plan.api == "fsdp2":
        if root is not None and root.params and not root.reshard_after_forward_explicit:
            reshard.append("root")
        non_root = [u for u in plan.units if not u.is_root]
        if non_root and all(u.reshard_after_forward is True for u in non_root):
            reshard += ["last-block", "none"]
            if 1 < node < ws and ws % node == 0:
                reshard.append("node")
    elif plan.api == "fsdp1" and (plan.sharding_strategy or "FULL_SHARD") == "FULL_SHARD":
        reshard.append("none")
    reshard = [r for r in reshard if r == "file" or expressible("reshard", r)]
    hybrid = any(u.replicate_size > 1 for u in plan.units) or (plan.sharding_strategy or "").startswith(
        ("HYBRID", "_HYBRID"))
    hsdp = [False]
    if not hybrid and 1 < node < ws and ws % node == 0 and expressible("hsdp", True):
        hsdp.append(True)
    offload = [False] + ([True] if expressible("offload", True) else [])
    return Space(granularity=gran, blocks=list(blocks), ac=ac, precision=precision, reshard=reshard, hsdp=hsdp,
                 offload=offload, node=node)


def _embeddings_and_head(tree, blocks: List[str], group_ties: bool = False) -> List[Unit]:
    """Modules outside the blocks that hold parameters and that a unit of their own can take: the
    outermost ``Embedding`` and ``Linear`` layers. A tied embedding and head (one parameter
    registered on both) must stay in one unit: with `group_ties` (FSDP2 code: ``fully_shard([emb,
    head])``) they are one entry, a tuple of the modules sharing it; otherwise they stay in the root."""
    out: List[Unit] = []
    tied: List[str] = []
    for fqn, info in tree.modules.items():
        if not fqn or any(fqn == b or tree.is_ancestor(b, fqn) for b in blocks):
            continue
        if any(tree.is_ancestor(o, fqn) for o in _flat(out) + tied):
            continue
        if not ({"Embedding", "Linear"} & set(info.mro)):
            continue
        names = tree.aliases_under(fqn)
        if not names:
            continue
        if any(tree.params[tree.alias_to_canonical[a]].aliases for a in names):
            tied.append(fqn)
            continue
        out.append(fqn)
    if group_ties and tied:
        out += _tie_groups(tree, tied)
    return out


def _tie_groups(tree, tied: List[str]) -> List[Unit]:
    """The tied modules joined by the parameters they share, in the model's order; a group is
    offered only when every module registering its parameters is in it (a tie that reaches into a
    block or another module stays in the root)."""
    order = {f: i for i, f in enumerate(tree.modules)}

    def owner(name: str) -> Optional[str]:
        return next((m for m in tied if name == m or name.startswith(m + ".")), None)

    out: List[Unit] = []
    done: List[str] = []
    for m in tied:
        if m in done:
            continue
        group, todo, whole = [], [m], True
        while todo:
            cur = todo.pop()
            if cur in group:
                continue
            group.append(cur)
            for a in tree.aliases_under(cur):
                for other in tree.params[tree.alias_to_canonical[a]].all_fqns:
                    o = owner(other)
                    whole = whole and o is not None
                    if o is not None and o not in group:
                        todo.append(o)
        done += group
        if whole and len(group) > 1:
            out.append(tuple(sorted(group, key=lambda f: order.get(f, -1))))
    return out


def _flat(entries: List[Unit]) -> List[str]:
    """The module FQNs of granularity entries (a tuple: one unit of several modules)."""
    return [m for e in entries for m in ((e,) if isinstance(e, str) else e)]


def _experts(tree, blocks: List[str]) -> List[str]:
    """Per expert: inside each block, the children of a ``ModuleList`` whose children are two or
    more instances of one class holding parameters (``mlp.experts.0``, ...), or a grouped experts
    module (a class named ``*Experts`` holding parameters of its own)."""
    out: List[str] = []
    for b in blocks:
        for fqn, info in tree.modules.items():
            if not tree.is_ancestor(b, fqn):
                continue
            if "ModuleList" in info.mro and len(info.children) >= 2:
                classes = {tree.modules[c].cls for c in info.children}
                if len(classes) == 1 and all(tree.params_under(c) for c in info.children) \
                        and "expert" in fqn.rpartition(".")[2].lower():
                    out += [c for c in info.children if not any(tree.is_ancestor(o, c) for o in out)]
            elif info.cls.endswith("Experts") and info.direct_params and not any(tree.is_ancestor(o, fqn) for o in out):
                out.append(fqn)
    return out


def checkpointed_blocks(space: Space, ac: str) -> List[str]:
    """The blocks `ac` checkpoints: every one (full), every second one from the first (selective)."""
    if ac == "full":
        return list(space.blocks)
    if ac == "selective":
        return [b for i, b in enumerate(space.blocks) if i % 2 == 0]
    return []


def granular_plan(tree, plan: WrapPlan, space: Space, granularity: str) -> WrapPlan:
    if granularity == "file":
        return plan
    return alternative_plan(tree, plan, space.granularity[granularity], "suggest")


def with_precision(plan: WrapPlan, precision: str) -> WrapPlan:
    if precision == "file":
        return plan
    reduce = "bfloat16" if precision == "bf16" else "float32"
    return _with_units(plan, [dataclasses.replace(u, param_dtype="bfloat16", reduce_dtype=reduce) for u in plan.units])


def with_sharding(plan: WrapPlan, tree, space: Space, reshard: str, hsdp: bool) -> WrapPlan:
    """`plan` with `reshard` (see RESHARDS) and, with `hsdp`, shards of `space.node` ranks."""
    if reshard == "file" and not hsdp:
        return plan
    units = []
    last = _last_block(plan, tree)
    ws = plan.world_size
    for u in plan.units:
        kw = {}
        if reshard == "root" and u.is_root:
            kw = dict(reshard_after_forward=True, reshard_after_forward_explicit=True)
        elif reshard == "last-block" and u is last:
            kw = dict(reshard_after_forward=False, reshard_after_forward_explicit=True)
        elif reshard == "none" and not u.is_root:
            kw = dict(reshard_after_forward=False, reshard_after_forward_explicit=True)
        elif reshard == "node" and not u.is_root:
            kw = dict(reshard_after_forward=space.node, reshard_after_forward_explicit=True)
        if hsdp:
            kw.update(shard_size=space.node, replicate_size=ws // space.node, mesh=None)
        units.append(dataclasses.replace(u, **kw))
    cand = _with_units(plan, units)
    if plan.api == "fsdp1":
        strategy = cand.sharding_strategy or "FULL_SHARD"
        if reshard == "none":
            strategy = "SHARD_GRAD_OP"
        if hsdp:
            strategy = "_HYBRID_SHARD_ZERO2" if strategy == "SHARD_GRAD_OP" else "HYBRID_SHARD"
        cand.sharding_strategy = strategy
    return cand


def _last_block(plan: WrapPlan, tree) -> Optional[object]:
    """The non-root unit registered last in the model (for a stack of blocks: the last block)."""
    order = {f: i for i, f in enumerate(tree.modules)}
    non_root = [u for u in plan.units if not u.is_root]
    return max(non_root, key=lambda u: order.get(u.module, -1), default=None)


def _with_units(plan: WrapPlan, units) -> WrapPlan:
    return dataclasses.replace(plan, units=units, _param_units=None, _param_units_of=-1)
