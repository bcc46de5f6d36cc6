"""`plan`: the FSDP units the file's wrap code builds, in application order.

FSDP1 auto-wrap policies are resolved by torch's own traversal (``_recursive_wrap`` for callables,
``_Policy._run_policy`` + ``_post_order_apply`` for policy objects) with a recorder in place of the
wrapper class, so the result is what torch would wrap. Everything after that is plain data.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from fsdp_lint.model.mesh import MeshInfo, MeshProblem, ParamSharding, TPStyle, UnitMesh, Unsupported
from fsdp_lint.model.tree import ModuleTree, dtype_name


@dataclass
class Unit:
    module: str                     # FQN of the (first) module of the call, "" = root
    modules: List[str]              # all modules of the call (FSDP2 `fully_shard([a, b])`)
    cls: str
    path: str
    line: int
    col: int
    seq: int                        # application order among all records of the replay
    params: List[str] = field(default_factory=list)   # canonical FQNs owned, in torch's order
    origin: str = "call"            # "call" (a wrap call in the file), "policy" (auto-wrapped), "cli", "default"
    reshard_after_forward: Union[bool, int] = True    # an int: reshard to groups of that many ranks
    reshard_after_forward_explicit: bool = False
    param_dtype: Optional[str] = None
    reduce_dtype: Optional[str] = None
    shard_size: int = 1             # ranks the unit is sharded over
    is_root: bool = False
    replicate_size: int = 1         # HSDP / HYBRID_SHARD: replicas its shards are all-reduced over
    mesh: Optional[UnitMesh] = None  # its shard (and replicate) groups
    # where the linted file calls the helper that holds the wrap call (None: the call is in it)
    call_site: Optional[Tuple[str, int]] = None
    # FSDP2 shard_placement_fn evaluated on the call's parameters: FQN -> dim (the unit's own apply)
    shard_dims: Dict[str, int] = field(default_factory=dict)
    # FSDP2 offload_policy=CPUOffloadPolicy() / FSDP1 cpu_offload=CPUOffload(offload_params=True): its sharded
    # parameters, gradients and optimizer state live in host memory
    cpu_offload: bool = False


@dataclass
class PolicyInfo:
    """An FSDP1 auto-wrap policy as the file passes it."""
    path: str
    line: int
    desc: str                       # "transformer_auto_wrap_policy(transformer_layer_cls={Block})"
    classes: List[str]              # class names a class-based policy names
    matched: int                    # modules it wrapped
    is_policy_object: bool = False  # a `_Policy` (ModuleWrapPolicy, CustomPolicy): torch validates frozen params first
    # a framework's class-name setting (issue 8): which one ("transformer_layer_cls_to_wrap"), the
    # framework, and the error it raises for a name the model lacks
    setting: Optional[str] = None
    framework: Optional[str] = None
    error: Optional[str] = None
    # where the user wrote the class name, in the front-end's words ("`--fsdp_config` on the command line")
    written: Optional[str] = None


@dataclass
class OptimizerInfo:
    cls: str
    path: str
    line: int
    seq: int
    params: List[str]               # canonical FQNs of model params it holds
    foreign: int                    # params it holds that are not the model's
    remapped_by: Optional[str] = None   # a framework that points it at the wrapped parameters (accelerate's prepare)


@dataclass
class ParamEventInfo:
    kind: str                       # "freeze" | "dtype"
    path: str
    line: int
    seq: int
    value: Any


@dataclass
class PlanProblem:
    kind: str                       # "wrapped-twice" | "ancestor-already-sharded" | "outside-model"
    module: str
    path: str
    line: int
    col: int
    detail: str
    related: Optional[str] = None   # the module sharded before (the ancestor, or the same module)
    related_line: int = 0           # the line of that earlier call


@dataclass
class WrapPlan:
    api: Optional[str]              # "fsdp1" | "fsdp2" | None (no wrap code)
    world_size: int
    units: List[Unit]
    root_wrapped: bool
    use_orig_params: Optional[bool]
    sharding_strategy: Optional[str]
    origin: str                     # "file" | "cli" | "default" | "none"
    ignored_params: List[str] = field(default_factory=list)
    ignored_at: Dict[str, Tuple[str, int, int]] = field(default_factory=dict)  # ignored module/param FQN -> (path, line, col) of the call naming it
    ignored_modules: List[str] = field(default_factory=list)
    leftover_params: List[str] = field(default_factory=list)   # in no unit and not ignored
    policies: List[PolicyInfo] = field(default_factory=list)
    optimizers: List[OptimizerInfo] = field(default_factory=list)
    param_events: Dict[str, List[ParamEventInfo]] = field(default_factory=dict)
    problems: List[PlanProblem] = field(default_factory=list)
    wrap_call_lines: List[Tuple[str, int]] = field(default_factory=list)
    # issue 11: the mesh the file builds, where the world size comes from, tensor/expert parallelism
    mesh: Optional[MeshInfo] = None
    world_size_source: str = "default"      # "--world-size" | "config" | "default" | "mesh"
    param_sharding: Dict[str, ParamSharding] = field(default_factory=dict)   # DTensor params before FSDP
    tp_styles: List[TPStyle] = field(default_factory=list)
    mesh_problems: List[MeshProblem] = field(default_factory=list)
    unsupported: List[Unsupported] = field(default_factory=list)
    # (path, line) of a wrap/freeze/cast/optimizer call in a helper module -> the call site in the
    # linted file that reached it
    call_sites: Dict[Tuple[str, int], Tuple[str, int]] = field(default_factory=dict)
    # FSDP2 shard_placement_fn: parameter FQN -> the dim it is sharded on (absent: dim 0)
    param_shard_dims: Dict[str, int] = field(default_factory=dict)
    framework: Optional[str] = None  # the framework whose code made the wrap calls (issue 8), None: the file's own
    # how the HF Trainer's FSDP settings were written (plan.frameworks.hf_frontend), for fix texts in its terms
    hf_frontend: Optional[dict] = None
    framework_config: Optional[str] = None  # "plugin": accelerate's FullyShardedDataParallelPlugin in code (else YAML/env)

    # parameter FQN -> the units holding it, in order; built on first use, once the plan is complete
    _param_units: Optional[Dict[str, List[Unit]]] = field(default=None, repr=False, compare=False)
    _param_units_of: int = field(default=-1, repr=False, compare=False)

    def param_units(self) -> Dict[str, List[Unit]]:
        """Parameter FQN -> the units that hold it (rules look parameters up per parameter: a scan of
        the units each time made 10,000 units x 20,000 optimizer parameters quadratic)."""
        if self._param_units is None or self._param_units_of != len(self.units):
            index: Dict[str, List[Unit]] = {}
            for unit in self.units:
                for p in unit.params:
                    index.setdefault(p, []).append(unit)
            self._param_units, self._param_units_of = index, len(self.units)
        return self._param_units

    def unit_for_param(self, fqn: str) -> Optional[Unit]:
        units = self.param_units().get(fqn)
        return units[0] if units else None

    def units_for_param(self, fqn: str) -> List[Unit]:
        return list(self.param_units().get(fqn, ()))

    def unit_of_module(self, fqn: str) -> Optional[Unit]:
        """The innermost unit whose subtree contains module `fqn` (None: outside every unit).
        Innermost = the unit module closest to `fqn`; among equals the one applied first."""
        best: Optional[Tuple[int, int, Unit]] = None
        for unit in self.units:
            for m in unit.modules:
                if m == "" or fqn == m or fqn.startswith(m + "."):
                    key = (-(m.count(".") + 1 if m else 0), unit.seq)
                    if best is None or key < best[:2]:
                        best = (key[0], key[1], unit)
        return best[2] if best else None

    @property
    def root_unit(self) -> Optional[Unit]:
        for unit in self.units:
            if unit.is_root:
                return unit
        return None


@dataclass
class PlanOptions:
    world_size: int = 8
    api: Optional[str] = None                   # override: "fsdp1" | "fsdp2"
    wrap: List[str] = field(default_factory=list)   # class names or FQN globs
    use_orig_params: Optional[bool] = None
    gpus_per_node: int = 8                      # HYBRID_SHARD without process groups: the node size
    world_size_source: str = "default"          # "--world-size" | "config" | "default"


# --------------------------------------------------------------------------------------------
# plan construction
# --------------------------------------------------------------------------------------------
def _dtype_or_none(value) -> Optional[str]:
    return None if value is None else dtype_name(value)


def _sharding_strategy(value) -> Optional[str]:
    if value is None:
        return None
    return getattr(value, "name", str(value))


def build_plan(result, tree: ModuleTree, options: PlanOptions) -> WrapPlan:
    """Turn a replay's records (live modules) into a WrapPlan of FQNs."""
    import torch.nn as nn

    root = result.model
    fqn_of: Dict[int, str] = {id(m): fqn for fqn, m in root.named_modules()}
    param_fqn: Dict[int, str] = {}
    for fqn, p in nn.Module.named_parameters(root, remove_duplicate=False):     # (an override: tree.py)
        param_fqn.setdefault(id(p), tree.canonical(fqn))

    plan = WrapPlan(api=None, world_size=options.world_size, units=[], root_wrapped=False,
                    use_orig_params=None, sharding_strategy=None, origin="none",
                    world_size_source=options.world_size_source)

    for pos in ([c.pos for c in result.wrap_calls] + [o.pos for o in result.optimizers]
                + [e.pos for e in result.param_events]):
        via = getattr(pos, "via", None)
        if via is not None:
            plan.call_sites.setdefault((pos.path, pos.line), (via.path, via.line))

    # events (freezes, dtype changes) by parameter
    for ev in result.param_events:
        for pid in ev.param_ids:
            fqn = param_fqn.get(pid)
            if fqn is not None:
                plan.param_events.setdefault(fqn, []).append(
                    ParamEventInfo(ev.kind, ev.pos.path, ev.pos.line, ev.seq, ev.value))
    for opt in result.optimizers:
        params = [param_fqn[i] for i in opt.param_ids if i in param_fqn]
        plan.optimizers.append(OptimizerInfo(opt.cls, opt.pos.path, opt.pos.line, opt.seq, params,
                                             foreign=len(opt.param_ids) - len(params)))

    calls = result.wrap_calls
    if options.wrap:
        _plan_from_globs(plan, tree, options, calls)
    elif calls:
        _plan_from_calls(plan, tree, options, calls, fqn_of, param_fqn)
    else:
        _default_plan(plan, tree, options)
    if options.api is not None and plan.api != options.api and not options.wrap and calls:
        # --api on a file that uses the other API: same units, other arithmetic
        plan.api = options.api
    if plan.api == "fsdp1":
        if options.use_orig_params is not None:
            plan.use_orig_params = options.use_orig_params
        elif plan.use_orig_params is None:
            plan.use_orig_params = False
    else:
        plan.use_orig_params = None
    _assign_params(plan, tree)
    for unit in plan.units:
        for fqn in unit.params:
            if unit.shard_dims.get(fqn):
                plan.param_shard_dims[fqn] = unit.shard_dims[fqn]
    from fsdp_lint.plan.multidim import attach_parallel

    attach_parallel(plan, result, tree, options, fqn_of, param_fqn)  # issue 11: meshes, TP, world size
    return plan


def _plan_from_calls(plan: WrapPlan, tree: ModuleTree, options: PlanOptions, calls, fqn_of, param_fqn) -> None:
    plan.origin = "file"
    apis = {c.api for c in calls}
    plan.api = calls[-1].api if len(apis) > 1 else next(iter(apis))
    seen_modules: Dict[str, Unit] = {}
    seen_order: Dict[str, int] = {}
    for call in calls:
        plan.wrap_call_lines.append((call.pos.path, call.pos.line))
        fqns = []
        for m in call.modules:
            fqn = fqn_of.get(id(m))
            if fqn is None:
                plan.problems.append(PlanProblem("outside-model", type(m).__name__, call.pos.path, call.pos.line,
                                                 call.pos.col, f"{type(m).__name__} is not part of the linted model"))
                continue
            fqns.append(fqn)
        if not fqns:
            continue
        kw = call.kwargs
        if call.api == "fsdp2":
            mp = kw.get("mp_policy")
            raf = kw.get("reshard_after_forward", None)
            mesh = kw.get("mesh")
            shard_size = options.world_size
            if mesh is not None and hasattr(mesh, "size"):
                try:
                    shard_size = int(mesh.size(-1)) if getattr(mesh, "ndim", 1) > 1 else int(mesh.size())
                except Exception:
                    shard_size = options.world_size
            unit = Unit(
                module=fqns[0], modules=fqns, cls=", ".join(tree.modules[f].cls for f in fqns),
                path=call.pos.path, line=call.pos.line, col=call.pos.col, seq=call.seq,
                reshard_after_forward=raf if isinstance(raf, int) and not isinstance(raf, bool)
                else (bool(raf) if raf is not None else True),
                reshard_after_forward_explicit=raf is not None,
                param_dtype=_dtype_or_none(getattr(mp, "param_dtype", None)),
                reduce_dtype=_dtype_or_none(getattr(mp, "reduce_dtype", None)),
                shard_size=shard_size,
                cpu_offload=type(kw.get("offload_policy")).__name__ == "CPUOffloadPolicy",
            )
            for f in fqns:
                if f in seen_modules:
                    plan.problems.append(PlanProblem(
                        "wrapped-twice", f, call.pos.path, call.pos.line, call.pos.col,
                        f"fully_shard is applied to {f or 'the root'} a second time "
                        f"(first at line {seen_modules[f].line})", f, seen_modules[f].line))
                else:
                    # the first-sharded of its ancestors (found up the FQN, not over every module)
                    sharded = [a for a in tree.ancestors(f) if a in seen_modules]
                    if sharded:
                        earlier = min(sharded, key=lambda a: seen_order[a])
                        eu = seen_modules[earlier]
                        plan.problems.append(PlanProblem(
                            "ancestor-already-sharded", f, call.pos.path, call.pos.line, call.pos.col,
                            f"fully_shard({f}) runs after its ancestor {earlier or 'the root model'} "
                            f"was sharded at line {eu.line}", earlier, eu.line))
            unit.call_site = plan.call_sites.get((call.pos.path, call.pos.line))
            for pid, dim in (getattr(call, "shard_dims", None) or {}).items():
                fqn = param_fqn.get(pid)
                if fqn is not None:
                    unit.shard_dims[fqn] = dim
            for f in fqns:
                seen_order.setdefault(f, len(seen_order))
                seen_modules.setdefault(f, unit)
            for prm in kw.get("ignored_params") or []:
                f = param_fqn.get(id(prm))
                if f is not None:
                    if f not in plan.ignored_params:
                        plan.ignored_params.append(f)
                    plan.ignored_at.setdefault(f, (call.pos.path, call.pos.line, call.pos.col))
            plan.units.append(unit)
        else:
            mp = kw.get("mixed_precision")
            if plan.use_orig_params is None or fqns[0] == "" or True:
                if "use_orig_params" in kw or plan.use_orig_params is None:
                    plan.use_orig_params = bool(kw.get("use_orig_params", False))
            strategy = _sharding_strategy(kw.get("sharding_strategy"))
            if strategy:
                plan.sharding_strategy = strategy
            param_dtype = _dtype_or_none(getattr(mp, "param_dtype", None))
            reduce_dtype = _dtype_or_none(getattr(mp, "reduce_dtype", None)) or param_dtype
            offload = bool(getattr(kw.get("cpu_offload"), "offload_params", False))
            for m in kw.get("ignored_modules") or []:
                f = fqn_of.get(id(m))
                if f is not None and f not in plan.ignored_modules:
                    plan.ignored_modules.append(f)
            for s in kw.get("ignored_states") or []:
                if hasattr(s, "parameters"):
                    f = fqn_of.get(id(s))
                    if f is not None and f not in plan.ignored_modules:
                        plan.ignored_modules.append(f)
                elif id(s) in param_fqn:
                    plan.ignored_params.append(param_fqn[id(s)])
            for s in list(kw.get("ignored_modules") or []) + list(kw.get("ignored_states") or []):
                f = fqn_of.get(id(s)) if hasattr(s, "parameters") else param_fqn.get(id(s))
                if f is not None:
                    plan.ignored_at.setdefault(f, (call.pos.path, call.pos.line, call.pos.col))
            if call.policy_desc is not None:
                matched = [fqn_of[id(m)] for m in call.auto_wrapped if id(m) in fqn_of]
                plan.policies.append(PolicyInfo(call.pos.path, call.pos.line, call.policy_desc,
                                                call.policy_classes, len(matched),
                                                is_policy_object=_is_policy_object(kw.get("auto_wrap_policy"))))
            for m in call.auto_wrapped:
                f = fqn_of.get(id(m))
                if f is None:
                    continue
                plan.units.append(Unit(
                    module=f, modules=[f], cls=tree.modules[f].cls, path=call.pos.path, line=call.pos.line,
                    col=call.pos.col, seq=call.seq, origin="policy", param_dtype=param_dtype,
                    reduce_dtype=reduce_dtype, shard_size=options.world_size, cpu_offload=offload,
                    reshard_after_forward=strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2", "NO_SHARD"),
                    call_site=plan.call_sites.get((call.pos.path, call.pos.line))))
            f = fqns[0]
            if f in seen_modules:
                plan.problems.append(PlanProblem("wrapped-twice", f, call.pos.path, call.pos.line, call.pos.col,
                                                 f"FSDP wraps {f or 'the root'} a second time"))
            unit = Unit(module=f, modules=[f], cls=tree.modules[f].cls, path=call.pos.path, line=call.pos.line,
                        col=call.pos.col, seq=call.seq, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                        shard_size=options.world_size, cpu_offload=offload,
                        reshard_after_forward=strategy not in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2", "NO_SHARD"),
                        call_site=plan.call_sites.get((call.pos.path, call.pos.line)))
            seen_order.setdefault(f, len(seen_order))
            seen_modules[f] = unit
            plan.units.append(unit)


def _is_policy_object(policy) -> bool:
    try:
        from torch.distributed.fsdp.wrap import _Policy
    except Exception:  # pragma: no cover - torch without FSDP
        return False
    return isinstance(policy, _Policy)


def _modules_matching(tree: ModuleTree, patterns: List[str]) -> List[str]:
    out = []
    for fqn, info in tree.modules.items():
        if fqn == "":
            continue
        for pat in patterns:
            if info.cls == pat or fnmatch.fnmatchcase(fqn, pat) or (not any(c in pat for c in "*?[.") and pat in info.mro):
                out.append(fqn)
                break
    return out


def _plan_from_globs(plan: WrapPlan, tree: ModuleTree, options: PlanOptions, calls) -> None:
    """`--wrap CLASS_OR_FQN_GLOB`: these modules, children first, then the root."""
    plan.origin = "cli"
    plan.api = options.api or (calls[-1].api if calls else "fsdp2")
    matched = _modules_matching(tree, options.wrap)
    # post-order: deeper modules first, then by position
    order = {f: i for i, f in enumerate(tree.modules)}
    matched.sort(key=lambda f: (order[f],))
    post = sorted(matched, key=lambda f: (-f.count("."), order[f])) if False else _post_order(tree, matched)
    seq = 0
    for f in post:
        plan.units.append(Unit(module=f, modules=[f], cls=tree.modules[f].cls, path="<cli>", line=0, col=0,
                               seq=seq, origin="cli", shard_size=options.world_size))
        seq += 1
    plan.units.append(Unit(module="", modules=[""], cls=tree.modules[""].cls, path="<cli>", line=0, col=0,
                           seq=seq, origin="cli", shard_size=options.world_size))
    plan.policies.append(PolicyInfo("<cli>", 0, "--wrap " + " --wrap ".join(options.wrap),
                                    list(options.wrap), len(matched)))


def _post_order(tree: ModuleTree, fqns: List[str]) -> List[str]:
    wanted = set(fqns)
    out: List[str] = []

    def visit(fqn: str) -> None:
        for child in tree.modules[fqn].children:
            visit(child)
        if fqn in wanted:
            out.append(fqn)

    visit("")
    return out


def _default_plan(plan: WrapPlan, tree: ModuleTree, options: PlanOptions) -> None:
    """A model file without wrap code: show the recommended per-block plan."""
    classes = tree.repeated_blocks()
    plan.origin = "default"
    plan.api = options.api or "fsdp2"
    blocks = tree.instances_of(classes) if classes else []   # the outermost instances only
    for seq, f in enumerate(_post_order(tree, blocks)):
        plan.units.append(Unit(module=f, modules=[f], cls=tree.modules[f].cls, path="<default>", line=0, col=0, seq=seq,
                               origin="default", shard_size=options.world_size))
    plan.units.append(Unit(module="", modules=[""], cls=tree.modules[""].cls, path="<default>", line=0, col=0,
                           seq=len(plan.units), origin="default", shard_size=options.world_size))


def _assign_params(plan: WrapPlan, tree: ModuleTree) -> None:
    """Which parameters each unit owns, in torch's order.

    A unit owns the parameters registered in its modules' subtrees outside the subtrees of units
    applied before it (nested units). FSDP1 orders them as ``named_parameters()``; FSDP2 walks the
    managed modules in post-order, each module's own parameters first-seen.
    """
    ignored: Set[str] = set(plan.ignored_params)
    for m in plan.ignored_modules:
        ignored |= set(tree.params_under(m))
    plan.ignored_params = [p for p in tree.params if p in ignored]
    applied: List[Unit] = []
    applied_at: Dict[str, List[int]] = {}        # module FQN -> indices in `applied` of units holding it
    outside: Set[str] = set()                    # ... of them, FQNs the tree does not list
    for unit in plan.units:
        # units applied before this one inside its modules' subtrees (found through the subtree
        # index: linear in the model, not units²; FQNs compared only for modules the tree lacks)
        found: Set[int] = set()
        for um in unit.modules:
            if um in tree.modules:
                for fqn in _outermost_applied(tree, um, applied_at):
                    found.update(applied_at[fqn])
            for m in (applied_at if um not in tree.modules else outside):
                if tree.is_ancestor(um, m) or um == m:
                    found.update(applied_at[m])
        nested = [applied[i] for i in sorted(found)]
        nested_roots = [m for u in nested for m in u.modules if m not in unit.modules]
        unit.is_root = "" in unit.modules
        nested_set = set(nested_roots)

        def inside_nested(fqn: str) -> bool:
            return "" in nested_set or fqn in nested_set or tree.nearest_ancestor_in(fqn, nested_set) is not None

        owned: List[str] = []
        seen: Set[str] = set()
        if plan.api == "fsdp2":
            module_order = _managed_modules_post_order(tree, unit.modules, nested_roots)
            for mod in module_order:
                for alias in tree.modules[mod].direct_params:
                    canonical = tree.canonical(alias)
                    if canonical in seen or canonical in ignored:
                        continue
                    seen.add(canonical)
                    owned.append(canonical)
        else:
            # use_orig_params=True marks every flattened parameter; a later unit (a sibling holding a
            # tied alias, or an ancestor) skips it. With use_orig_params=False the mark is not seen
            # and the later unit flattens its own copy of a tied parameter (torch 2.13).
            flattened: Set[str] = {p for u in applied for p in u.params} if plan.use_orig_params else set()
            for mod in unit.modules:
                for alias in tree.aliases_under(mod):
                    canonical = tree.alias_to_canonical[alias]
                    owner = alias.rpartition(".")[0]
                    if inside_nested(owner) or canonical in seen or canonical in ignored or canonical in flattened:
                        continue
                    seen.add(canonical)
                    owned.append(canonical)
        unit.params = owned
        for m in unit.modules:
            applied_at.setdefault(m, []).append(len(applied))
            if m not in tree.modules:
                outside.add(m)
        applied.append(unit)
    plan.root_wrapped = any(u.is_root for u in plan.units)
    covered: Set[str] = set()
    for u in plan.units:
        covered |= set(u.params)
    plan.leftover_params = [p for p in tree.params if p not in covered and p not in ignored]


def _outermost_applied(tree: ModuleTree, start: str, applied_at: Dict[str, List[int]]) -> List[str]:
    """`start` if a unit already holds it, and the outermost modules below it that units applied
    before hold: the walk does not enter them (what they hold is theirs), so wrapping every level of
    a deep model costs each unit its own levels, not the whole subtree."""
    out = [start] if start in applied_at else []
    stack = list(reversed(tree.modules[start].children))
    while stack:
        fqn = stack.pop()
        if fqn in applied_at:
            out.append(fqn)
            continue
        stack.extend(reversed(tree.modules[fqn].children))
    return out


def _managed_modules_post_order(tree: ModuleTree, roots: List[str], nested_roots: List[str]) -> List[str]:
    out: List[str] = []
    visited: Set[str] = set()
    nested = set(nested_roots)

    def dfs(fqn: str) -> None:
        if fqn in nested and fqn not in roots:
            return
        visited.add(fqn)
        for child in tree.modules[fqn].children:
            if child not in visited:
                dfs(child)
        out.append(fqn)

    for r in roots:
        dfs(r)
    return out


# --------------------------------------------------------------------------------------------
# the per-block alternative (what FSD101/FSD102 compare a plan with)
# --------------------------------------------------------------------------------------------
def wrap_pattern_matches(tree: ModuleTree, pattern: str) -> List[str]:
    """The modules a ``--wrap`` class name or FQN glob selects (what the CLI plan wraps)."""
    return _modules_matching(tree, [pattern])
