"""Helpers the FlatParameter rules (FSD201-FSD204) share: which statement froze or cast a parameter,
how a unit was wrapped, and the concrete grouping that makes every unit uniform.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from fsdp_lint.plan.layout import fsdp1_flatten_error
from fsdp_lint.rules._reads import reads_outside
from fsdp_lint.model.tree import ModuleTree, describe_params, param_patterns, uniform_cover

_MODEL = '''
import torch
import torch.nn as nn

class Adapter(nn.Module):
    """A LoRA-style wrapper: the pretrained `base` stays frozen, `lora_a`/`lora_b` train."""
    def __init__(self, base, r=4):
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, r, bias=False)
        self.lora_b = nn.Linear(r, base.out_features, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(x))

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.q(self.norm(x)))

class Net(nn.Module):
    def __init__(self, vocab=256, dim=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

def add_adapters(model):
    for layer in model.layers:
        layer.q = Adapter(layer.q)
    return model
'''

_FSDP1 = '''
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy, transformer_auto_wrap_policy
'''

_LORA = _MODEL + _FSDP1 + '''
model = Net()
model.requires_grad_(False)
add_adapters(model)
'''


# --------------------------------------------------------------------------------------------
# helpers shared with FSD202 / FSD203
# --------------------------------------------------------------------------------------------
def unit_name(module: str) -> str:
    return module if module else "the root"


def where(path: str, line: int, ctx_path: str) -> str:
    import os

    if not line:
        return ""
    if os.path.abspath(path) == os.path.abspath(ctx_path):
        return f"line {line}"
    return f"{os.path.basename(path)}:{line}"


def wrap_seq(units) -> float:
    """When the units were wrapped, in the replay's order of records; a `--wrap` plan is applied
    after everything the file does."""
    if any(u.origin not in ("call", "policy") for u in units):
        return float("inf")
    return min(u.seq for u in units)


def event_positions(ctx, fqns: Sequence[str], kind: str, before_seq: float,
                    accept: Callable[[object], bool] = lambda v: True) -> List[Tuple[str, int]]:
    """Where the parameters got their current state: for each of `fqns` the last `kind` event
    ("freeze" | "dtype") before the wrap call, when its value passes `accept`; (path, line) in
    source order, the linted file first."""
    import os

    here = os.path.abspath(ctx.path)
    out: Dict[Tuple[str, int], None] = {}
    for f in fqns:
        evs = [e for e in ctx.plan.param_events.get(f, []) if e.kind == kind and e.seq < before_seq]
        if evs and accept(evs[-1].value):
            out[(evs[-1].path, evs[-1].line)] = None
    return sorted(out, key=lambda k: (os.path.abspath(k[0]) != here, k[1]))


def event_lines(ctx, fqns: Sequence[str], kind: str, before_seq: float,
                accept: Callable[[object], bool] = lambda v: True) -> List[str]:
    """`event_positions` as "line N"."""
    return [where(p, ln, ctx.path) for p, ln in event_positions(ctx, fqns, kind, before_seq, accept)]


def anchor(ctx, u, positions: Sequence[Tuple[str, int]] = ()) -> dict:
    """Where a finding about unit `u` points: its wrap call; for a `--wrap` plan (no call in the
    file) the statement that caused the problem, else the file's first line."""
    if u.line and not u.path.startswith("<"):
        return {"path": u.path, "line": u.line, "col": u.col}
    for path, line in positions:
        if line:
            return {"path": path, "line": line, "col": 1}
    return {"path": ctx.path, "line": 1, "col": 1}


def wrapped_how(ctx, u) -> str:
    """"auto-wrapped by ModuleWrapPolicy({Block}) at line 52" / "wrapped at line 52" / "wrapped by --wrap"."""
    if u.path.startswith("<") or not u.line:
        return "wrapped by --wrap" if u.origin == "cli" else "wrapped"
    pol = policy_of(ctx.plan, call_unit(ctx.plan, u))
    how = f"auto-wrapped by {pol.desc}" if u.origin == "policy" and pol is not None else "wrapped"
    return f"{how} at {where(u.path, u.line, ctx.path)}"


def join_lines(lines: List[str]) -> str:
    if len(lines) <= 1:
        return "".join(lines)
    return ", ".join(lines[:-1]) + " and " + lines[-1]


def call_unit(plan, unit):
    """The unit of the FSDP1 call that auto-wrapped `unit` (itself for a call unit)."""
    if unit.origin != "policy":
        return unit
    for u in plan.units:
        if u.seq == unit.seq and u.origin != "policy":
            return u
    return unit


def policy_of(plan, unit):
    for pol in plan.policies:
        if pol.path == unit.path and pol.line == unit.line:
            return pol
    return None


def fsdp1_torch_error(ctx, u) -> Optional[str]:
    """What torch raises for FSDP1 unit `u` at wrap time: the frozen-parameter check that a
    `_Policy` (ModuleWrapPolicy, CustomPolicy) runs on its targets before wrapping anything, then
    the FlatParameter's own checks (dtype, requires_grad)."""
    plan, tree = ctx.plan, ctx.tree
    infos = [tree.params[p] for p in u.params]
    pol = policy_of(plan, call_unit(plan, u))
    if u.origin == "policy" and pol is not None and pol.is_policy_object and not plan.use_orig_params \
            and len({p.requires_grad for p in infos}) > 1:
        top = call_unit(plan, u).module
        rel = u.module[len(top) + 1:] if top else u.module
        return (f"{rel} has both parameters with requires_grad=True and False. "
                f"FSDP does not support wrapping such modules when use_orig_params=False.")
    return fsdp1_flatten_error(infos, bool(plan.use_orig_params))


def _glob(fqn: str) -> str:
    return ".".join("*" if p.isdigit() else p for p in fqn.split("."))


def split_grouping(ctx, units, key: Callable, predicate: Callable[[object], str]) -> Optional[dict]:
    """The modules to wrap as their own units so that every unit in `units` becomes uniform in
    ``key(ParamInfo)``, and a policy/call that does it. None when some module holds parameters of
    both kinds directly (no wrapping separates them).

    `predicate(value)` renders the test on a parameter ``p`` for a policy lambda
    (``"p.requires_grad"``, ``"p.dtype == torch.bfloat16"``)."""
    tree: ModuleTree = ctx.tree
    plan = ctx.plan
    chosen: List[str] = []
    side_values = set()
    for u in units:
        covers = uniform_cover(tree, u.module, u.params, key)
        options = []
        for value, mods in covers.items():
            if mods is None:
                continue
            numel = sum(tree.params[p].numel for p in u.params if key(tree.params[p]) == value)
            options.append((len(mods), numel, str(value), value, mods))
        if not options:
            return None
        options.sort(key=lambda o: o[:3])
        _, _, _, value, mods = options[0]
        side_values.add(value)
        chosen += [m for m in mods if m not in chosen]
    if any(reads_outside(ctx, m) for m in chosen):
        return None     # a unit of its own would leave a parameter sharded where it is read (FSD402)
    globs = list(dict.fromkeys(_glob(m) for m in chosen))
    classes = sorted({tree.modules[m].cls for m in chosen})
    out = {"modules": chosen, "globs": globs, "classes": classes, "code": None, "policy": None}
    first = units[0]
    pol = policy_of(plan, call_unit(plan, first))
    if pol is not None:
        existing = list(pol.classes)
        if len(side_values) == 1:
            value = next(iter(side_values))
            pure = _class_policy_ok(tree, classes, key, len(chosen))
            if existing and pure:
                spelled = {("nn." + tree.modules[m].cls if tree.modules[m].cls_qualname.startswith("torch.nn.")
                            else tree.modules[m].cls) for m in chosen}
                names = list(dict.fromkeys(existing + sorted(spelled)))
                out["policy"] = f"ModuleWrapPolicy({{{', '.join(names)}}})"
            elif existing and _leaf_policy_ok(tree, chosen, key, value):
                isin = existing[0] if len(existing) == 1 else "(" + ", ".join(existing) + ")"
                out["policy"] = (f"CustomPolicy(lambda m: isinstance(m, {isin}) or "
                                 f"(not list(m.children()) and any({predicate(value)} for p in m.parameters())))")
            if out["policy"]:
                out["code"] = f"`auto_wrap_policy={out['policy']}`"
        if out["code"] is None:
            out["code"] = ("a `CustomPolicy` whose lambda also returns True for these modules "
                           "(nested FSDP wraps before an auto-wrapping FSDP call are rejected)")
    else:
        calls = [f"{tree.expr(m)} = FSDP({tree.expr(m)}, ...)" for m in chosen[:2]]
        more = f" (and the same for the other {len(chosen) - 2})" if len(chosen) > 2 else ""
        out["code"] = "before the FSDP call that wraps them now: `" + "`; `".join(calls) + "`" + more
    return out


def _class_policy_ok(tree: ModuleTree, classes: List[str], key, n_chosen: int) -> bool:
    """Wrapping every instance of `classes` keeps each new unit uniform and adds few other units."""
    instances = [f for f, info in tree.modules.items() if f and info.cls in classes]
    if len(instances) > 2 * n_chosen:
        return False
    for f in instances:
        if len({key(tree.params[p]) for p in tree.params_under(f)}) > 1:
            return False
    return True


def _leaf_policy_ok(tree: ModuleTree, chosen: List[str], key, value) -> bool:
    """The chosen modules are leaves, and every leaf holding a `value` parameter holds only those
    (so the lambda wraps exactly uniform leaves, not many more than needed)."""
    if any(tree.modules[m].children for m in chosen):
        return False
    hits = 0
    for f, info in tree.modules.items():
        if not f or info.children:
            continue
        vals = [key(tree.params[p]) for p in tree.params_under(f)]
        if value in vals:
            if len(set(vals)) > 1:
                return False
            hits += 1
    return hits <= 2 * len(chosen)


def shared_owner(tree: ModuleTree, params: List[str], key) -> str:
    """A module that holds parameters of two kinds directly, for the "cannot be separated" message."""
    owned = set(params)
    for fqn, info in tree.modules.items():
        direct = [tree.canonical(a) for a in info.direct_params if tree.canonical(a) in owned]
        if len({key(tree.params[p]) for p in direct}) > 1:
            names = ", ".join(a.rpartition(".")[2] for a in info.direct_params)
            return f"{unit_name(fqn)} ({info.cls}: {names})"
    return "one module"


def group_units(units, signature: Callable) -> List[list]:
    """Units with the same wrap line and the same relative signature, reported once."""
    groups: Dict[tuple, list] = {}
    for u in units:
        groups.setdefault((u.path, u.line, u.cls, signature(u)), []).append(u)
    return list(groups.values())


def units_label(units, noun: str = "FSDP unit") -> str:
    names = [unit_name(u.module) for u in units]
    if len(names) == 1:
        return (f"the root {noun} ({units[0].cls})" if not units[0].module
                else f"{noun} {names[0]} ({units[0].cls})")
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} {noun}s ({shown}; {units[0].cls})"


def units_brief(units, noun: str = "FSDP unit") -> str:
    """`units_label` for a one-line message: several units by their number and class only (the names
    are in the finding's detail)."""
    if len(units) == 1:
        return units_label(units, noun)
    return f"{len(units)} {noun}s ({units[0].cls})"


def requires_grad_split(ctx, u) -> Tuple[List[str], List[str]]:
    """Frozen and trainable floating-point parameters of a unit (integer ones are FSD204's)."""
    tree = ctx.tree
    floating = [p for p in u.params if tree.params[p].is_floating]
    frozen = [p for p in floating if not tree.params[p].requires_grad]
    trainable = [p for p in floating if tree.params[p].requires_grad]
    return frozen, trainable


def describe_mix(ctx, u) -> Tuple[str, str]:
    frozen, trainable = requires_grad_split(ctx, u)
    rel = u.module
    return (describe_params(ctx.tree, frozen, within=rel, others=trainable),
            describe_params(ctx.tree, trainable, within=rel, others=frozen))


def mix_signature(ctx):
    def sig(u):
        frozen, trainable = requires_grad_split(ctx, u)
        return (tuple(param_patterns(ctx.tree, frozen, within=u.module, others=trainable)),
                tuple(param_patterns(ctx.tree, trainable, within=u.module, others=frozen)))
    return sig


def mixed_units(ctx) -> List:
    out = []
    for u in ctx.plan.units:
        frozen, trainable = requires_grad_split(ctx, u)
        if frozen and trainable:
            out.append(u)
    return out


def freeze_story(ctx, units) -> str:
    """"frozen at line 102" / "made trainable at line 110"."""
    seq = wrap_seq(units)
    frozen = [p for u in units for p in requires_grad_split(ctx, u)[0]]
    trainable = [p for u in units for p in requires_grad_split(ctx, u)[1]]
    parts = []
    fl = event_lines(ctx, frozen, "freeze", seq, lambda v: v is False)
    if fl:
        parts.append(f"frozen at {join_lines(fl)}")
    tl = event_lines(ctx, trainable, "freeze", seq, lambda v: v is True)
    if tl:
        parts.append(f"made trainable at {join_lines(tl)}")
    return "; ".join(parts)


def freeze_positions(ctx, units) -> List[Tuple[str, int]]:
    frozen = [p for u in units for p in requires_grad_split(ctx, u)[0]]
    return event_positions(ctx, frozen, "freeze", wrap_seq(units), lambda v: v is False)


def grad_numels(ctx, u) -> Tuple[int, int]:
    """torch's numbers (``_validate_frozen_params``): all managed parameters' numel, and the
    trainable ones', before sharding."""
    frozen, trainable = requires_grad_split(ctx, u)
    tree = ctx.tree
    return (sum(tree.params[p].numel for p in frozen + trainable), sum(tree.params[p].numel for p in trainable))


def split_fix(ctx, units) -> Optional[dict]:
    """The requires_grad grouping for `units`, with its fix text under "text"."""
    grouping = split_grouping(ctx, units, key=lambda p: p.requires_grad,
                              predicate=lambda v: "p.requires_grad" if v else "not p.requires_grad")
    if grouping is None:
        return None
    mods = grouping["globs"]
    shown = ", ".join(f"`{m}`" for m in mods[:4]) + (f" and {len(mods) - 4} more" if len(mods) > 4 else "")
    n = len(grouping["modules"])
    grouping["text"] = (f"wrap {shown} ({', '.join(grouping['classes'])}, {n} module{'s' if n != 1 else ''}) as "
                        f"{'their' if n != 1 else 'its'} own FSDP unit{'s' if n != 1 else ''}, so that every unit is "
                        f"uniformly frozen or trainable: {grouping['code']}")
    return grouping
