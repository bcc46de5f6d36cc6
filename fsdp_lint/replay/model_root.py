"""The model a replay's wrap calls belong to: the top ancestor of the wrapped modules, and the
sub-modules and parameters put back that code after the last wrap call replaced."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict

from fsdp_lint.replay.recorders import Recorder
from fsdp_lint.replay.records import _MISSING


# the attribute that marks a module checkpoint-wrapped after the wrap call (the wrapper is its value)
CHECKPOINTED_AFTER_WRAP = "_fsdp_lint_checkpoint_wrapper"


def _undo_after_last_wrap(rec: Recorder) -> None:
    """Put back the sub-modules and parameters that code after the last wrap call replaced."""
    for kind, owner, name, old, child, old_parent in reversed(rec.undo):
        if kind == "module" and old is not _MISSING and old is not None and \
                getattr(child, "_checkpoint_wrapped_module", None) is old:
            # activation checkpointing applied after the wrap (Lightning's activation_checkpointing_policy,
            # accelerate's fsdp_activation_checkpointing): the module stays as wrapped, and its forward
            # runs under the wrapper's checkpoint when the forward is traced (plan.trace)
            old.__dict__[CHECKPOINTED_AFTER_WRAP] = child
        table = owner._modules if kind == "module" else owner._parameters
        if old is _MISSING:
            table.pop(name, None)
        else:
            table[name] = old
        if kind == "module" and child is not None:
            if old_parent is _MISSING:
                rec.parents.pop(id(child), None)
            else:
                rec.parents[id(child)] = old_parent
    rec.undo.clear()


def _root_of(rec: Recorder):
    """The top ancestor of the wrapped modules (the model the file builds)."""
    tops: Dict[int, Any] = {}       # a wrap call per level of a deep model: each path walked once
    last_root = rec.wrap_calls[-1].modules[0] if rec.wrap_calls and rec.wrap_calls[-1].modules else None
    built = {}

    def _adopted(parent, child) -> bool:
        """`parent` was built after `child`: it took an existing module (a wrapper), it did not build it."""
        if not built:
            built.update({id(mod): i for i, (mod, _) in enumerate(rec.constructed)})
        return built.get(id(parent), -1) > built.get(id(child), -1) >= 0

    def top(m):
        path, seen = [], set()
        while id(m) not in tops and id(m) in rec.parents and id(m) not in seen:
            seen.add(id(m))
            path.append(id(m))
            parent = rec.parents[id(m)]
            if getattr(parent, "_orig_mod", None) is m:
                break       # `torch.compile(model)` holds the model; the model is still the root FSDP wraps
            if m is last_root and not rec.real and getattr(parent, "_fsdp_wrapped_module", None) is not m \
                    and _adopted(parent, m) and (not _held(parent, rec) or _adds_no_parameters(parent, m)):
                break       # a wrapper built around the model that nothing holds any more (PEFT's
                            # inject_adapter_in_model makes a LoraModel(model) and returns the model), or one
                            # that holds nothing to shard beside it (open_clip's Task: the model and its loss)
            m = parent
        found = tops.get(id(m), m)
        for key in path:
            tops[key] = found
        return found

    last = rec.wrap_calls[-1]
    candidates = []
    for call in rec.wrap_calls:
        for m in call.modules:
            candidates.append(top(m))
    # the root that contains the most wrapped modules, preferring the last call's
    best = top(last.modules[0])
    counts: Dict[int, int] = {}
    for c in candidates:
        counts[id(c)] = counts.get(id(c), 0) + 1
    most = max(counts.values())
    if counts.get(id(best), 0) * 2 < len(candidates) and counts.get(id(best), 0) < most:
        # (a tie keeps the last call's: a T5 encoder, then two DiTs each wrapped once -- the DiTs are the job)
        best = max(candidates, key=lambda c: counts[id(c)])
    trained = _trained_root(rec, candidates, best)
    return trained if trained is not None else best


def note_other_models(rec: Recorder, root, shown) -> None:
    """A note (in the framework notes) naming the other models the setup wrapped (an RL job's critic and
    reference policy beside its actor, a teacher beside a student): the plan is one model's."""
    def top(m):
        seen = set()
        while id(m) in rec.parents and id(m) not in seen:
            seen.add(id(m))
            m = rec.parents[id(m)]
        return m

    others: Dict[int, Any] = {}
    for call in rec.wrap_calls:
        for m in call.modules[:1]:
            t = top(m)
            if t is not root and m is not root and not _within(m, root) and id(t) not in others:
                others[id(t)] = (t, call.pos)
    if others:
        names = "; ".join(f"{type(t).__name__} at {shown(pos.path)}:{pos.line}" for t, pos in others.values())
        rec.__dict__.setdefault("framework_notes", []).append(
            f"the setup wrapped {len(others) + 1} models: the plan shows {type(root).__name__}'s (the last wrapped one "
            f"an optimizer trains); also wrapped: {names}")


def _within(module, root) -> bool:
    import torch

    with torch._C.DisableTorchFunction():
        return any(m is module for m in root.modules())


def _adds_no_parameters(parent, child) -> bool:
    """`parent` holds no parameter that `child` does not: the module FSDP shards is `child`."""
    import torch

    with torch._C.DisableTorchFunction():
        mine = {id(p) for p in child.parameters()}
        return all(id(p) in mine for p in parent.parameters())


def _held(obj, rec: Recorder) -> bool:
    """Whether anything but fsdp-lint's own records of the replay refers to `obj` (the script, a module)."""
    import gc

    own = {id(rec.parents), id(rec.modules_seen), id(rec.constructed), id(rec.undo), id(rec.__dict__)}
    for ref in gc.get_referrers(obj):
        if id(ref) in own or type(ref).__name__ == "frame":
            continue
        if isinstance(ref, tuple) and ref and ref[0] is obj and any(ref is c for c in rec.constructed):
            continue        # (module, where it was built)
        if isinstance(ref, tuple) and any(ref is u for u in rec.undo):
            continue
        return True
    return False


def _trained_root(rec: Recorder, candidates, last=None):
    """Of several wrapped models (a frozen text encoder, the model, its EMA copy), the one the
    optimizer trains: the model the job is about. None without an optimizer over any of them. Where
    several are trained (an RL job's actor and critic), the last wrapped of them (`last`): the policy."""
    opt_ids = getattr(rec, "optimizer_param_ids", None)
    if not opt_ids or len({id(c) for c in candidates}) < 2:
        return None
    owned = {}
    for c in candidates:
        if id(c) not in owned:
            owned[id(c)] = (sum(1 for p in c.parameters() if id(p) in opt_ids), c)
    if last is not None and owned.get(id(last), (0, None))[0]:
        return last
    count, root = max(owned.values(), key=lambda t: t[0])
    return root if count else None


@contextlib.contextmanager
def checkpointed_after_wrap(model):
    """The modules the setup code checkpoint-wrapped after its wrap call (Lightning's
    ``activation_checkpointing_policy``, accelerate's ``fsdp_activation_checkpointing``; the plan keeps
    the model as it was wrapped, ``_undo_after_last_wrap``): their forward runs as the wrapper runs it,
    under its ``checkpoint_fn`` (``torch.utils.checkpoint``); undone afterwards."""
    patched = []
    for m in model.modules():
        wrapper = m.__dict__.get(CHECKPOINTED_AFTER_WRAP)
        fn = getattr(wrapper, "checkpoint_fn", None)
        if fn is None or "forward" in m.__dict__:
            continue
        m.forward = functools.partial(fn, type(m).forward.__get__(m))
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
