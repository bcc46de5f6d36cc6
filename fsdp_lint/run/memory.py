"""Tensor memory of a training step, by category, as torch's own trackers measure it.

FSDP2: ``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``). FSDP1 and plain models:
``MemTracker`` (``torch.distributed._tools.mem_tracker``) with FSDP1's buffers labelled the way
``FSDPMemTracker`` labels FSDP2's, because ``MemTracker`` alone puts the sharded FlatParameter, its
low-precision copy and its unsharded all-gather output in one "Parameter" category and fails on
``use_orig_params=True`` (it hooks gradients of the original parameters, which are views there).

Both also record where the peak happens: the innermost module running, the phase (forward,
backward, optimizer step) and the step. Works on real tensors (``--run`` on CPU) and under
``FakeTensorMode`` (``--simulate``), where nothing is allocated.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional

# the categories, in the order reports list them (FSDPMemTracker's _FSDPRefType names -> ours)
CATEGORIES = {
    "Sharded Param": "sharded_params",
    "Unsharded Param": "unsharded_params",
    "All Gather": "all_gather_buffers",
    "Sharded Grad": "sharded_grads",
    "Unsharded Grad": "unsharded_grads",
    "Reduce Scatter": "reduce_scatter_buffers",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Inputs": "inputs",
    "Buffer": "buffers",
}
# the step whose peak is reported: the second, once the optimizer state exists (the steady state)
STEADY_STEP = 2
_WRAPPER_PIECES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def _peak_recorder(base):
    """`base` (a tracker class) that also records where its peak happened."""

    class PeakAt(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.step = 0
            self.peak_at = None
            self.timeline: List[tuple] = []
            self._last_sample = None

        def _update_peak_stats(self, peak_state) -> None:
            before = sum(self._peak_mem.values())
            super()._update_peak_stats(peak_state)
            if sum(self._peak_mem.values()) > before:
                self.peak_at = (frozenset(self._mod_tracker.parents), bool(self._mod_tracker.is_bw),
                                bool(self._in_opt), self.step)
            self._sample()

        def _sample(self) -> None:
            """A point of the memory-over-the-step curve: kept when the total moved by 1 % of the
            peak so far, or the running module or phase changed."""
            total = sum(d.get("Total", 0) for d in self._curr_mem_snap.values())
            where = (self.step, bool(self._mod_tracker.is_bw), bool(self._in_opt),
                     _deepest(self._mod_tracker.parents))
            peak = max(1, sum(self._peak_mem.values()))
            last = self._last_sample
            if last is not None and last[1] == where and abs(total - last[0]) < peak / 100:
                return
            self._last_sample = (total, where)
            per: Dict[str, int] = {}
            for dev_snap in self._curr_mem_snap.values():
                for key, value in dev_snap.items():
                    if key != "Total" and value:
                        name = _category(key)
                        per[name] = per.get(name, 0) + int(value)
            self.timeline.append((where, per))

    return PeakAt


def _fsdp1_tracker_class():
    """``MemTracker`` with FSDP1's FlatParameter buffers put in FSDPMemTracker's categories."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType as Ref
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils._pytree import tree_map_only

    from fsdp_lint.run.compat import untyped_storages

    c10d = torch.ops.c10d
    gathers = {getattr(c10d, n).default for n in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_")
               if hasattr(c10d, n)}
    scatters = {getattr(c10d, n).default for n in ("_reduce_scatter_base_",) if hasattr(c10d, n)}
    reduces = {getattr(c10d, n).default for n in ("allreduce_",) if hasattr(c10d, n)}

    class FSDP1MemTracker(MemTracker):
        def __init__(self, optimizers=()):
            super().__init__()
            self._ref_class = Ref
            self._optimizers = list(optimizers)
            self._patched = None

        def _label(self, t, ref, only_from=None) -> None:
            """Put `t`'s storage in `ref` (only when it is untracked or in one of `only_from`); `t`
            may be a (nested) list of tensors, as c10d's list collectives take them."""
            if isinstance(t, (list, tuple)):
                for x in t:
                    self._label(x, ref, only_from)
                return
            if not isinstance(t, torch.Tensor):
                return
            for st in untyped_storages()(t):
                winfo, _ = self._WINFO.get(st, (None, None))
                if winfo is not None and only_from is not None and winfo.reftype not in only_from:
                    continue
                self._update_and_maybe_create_winfos(t, ref)

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            # a FlatParameter is sharded when its unit's forward starts; the original parameters
            # are views of the gathered one (already labelled by the all-gather): never relabel
            for p in module.parameters():
                self._label(p, Ref.SHARDED_PARAM, only_from=())
            for b in module.buffers():
                self._label(b, Ref.BUFFER, only_from=())
            return 0, 0

        def _register_global_optimizer_hook(self) -> None:
            def pre(optimizer, args, kwargs):
                self._in_opt = True

            def post(optimizer, args, kwargs):
                for states in optimizer.state.values():
                    for val in states.values():
                        self._label(val, Ref.OPT)
                self._in_opt = False

            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            self._optimizer_hook_handles = (register_optimizer_step_pre_hook(pre),
                                            register_optimizer_step_post_hook(post))

        def track_inputs(self, inputs) -> None:
            tree_map_only(torch.Tensor, lambda t: self._label(t, Ref.INP), inputs)

        def __enter__(self):
            from torch.distributed.fsdp import _runtime_utils

            original = _runtime_utils._reduce_grad

            def reduce_grad(state, handle):
                flat = handle.flat_param
                self._label(flat.grad, Ref.UNSHARDED_GRAD, only_from=(Ref.TEMP, Ref.ACT))
                original(state, handle)
                self._label(flat.grad, Ref.SHARDED_GRAD, only_from=(Ref.TEMP, Ref.ACT, Ref.REDUCE_SCATTER))
                self._label(getattr(flat, "_saved_grad_shard", None), Ref.SHARDED_GRAD,
                            only_from=(Ref.TEMP, Ref.ACT, Ref.REDUCE_SCATTER))

            self._patched = (_runtime_utils, original)
            _runtime_utils._reduce_grad = reduce_grad
            return super().__enter__()

        def __exit__(self, *args):
            super().__exit__(*args)
            if self._depth == 0 and self._patched is not None:
                self._patched[0]._reduce_grad = self._patched[1]
                self._patched = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch._guards import active_fake_mode
            from torch.distributed._tools.mem_tracker import _ModState

            if func is torch.ops._c10d_functional.wait_tensor.default and active_fake_mode():
                res = args[0]
            else:
                res = func(*args, **(kwargs or {}))
            if active_fake_mode() is not self._fake_mode_on_entry:
                return res
            if self._in_opt:
                ref = Ref.OPT
            elif self._mod_tracker.is_bw and not self._in_ac:
                ref = Ref.TEMP
            else:
                ref = Ref.ACT
            if func in gathers:
                self._label(args[0], Ref.UNSHARDED_PARAM)
                self._label(args[1], Ref.ALL_GATHER, only_from=(Ref.ACT, Ref.TEMP))
            elif func in scatters:
                self._label(args[1], Ref.REDUCE_SCATTER, only_from=(Ref.ACT, Ref.TEMP, Ref.UNSHARDED_GRAD))
                self._label(args[0], Ref.SHARDED_GRAD, only_from=(Ref.ACT, Ref.TEMP))
            elif func in reduces:
                self._label(args[0], Ref.SHARDED_GRAD, only_from=(Ref.ACT, Ref.TEMP))
            tree_map_only(torch.Tensor, lambda t: self._track(ref, t), res)
            self._update_peak_stats(_ModState.PEAK_BW if self._mod_tracker.is_bw else _ModState.PEAK_FW)
            return res

    return FSDP1MemTracker


def _fsdp2_tracker_class():
    """``FSDPMemTracker`` that keeps FSDP2's group semantics. torch's tracker swaps every FSDP
    module's forward hooks for per-module ones; a ``fully_shard([a, b])`` group then reshards after
    each of its modules instead of after the last one -- more all-gathers than the plan issues, and
    a group that skips a module (a fused loss reading the head's weight) raises. Here a group keeps
    group hooks (``_register_group_forward_hooks``) around the tracker's wrappers, and its backward
    methods are wrapped once; single modules are instrumented exactly as torch does."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType, _SavedFSDPMethods
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

    class GroupAwareFSDPMemTracker(FSDPMemTracker):
        def _states(self):
            seen, out = set(), []
            for module in self._root_mod.modules():
                if isinstance(module, FSDPModule):
                    state = module._get_fsdp_state()
                    if id(state) not in seen and state._fsdp_param_group:
                        seen.add(id(state))
                        out.append((module, state))
            return out

        def _tracked(self, state):
            return next((m for m in state._modules if m in self.memory_tracking), state._modules[0])

        def _instrument_fsdp_module(self) -> None:
            for module, state in self._states():
                pg = state._fsdp_param_group
                state._pre_forward_hook_handle.remove()
                state._post_forward_hook_handle.remove()
                self._instrument_fsdp_sharded_params_grads(pg)
                if len(state._modules) == 1:
                    state._pre_forward_hook_handle = module.register_forward_pre_hook(
                        self._fsdp_state_pre_forward(module, state._pre_forward), prepend=True, with_kwargs=True)
                    state._post_forward_hook_handle = module.register_forward_hook(
                        self._fsdp_state_post_forward(module, state._post_forward), prepend=False, always_call=True)
                    pre_bw = self._fsdp_param_group_pre_backward(module, pg.pre_backward)
                    post_bw = self._fsdp_param_group_post_backward(module, pg.post_backward)
                else:
                    def pre(mod, args, kwargs, _state=state):
                        return self._fsdp_state_pre_forward(mod, _state._pre_forward)(mod, args, kwargs)

                    def post(mod, args, output, _state=state):
                        return self._fsdp_state_post_forward(mod, _state._post_forward)(mod, args, output)

                    handle = _register_group_forward_hooks(state._modules, pre, post, state._modules_to_run_forward,
                                                           state._cast_output_dtype)
                    state._pre_forward_hook_handle = state._post_forward_hook_handle = handle

                    def pre_bw(*args, _state=state, _orig=pg.pre_backward, **kwargs):
                        return self._fsdp_param_group_pre_backward(self._tracked(_state), _orig)(*args, **kwargs)

                    def post_bw(*args, _state=state, _orig=pg.post_backward, **kwargs):
                        return self._fsdp_param_group_post_backward(self._tracked(_state), _orig)(*args, **kwargs)
                self._fsdp_mod_to_saved_methods[module] = _SavedFSDPMethods(pg.pre_backward, pg.post_backward)
                pg.pre_backward, pg.post_backward = pre_bw, post_bw
            for buffer in self._root_mod.buffers():
                self._update_and_maybe_create_winfos(buffer, _FSDPRefType.BUFFER)

        def _deregister_module_and_optimizer_hooks(self) -> None:
            for module, saved in self._fsdp_mod_to_saved_methods.items():
                state = module._get_fsdp_state()
                state._pre_forward_hook_handle.remove()
                state._post_forward_hook_handle.remove()
                if len(state._modules) == 1:       # as FSDPState.init registers them
                    state._pre_forward_hook_handle = module.register_forward_pre_hook(
                        state._pre_forward, prepend=True, with_kwargs=True)
                    state._post_forward_hook_handle = module.register_forward_hook(state._post_forward, prepend=False)
                else:
                    handle = _register_group_forward_hooks(state._modules, state._pre_forward, state._post_forward,
                                                           state._modules_to_run_forward, state._cast_output_dtype)
                    state._pre_forward_hook_handle = state._post_forward_hook_handle = handle
                pg = state._fsdp_param_group
                pg.pre_backward, pg.post_backward = saved.pre_backward, saved.post_backward
            self._fsdp_mod_to_saved_methods.clear()
            if self._optimizer_hook_handles is not None:
                for handle in self._optimizer_hook_handles:
                    handle.remove()
                self._optimizer_hook_handles = None

    return GroupAwareFSDPMemTracker


class StepMemory:
    """Track the tensor memory of the training steps run inside ``with StepMemory(model, opts):``.

    ``step(n)`` before each step; ``result()`` after: peak bytes, the breakdown at the peak and
    where it happened. ``measure`` names the tracker."""

    def __init__(self, model, optimizers):
        from torch.distributed.fsdp import FSDPModule

        self.model = model
        self.optimizers = list(optimizers or [])
        self.kind = "fsdp2" if isinstance(model, FSDPModule) else "fsdp1" if _is_fsdp1(model) else "plain"
        if self.kind == "fsdp2":
            # FSDPMemTracker tracks one optimizer (the first)
            self.tracker = _peak_recorder(_fsdp2_tracker_class())(model, self.optimizers[0] if self.optimizers else None)
            self.measure = "FSDPMemTracker"
        else:
            self.tracker = _peak_recorder(_fsdp1_tracker_class())(self.optimizers)
            self.measure = "MemTracker (FSDP1 buffers labelled)" if self.kind == "fsdp1" else "MemTracker"
            self.tracker.track_external(model)
        self._stack = contextlib.ExitStack()
        self.first_step_peak_bytes: Optional[int] = None

    def track_inputs(self, args, kwargs) -> None:
        self.tracker.track_inputs((tuple(args), dict(kwargs)))

    def step(self, n: int) -> None:
        if n == STEADY_STEP and n > 1:
            # the steady step's own peak: under fake tensors the first optimizer.step() counts more
            # than real tensors hold (the state's lazy initialisation), so step 1's peak is kept apart
            t = self.tracker
            self.first_step_peak_bytes = sum(t._peak_mem.values())
            t._peak_mem = {dev: 0 for dev in t._peak_mem}
            t._peak_mem_snap = {}
            t.peak_at = None
        self.tracker.step = n
        self.tracker.reset_mod_stats()       # torch's trackers refuse a second forward otherwise

    def __enter__(self) -> "StepMemory":
        self._stack.enter_context(self.tracker)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def result(self) -> Dict[str, Any]:
        snap = self.tracker.get_tracker_snapshot("peak")
        breakdown = {name: 0 for name in CATEGORIES.values()}
        peak = 0
        for dev_snap in snap.values():
            for key, value in dev_snap.items():
                if key == "Total":
                    peak += int(value)
                    continue
                name = _category(key)
                breakdown[name] = breakdown.get(name, 0) + int(value)
        return {"peak_bytes": peak, "breakdown": breakdown, "peak_at": _where(self.tracker.peak_at),
                "measure": self.measure, "timeline": _timeline(self.tracker.timeline),
                "peak_step": STEADY_STEP if self.first_step_peak_bytes is not None else 1,
                "first_step_peak_bytes": self.first_step_peak_bytes}


def _category(key) -> str:
    value = getattr(key, "value", str(key))
    return CATEGORIES.get(value) or str(value).lower().replace(" ", "_")


def _deepest(parents) -> str:
    """The innermost running module, as an FQN of the unwrapped model ("" = the root)."""
    names = [p for p in parents if p != "Global"]
    deepest = max(names, key=lambda n: (n.count("."), n), default="")
    return ".".join(p for p in deepest.split(".")[1:] if p not in _WRAPPER_PIECES)


def _phase(is_bw: bool, in_opt: bool) -> str:
    return "optimizer step" if in_opt else "backward" if is_bw else "forward"


def _is_fsdp1(model) -> bool:
    return any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules())


def _where(raw) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    parents, is_bw, in_opt, step = raw
    return {"module": _deepest(parents), "phase": _phase(is_bw, in_opt), "step": step}


def _timeline(points, limit: int = 400) -> List[Dict[str, Any]]:
    """The sampled curve, at most `limit` points (local extremes kept when thinning)."""
    if len(points) > limit:
        totals = [sum(per.values()) for _, per in points]
        keep = {0, len(points) - 1, max(range(len(points)), key=totals.__getitem__)}
        stride = len(points) / (limit - len(keep))
        keep |= {int(i * stride) for i in range(limit - len(keep))}
        points = [points[i] for i in sorted(keep)]
    return [{"step": step, "phase": _phase(is_bw, in_opt), "module": module, "bytes": per}
            for (step, is_bw, in_opt, module), per in points]
