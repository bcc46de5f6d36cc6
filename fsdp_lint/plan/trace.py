"""`trace`: one forward (and the loss) of the unwrapped model on fake CPU tensors, watched.

The replay's meta model runs under ``FakeTensorMode`` with fake CPU stand-ins for its parameters and
buffers (``torch.func.functional_call``: the model itself is not changed; CPU, not meta, so torch picks
the kernels -- and the saved tensors -- of a real device, e.g. fused attention), on the same synthetic
inputs as ``--run``/``--simulate`` (``example_inputs()``, ``--input-shape``, or inferred from the first
layer), with the units' mixed-precision ``param_dtype`` applied as FSDP applies it (parameters and
floating inputs of every unit cast). Nothing is allocated. It records, as plain data:

* activations: the tensors autograd saves for backward (torch's saved-tensor hooks), each storage
  once, parameters and buffers excluded, per unit (the innermost unit running when it was saved),
  and the outputs that are alive at the start of backward;
* for every unit, whether its forward output requires grad: FSDP gathers a unit again in backward
  only then (a frozen unit early in the model is not);
* which module and which unit run whenever a parameter is read (passed to a torch function), so a
  parameter read while its own unit holds it sharded -- a head tied through a plain Python
  attribute, a fused loss reading ``lm_head.weight`` -- is found before FSDP raises on it.

A model whose forward cannot run here (data-dependent Python control flow, ``.item()``) gives a
trace with ``error`` set and nothing else: every consumer treats the trace as optional.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from fsdp_lint.process.alarm import alarm


@dataclass
class ParamRead:
    fqn: str                      # canonical FQN of the parameter read
    owner: str                    # module of the unit that owns it
    module: str                   # innermost module running when it was read ("" = the root's own code)
    unit: Optional[str]           # module of the innermost unit running then (None: outside every unit)
    phase: str                    # "forward" or "loss"
    owner_ran: bool = False       # the owner's forward had run (and resharded) before the read
    path: Optional[str] = None    # where the model's code read it (innermost frame outside torch)
    line: int = 0
    function: str = ""


@dataclass
class Segment:
    """Saved tensors of one stretch of the forward: the innermost unit running (None: outside every
    unit), the bytes kept from forward to backward and the largest of them, and -- for a region of
    activation checkpointing -- what its backward recomputes (freed once the region's backward ends)."""
    unit: Optional[int]
    saved_bytes: int = 0
    largest_bytes: int = 0
    checkpointed: bool = False
    recompute_bytes: int = 0
    recompute_largest_bytes: int = 0


@dataclass
class Trace:
    inputs: str = ""                                   # how the inputs were made
    input_shapes: List[List[int]] = field(default_factory=list)
    inferred: bool = False                             # inputs inferred from the first layer
    saved_bytes: int = 0                               # activations saved for backward
    output_bytes: int = 0                              # outputs alive at the start of backward, not saved
    largest_saved_bytes: int = 0
    input_bytes: int = 0
    unit_saved_bytes: List[int] = field(default_factory=list)        # per plan unit
    unit_output_requires_grad: List[Optional[bool]] = field(default_factory=list)   # None: never ran
    unit_forward_calls: List[int] = field(default_factory=list)     # per unit: forwards entered from outside it
    unit_order: List[int] = field(default_factory=list)             # plan unit indices, forward order
    unit_post_order: List[int] = field(default_factory=list)        # the order their forwards return (FSDP's
                                                                    # post-forward order: backward prefetch)
    readers: Dict[str, Set[str]] = field(default_factory=dict)      # param FQN -> modules that read it
    sharded_reads: List[ParamRead] = field(default_factory=list)    # reads of a parameter its unit holds sharded
    # the saved tensors in forward order, one segment per run of the same innermost unit (and region of
    # activation checkpointing): backward frees them in reverse order, a checkpointed region's
    # recomputed tensors live only while its backward runs
    segments: List["Segment"] = field(default_factory=list)
    checkpointed: int = 0                              # activation-checkpointed regions the forward ran
    loss_grad_bytes: int = 0                           # the gradient of the logits backward starts with
    error: Optional[str] = None

    @property
    def activation_bytes(self) -> int:
        return self.saved_bytes + self.output_bytes

    def reads_outside(self, tree, module: str) -> List[Tuple[str, str]]:
        """(parameter, reader module) pairs: parameters under `module` that the forward read from
        outside `module`'s subtree ("" = the root module's own code). A unit of its own for
        `module` would hold them sharded there."""
        if self.error or not module:
            return []
        out = []
        for fqn in tree.params_under(module):
            for reader in sorted(self.readers.get(fqn, ())):
                if reader != module and not tree.is_ancestor(module, reader):
                    out.append((fqn, reader))
        return out


def trace_forward(model, tree, plan, input_shape=None, input_dtype=None, example_fn=None,
                  timeout: Optional[float] = None, activations: bool = True) -> Trace:
    """Run the forward (and loss) of `model` (the replay's meta model, unwrapped) once; see the
    module docstring. Without `activations` (nobody reads them: the input shape is unknown) it runs
    on meta, several times faster on large models: parameter reads, the units autograd reaches
    and their forward order are the same, the saved tensors not (no device kernels, no mixed
    precision). Never raises for what the model does."""
    out = Trace()
    try:
        from fsdp_lint.replay.model_root import checkpointed_after_wrap

        with _quiet(), alarm(timeout, _TraceTimeout), _rank0_env(plan.world_size), checkpointed_after_wrap(model):
            _trace(model, tree, plan, input_shape, input_dtype, example_fn, out, activations)
    except _TraceTimeout:
        out.error = f"the forward took longer than {timeout:g} s"
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the model's own code failed here (or exited): no trace
        text = " ".join(str(exc).split())
        out.error = f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
    return out


def _trace(model, tree, plan, input_shape, input_dtype, example_fn, out: Trace, activations: bool) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fsdp_lint.model.inputs import loss_of, make_inputs
    from fsdp_lint.replay.dynamo import skip_dynamo_import

    skip_dynamo_import()     # the meta decompositions' wrappers made since the replay started (its imports)

    cpu = torch.device("cpu" if activations else "meta")
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if activations else contextlib.nullcontext()
    modules = dict(model.named_modules(remove_duplicate=False))
    name_of: Dict[int, str] = {}
    for name, m in modules.items():
        name_of.setdefault(id(m), name)
    unit_of_module: Dict[int, int] = {}
    for i, unit in enumerate(plan.units):
        for fqn in unit.modules:
            m = modules.get(fqn)
            if m is not None:
                unit_of_module.setdefault(id(m), i)
    owner: Dict[str, int] = {}
    dtype_of: Dict[str, str] = {}
    for i, unit in enumerate(plan.units):
        for fqn in unit.params:
            owner.setdefault(fqn, i)
            if unit.param_dtype:
                dtype_of.setdefault(fqn, unit.param_dtype)
    # FSDP1 computes with views of the unit's FlatParameter, which requires grad when any of its
    # parameters does: frozen parameters of a mixed unit (use_orig_params=True) carry gradients too
    flat_grad = set()
    if plan.api == "fsdp1":
        for unit in plan.units:
            if any(tree.params[p].requires_grad for p in unit.params):
                flat_grad |= set(unit.params)
    from fsdp_lint.plan.layout import runs_as_root

    keeps_gathered = [runs_as_root(u, plan, tree) and not u.reshard_after_forward_explicit
                      or not u.reshard_after_forward for u in plan.units]

    with fake_mode, _on_device(cpu):
        # fake stand-ins: one per tensor (tied names share it), in the unit's param_dtype
        stand_in: Dict[int, Any] = {}
        param_fqn: Dict[int, str] = {}
        state: Dict[str, Any] = {}
        for name, p in torch.nn.Module.named_parameters(model, remove_duplicate=False):     # (an override: tree.py)
            if id(p) not in stand_in:
                fqn = tree.alias_to_canonical.get(name, name)
                dtype = p.dtype
                if fqn in dtype_of and p.is_floating_point() and activations:
                    dtype = getattr(torch, dtype_of[fqn])
                fake = torch.nn.Parameter(torch.empty(p.shape, dtype=dtype, device=cpu),
                                          requires_grad=p.requires_grad or fqn in flat_grad)
                stand_in[id(p)] = fake
                param_fqn[id(fake)] = fqn
            state[name] = stand_in[id(p)]
        for name, b in torch.nn.Module.named_buffers(model, remove_duplicate=False):
            if id(b) not in stand_in:
                stand_in[id(b)] = torch.empty(b.shape, dtype=b.dtype, device=cpu)
            state[name] = stand_in[id(b)]
        static_storages = {_storage_key(t) for t in stand_in.values()}
        spec = {"params": list(tree.params), "input_shape": input_shape, "input_dtype": input_dtype}
        args, kwargs, how = make_inputs(spec, model, cpu, 0, 1, example_fn)
        out.inputs = how
        out.inferred = example_fn is None and not input_shape
        flat_inputs = [t for t in _tensors((args, kwargs))]
        out.input_shapes = [list(t.shape) for t in flat_inputs]
        out.input_bytes = sum(_nbytes(t) for t in {id(t): t for t in flat_inputs}.values())

        n = len(plan.units)
        out.unit_saved_bytes = [0] * n
        out.unit_output_requires_grad = [None] * n
        out.unit_forward_calls = [0] * n
        module_stack: List[str] = []
        unit_stack: List[int] = []
        ran: Set[int] = set()
        phase = {"now": "forward"}
        region = {"depth": 0, "seen": set(), "alive": [], "measuring": False}   # inside activation checkpointing
        # a unit's pass: it is gathered at the first of its modules' forwards and resharded once all
        # of them have run (FSDP2 groups; torch completes a group that skips a module at the end of
        # the root's forward); a single-module unit's pass is its forward
        pending: Dict[int, Set[int]] = {}
        module_ids = [set(id(modules[m]) for m in u.modules if m in modules) for u in plan.units]

        def pre(mod, inputs, kw):
            module_stack.append(name_of.get(id(mod), "?"))
            u = unit_of_module.get(id(mod))
            if u is not None and region["measuring"]:
                unit_stack.append(u)
            elif u is not None:
                if not pending.get(u):      # a new pass: FSDP gathers the unit (again)
                    out.unit_forward_calls[u] += 1
                    pending[u] = set(module_ids[u])
                unit_stack.append(u)
                if u not in ran:
                    out.unit_order.append(u)
                ran.add(u)
                dtype = plan.units[u].param_dtype if activations else None
                if dtype:   # FSDP casts a unit's floating inputs to its param_dtype (mixed precision)
                    cast = _cast_floating(getattr(torch, dtype))
                    return tuple(cast(a) for a in inputs), {k: cast(v) for k, v in kw.items()}
            return None

        def post(mod, inputs, kw, output):
            if module_stack:
                module_stack.pop()
            u = unit_of_module.get(id(mod))
            if u is not None and region["measuring"]:
                if unit_stack:
                    unit_stack.pop()
            elif u is not None:
                if unit_stack:
                    unit_stack.pop()
                pending.get(u, set()).discard(id(mod))
                rg = any(t.requires_grad for t in _tensors(output)) or _in_reentrant_checkpoint_with_grad()
                out.unit_output_requires_grad[u] = bool(out.unit_output_requires_grad[u]) or rg
                if u not in out.unit_post_order:
                    out.unit_post_order.append(u)
            return None

        def on_read(p) -> None:
            fqn = param_fqn.get(id(p))
            if fqn is None or region["measuring"]:
                return
            reader = module_stack[-1] if module_stack else ""
            out.readers.setdefault(fqn, set()).add(reader)
            u = owner.get(fqn)
            if u is None or pending.get(u) or (u in ran and keeps_gathered[u]):
                return
            if any((r.fqn, r.module) == (fqn, reader) for r in out.sharded_reads):
                return
            active = unit_stack[-1] if unit_stack else None
            out.sharded_reads.append(ParamRead(fqn, plan.units[u].module, reader,
                                               plan.units[active].module if active is not None else None,
                                               phase["now"], u in ran, *_user_frame()))

        saved: Dict[Any, int] = {}

        def segment(checkpointed: bool) -> Segment:
            u = unit_stack[-1] if unit_stack else None
            last = out.segments[-1] if out.segments else None
            if last is None or last.unit != u or last.checkpointed != checkpointed:
                last = Segment(u, checkpointed=checkpointed)
                out.segments.append(last)
            return last

        def keep(t) -> None:
            key = _storage_key(t)
            if key not in static_storages and key not in saved:
                size = _nbytes_storage(t)
                saved[key] = size
                if unit_stack:
                    out.unit_saved_bytes[unit_stack[-1]] += size
                seg = segment(region["depth"] > 0)
                seg.saved_bytes += size
                seg.largest_bytes = max(seg.largest_bytes, size)

        def pack(t):
            keep(t)
            return t

        def recomputed(t) -> None:
            key = _storage_key(t)
            if key not in static_storages and key not in saved and key not in region["seen"]:
                region["seen"].add(key)
                region["alive"].append(t)   # held while the region runs: a freed storage's key is reused
                size = _nbytes_storage(t)
                seg = segment(True)
                seg.recompute_bytes += size
                seg.recompute_largest_bytes = max(seg.recompute_largest_bytes, size)

        handles = []
        try:
            for m in modules.values():
                handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))
            with torch.enable_grad(), _on_device(cpu, on_read, plan.api == "fsdp2"), \
                    _watch_checkpointing(region, keep, recomputed, out), \
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                output = torch.func.functional_call(model, state, tuple(args), dict(kwargs), tie_weights=True,
                                                    strict=False)
                phase["now"] = "loss"
                loss = loss_of(output)
        finally:
            for h in handles:
                h.remove()
        out.saved_bytes = sum(saved.values())
        out.largest_saved_bytes = max(saved.values(), default=0)
        alive = {}
        for t in _tensors(output):
            key = _storage_key(t)
            if key not in saved and key not in static_storages:
                alive[key] = _nbytes_storage(t)
        if loss is not None:
            alive.setdefault(_storage_key(loss), _nbytes_storage(loss))
        out.output_bytes = sum(alive.values())
        logits = _loss_input(output)
        if logits is not None and loss is not None:
            # backward starts with the loss's gradient of the logits: float32 (the loss upcasts them),
            # and once more in their own dtype when that is lower
            numel = int(logits.numel())
            out.loss_grad_bytes = numel * 4 + (_nbytes(logits) if logits.dtype != torch.float32 else 0)


@contextlib.contextmanager
def _watch_checkpointing(region, keep, recomputed, out: Trace):
    """While the forward runs, ``torch.utils.checkpoint`` (what ``checkpoint_wrapper``,
    ``apply_activation_checkpointing``, HF's ``gradient_checkpointing_enable()``, Lightning's
    ``activation_checkpointing_policy`` and accelerate's ``fsdp_activation_checkpointing`` all call)
    tells what it keeps and what its backward recomputes. Non-reentrant: its saved-tensor hook
    replaces ours inside the region, so the tensors it would have saved are the recomputed ones, and
    the region's inputs (held by the checkpoint for the recomputation) are kept; a selective policy's
    saved op outputs (``create_selective_checkpoint_contexts``) are kept too. Reentrant: the region
    runs under ``no_grad`` and saves only its inputs; it is run once more here with grad, watched,
    to learn what its backward recomputes. Looked up at call time, so partials bound before the
    trace (a wrapper's ``checkpoint_fn``) are seen too."""
    import torch
    import torch.utils.checkpoint as cp

    originals = {name: getattr(cp, name, None) for name in
                 ("_checkpoint_hook", "_checkpoint_without_reentrant_generator", "CheckpointFunction")}
    caching = getattr(cp, "_CachingTorchDispatchMode", None)
    caching_init = caching.__init__ if caching is not None else None
    sac_storages: List[Any] = []

    if originals["_checkpoint_hook"] is not None:
        base_hook = originals["_checkpoint_hook"]

        class _WatchedHook(base_hook):
            def __init__(self, frame):
                super().__init__(frame)
                inner = self.pack_hook

                def pack_hook(x):
                    recomputed(x)
                    return inner(x)
                self.pack_hook = pack_hook
        cp._checkpoint_hook = _WatchedHook
    if originals["_checkpoint_without_reentrant_generator"] is not None:
        base_gen = originals["_checkpoint_without_reentrant_generator"]

        def generator(fn, preserve, context_fn, determinism_check, debug, *args, **kwargs):
            out.checkpointed += 1
            for t in _tensors((args, kwargs)):
                keep(t)                     # the checkpoint holds its inputs until the recomputation
            first = len(sac_storages)
            region["depth"] += 1
            try:
                yield from base_gen(fn, preserve, context_fn, determinism_check, debug, *args, **kwargs)
            finally:
                region["depth"] -= 1
                if not region["depth"]:
                    region["seen"].clear()
                    region["alive"].clear()
            for storage in sac_storages[first:]:       # selective: the op outputs the policy saves
                for per_op in list(storage.values()):
                    for entry in (per_op.values() if isinstance(per_op, dict) else per_op):
                        for leaf in (entry if isinstance(entry, (list, tuple)) else (entry,)):
                            for t in _tensors(getattr(leaf, "val", leaf)):
                                keep(t)
        cp._checkpoint_without_reentrant_generator = generator
    if caching_init is not None:
        def init(self, policy_fn, storage, *args, **kwargs):
            sac_storages.append(storage)
            caching_init(self, policy_fn, storage, *args, **kwargs)
        caching.__init__ = init
    if originals["CheckpointFunction"] is not None:
        base_fn = originals["CheckpointFunction"]

        class _WatchedFunction:
            @staticmethod
            def apply(function, preserve, *args):
                out.checkpointed += 1
                detached = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                            for a in args]
                region["depth"] += 1
                region["measuring"] = True      # a second run of the region: not a forward of its units
                try:
                    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                            lambda t: (recomputed(t), t)[1], lambda t: t):
                        function(*detached)
                finally:
                    region["depth"] -= 1
                    region["measuring"] = False
                    if not region["depth"]:
                        region["seen"].clear()
                        region["alive"].clear()
                return base_fn.apply(function, preserve, *args)
        cp.CheckpointFunction = _WatchedFunction
    try:
        yield
    finally:
        for name, value in originals.items():
            if value is not None:
                setattr(cp, name, value)
        if caching_init is not None:
            caching.__init__ = caching_init


def _user_frame() -> Tuple[Optional[str], int, str]:
    """(path, line, function) of the innermost frame that is the model's code, not torch's or ours."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not name.startswith("<") and not any(s in name for s in ("/torch/", "/fsdp_lint/", "/site-packages/",
                                                                      "/dist-packages/", "/lib/python3")):
            return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None, 0, ""


def _loss_input(output):
    """The tensor the loss is computed from (``model.inputs.loss_of``'s choice, the model's own loss
    aside): the logits, or the first floating output."""
    import torch

    if hasattr(output, "logits") and isinstance(getattr(output, "logits"), torch.Tensor):
        output = output.logits
    elif isinstance(output, dict):
        output = output.get("logits", next((v for v in output.values() if isinstance(v, torch.Tensor)), None))
    elif isinstance(output, (tuple, list)):
        output = next((v for v in output if isinstance(v, torch.Tensor)), None)
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


def _cast_floating(dtype):
    import torch

    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x

    return cast


@contextlib.contextmanager
def _on_device(device, on_read=None, shape_kept: bool = False):
    """Everything the forward creates is on `device` (a ``device=`` given by the model's code too,
    as in the replay: ``"cuda"`` becomes the fake CPU); `on_read(param)` for every parameter passed
    to a torch function, except reads of its metadata only (its shape too where `shape_kept`: FSDP2)."""
    import torch
    from torch.overrides import TorchFunctionMode

    param_cls = torch.nn.Parameter

    class OnDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if on_read is not None and not _reads_metadata_only(func, shape_kept):
                for a in args:
                    if isinstance(a, param_cls):
                        on_read(a)
                    elif isinstance(a, (list, tuple)):
                        for b in a:
                            if isinstance(b, param_cls):
                                on_read(b)
                for v in kwargs.values():
                    if isinstance(v, param_cls):
                        on_read(v)
            if kwargs.get("device") is not None:
                kwargs["device"] = device
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.to:
                dtype = next((a for a in list(args[1:]) + list(kwargs.values()) if isinstance(a, torch.dtype)), None)
                return args[0] if dtype is None else func(args[0], dtype=dtype)
            return func(*args, **kwargs)

    with OnDevice():
        yield


# what a sharded parameter answers as its unsharded self does: dtype, device and requires_grad (FSDP1's
# sharded views and FSDP2's DTensor alike); FSDP2's DTensor keeps the global shape too (FSDP1's views
# outside the unit's forward are flat shard slices). The PEFT LoRA layer reads `lora_A.weight.dtype`
# before calling `lora_A`: not a read of its data
_METADATA = frozenset({"dtype", "device", "requires_grad", "is_leaf", "layout", "is_cuda", "is_meta", "is_cpu",
                       "is_sparse", "is_quantized", "element_size", "is_floating_point", "is_complex",
                       "get_device"})
_SHAPE = frozenset({"shape", "ndim", "names", "size", "dim", "ndimension", "numel", "nelement"})


def _reads_metadata_only(func, shape_kept: bool) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":       # an attribute of the tensor: its getset descriptor
        name = getattr(getattr(func, "__self__", None), "__name__", None)
    elif "TensorBase" not in getattr(func, "__qualname__", ""):
        return False
    return name in _METADATA or (shape_kept and name in _SHAPE)


def _tensors(obj, depth: int = 0):
    import torch

    if depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict) or hasattr(obj, "items") and callable(obj.items):
        try:
            items = list(obj.items())
        except Exception:  # noqa: BLE001
            return
        for _, v in items:
            yield from _tensors(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


def _storage_key(t) -> Tuple[int, int]:
    try:
        return ("s", t.untyped_storage()._cdata)
    except Exception:  # noqa: BLE001 - a tensor without a storage (subclass)
        return ("t", id(t))


def _nbytes_storage(t) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return _nbytes(t)


def _nbytes(t) -> int:
    return int(t.numel() * t.element_size())


class _TraceTimeout(BaseException):
    pass


@contextlib.contextmanager
def _rank0_env(world_size: int):
    """The environment the replay simulates (rank 0 of the plan's world): the model's code and
    ``example_inputs()`` see it here too, also when fsdp-lint itself runs under torchrun."""
    from fsdp_lint.process.environ import environ_set

    with environ_set({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size),
                      "LOCAL_WORLD_SIZE": str(world_size)}):
        yield


@contextlib.contextmanager
def _quiet():
    import warnings

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _in_reentrant_checkpoint_with_grad() -> bool:
    """The forward runs inside a reentrant ``torch.utils.checkpoint.checkpoint`` (under ``no_grad``) whose
    inputs require grad: backward recomputes it with grad, so autograd reaches the unit (FSDP gathers it again)
    although its output here does not require grad."""
    import sys

    import torch

    if torch.is_grad_enabled():
        return False
    f = sys._getframe(2)
    for _ in range(40):
        if f is None:
            return False
        code = f.f_code
        if code.co_name == "forward" and code.co_filename.replace("\\", "/").endswith("torch/utils/checkpoint.py"):
            args = f.f_locals.get("args", ())
            return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        f = f.f_back
    return False

