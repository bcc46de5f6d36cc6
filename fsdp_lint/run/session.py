"""The rank's session: replay the file's setup code with the real FSDP, train a few steps on
synthetic inputs, then compare parameters across ranks. Shared by ``--run`` (every rank) and
``--simulate`` (one rank under the fake process group)."""
from __future__ import annotations

import contextlib
import io
import traceback
from typing import Any, Dict, Optional, Tuple

from fsdp_lint.run.collectives import comm_counter
from fsdp_lint.run.failures import describe_exception, in_fsdp, one_line
from fsdp_lint.model.inputs import InputError, find_example_inputs, loss_of, make_inputs
from fsdp_lint.run.memory import StepMemory
from fsdp_lint.run.spec import td
from fsdp_lint.model.unwrap import resolve, user_root


class Phases:
    def __init__(self, rep):
        self.rep = rep
        self.name = "starting"

    def __call__(self, name: str, order: int) -> None:
        self.name = name
        self.rep.phase(name, order)


def rank_main(spec: dict, rank: int, ws: int, device, rep, store, prefix: str, remaining) -> None:
    """One rank's run: build and wrap for real, train a few steps, compare across ranks.

    Sends its report through `rep` (result, then compare); never raises for what the user's code
    does -- only for fsdp-lint's own failures."""
    import torch

    out: Dict[str, Any] = {"rank": rank, "error": None, "setup_error": None, "steps_done": 0,
                           "collectives": [], "notes": []}
    phase = Phases(rep)
    with contextlib.suppress(Exception):
        import torch._dynamo

        torch._dynamo.config.disable = True      # compilation is not what --run checks
    model = optimizers = None
    try:
        with user_code_io(spec["debug"]):
            model, optimizers, info, example_fn = build(spec, ws, device, phase, out, remaining)
        if model is not None:
            out.update(info)
            with user_code_io(spec["debug"]):
                _train(spec, rank, ws, device, model, optimizers, phase, out, example_fn)
    finally:
        rep.result(out)
    ok = out["error"] is None and out["setup_error"] is None and model is not None
    # everyone's status through the store: collectives only when every rank finished its steps
    store.set(f"{prefix}/status/{rank}", "ok" if ok else "error")
    keys = [f"{prefix}/status/{r}" for r in range(ws)]
    try:
        store.wait(keys, td(remaining()))
        statuses = [store.get(k).decode() for k in keys]
    except Exception:
        return
    if not all(s == "ok" for s in statuses):
        return
    phase("compare", 10_000)
    with user_code_io(spec["debug"]):
        rep.compare(_compare(spec, rank, ws, device, model, out))


@contextlib.contextmanager
def user_code_io(debug: bool):
    import warnings

    if debug:
        yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def build(spec, ws, device, phase, out, remaining):
    """Replay the file's setup code with the real FSDP; returns (model, optimizers, info)."""
    import torch

    from fsdp_lint.replay import ModelTarget, ReplayError, frameworks, replay
    from fsdp_lint.replay.frameworks.options import FrameworkOptions
    from fsdp_lint.entry.source import SourceError, read_source

    phase("build and wrap", 2)
    try:
        facts = read_source(spec["path"])
        target = ModelTarget.parse(spec["model"]) if spec["model"] else None
    except (SourceError, ReplayError) as exc:
        out["setup_error"] = str(exc)
        out["setup_cause"] = {"type": type(exc).__name__, "message": one_line(str(exc)), "phase": "build and wrap"}
        return None, None, {}, None
    torch.manual_seed(spec["seed"])
    try:
        # issue 15: a CPU rank (--simulate, --run on CPU) answers CUDA probes as the node's GPU
        with frameworks.configured(FrameworkOptions(gpu=spec.get("gpu"))):
            result = replay(facts, ws, target=target, real=True, timeout=remaining(), device=device,
                            argv=spec.get("argv"), cwd=spec.get("cwd"), wrap=not spec.get("candidate"))
    except ReplayError as exc:
        cause = exc.__cause__
        if cause is None:
            out["setup_error"] = f"replaying the setup code for real failed: {exc}"
            out["setup_cause"] = {"type": type(exc).__name__, "message": one_line(str(exc)), "phase": "setup code"}
        else:
            out["error"] = describe_exception(cause, _build_phase(cause))
        return None, None, {}, None
    except Exception as exc:  # noqa: BLE001 - torch raised while the file's code ran
        out["error"] = describe_exception(exc, _build_phase(exc))
        return None, None, {}, None
    model = result.model
    info: Dict[str, Any] = {}
    if spec.get("candidate"):
        # --simulate of a --suggest candidate: the file's wrap calls were recorded only; the
        # candidate's plan is applied with torch's own API, with a fresh optimizer of the file's class
        from fsdp_lint.run.candidate import apply_candidate

        try:
            model = apply_candidate(spec["candidate"], model, ws, device)
        except Exception as exc:  # noqa: BLE001
            out["error"] = describe_exception(exc, "wrap")
            return None, None, {}, None
        optimizer_calls = []
    elif spec["apply_plan"] and not result.wrap_calls:
        try:
            model = _apply_plan(spec, model, ws, device)
        except Exception as exc:  # noqa: BLE001
            out["error"] = describe_exception(exc, "wrap")
            return None, None, {}, None
        optimizer_calls = []
    else:
        optimizer_calls = [o for o in result.optimizers if getattr(o, "obj", None) is not None]
    if str(next((p.device for p in model.parameters()), device)) == "meta":
        if not spec.get("materialise_meta"):
            out["setup_error"] = ("the model is still on the meta device after the setup code ran; "
                                  "--run needs a file that materialises it (to_empty + init)")
            return None, None, {}, None
        model.to_empty(device=device)    # --simulate: fake tensors, values never read
    model_params = list(model.parameters())
    ids = {id(p) for p in model_params}
    optimizers = []
    opt_info = []
    for call in optimizer_calls:
        held = [p for g in call.obj.param_groups for p in g["params"]]
        opt_info.append({"cls": call.cls, "path": call.pos.path, "line": call.pos.line, "held": len(held),
                         "held_of_model": sum(1 for p in held if id(p) in ids),
                         "model_params": len(model_params)})
        optimizers.append(call.obj)
    if not optimizers:
        trainable = [p for p in model_params if p.requires_grad]
        name = spec.get("default_optimizer", "AdamW")   # what the static estimate assumes too
        if trainable:
            optimizers = [getattr(torch.optim, name)(trainable, lr=1e-2)]
        info["optimizer"] = f"{name}(lr=1e-2) (the file builds none)" if trainable else None
    else:
        info["optimizer"] = ", ".join(f"{o['cls']} (line {o['line']})" for o in opt_info)
    info["optimizers"] = opt_info
    return model, optimizers, info, find_example_inputs(getattr(result, "namespace", None), model)


def _build_phase(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if any(in_fsdp(f.filename) for f in frames):
        return "wrap"
    return "setup code"


def _apply_plan(spec, model, ws, device):
    """The file has no wrap code: apply the plan's units (children first, then the root)."""
    if spec["api"] == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        root = None
        for modules in spec["units"]:
            fqn = modules[0]
            if fqn == "":
                root = FSDP(model, device_id=device, use_orig_params=spec["use_orig_params"])
                continue
            parent_fqn, _, name = fqn.rpartition(".")
            parent = model.get_submodule(parent_fqn) if parent_fqn else model
            setattr(parent, name, FSDP(getattr(parent, name), device_id=device,
                                       use_orig_params=spec["use_orig_params"]))
        return root if root is not None else model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (ws,))
    for modules in spec["units"]:
        mods = [model.get_submodule(m) if m else model for m in modules]
        fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh)
    return model


def _train(spec, rank, ws, device, model, optimizers, phase, out, example_fn) -> None:
    """--run: the steps, then which trainable parameters this rank holds changed."""
    before = _local_fingerprints(model)
    _reset_peak(device)
    if not run_steps(spec, rank, device, model, optimizers, phase, out, example_fn,
                     track_memory=device.type == "cpu"):
        return
    out["peak_memory"], out["memory_measure"] = _peak_memory(device)
    if out.get("memory"):
        # CPU: tensor memory as torch's tracker measured it (what an estimate can match); the
        # process RSS (Python, torch, the allocator's caches) only beside it
        out["rss_peak"] = out["peak_memory"]
        out["peak_memory"] = out["memory"]["peak_bytes"]
        out["memory_measure"] = f"{out['memory']['measure']}, tensor memory"
        out["memory"].pop("timeline", None)
    after = _local_fingerprints(model)
    # trainable parameters this rank holds a piece of (FSDP leaves some ranks an empty shard)
    trainable = [n for n, (fp, rg, numel) in before.items() if rg and numel]
    out["params_changed"] = sum(1 for n in trainable if n in after and after[n][0] != before[n][0])
    out["params_trainable"] = len(trainable)


def _lightning_module(model):
    import sys

    root = user_root(model)
    for pkg in ("lightning.pytorch", "pytorch_lightning"):
        mod = sys.modules.get(pkg)
        if mod is not None and isinstance(root, mod.LightningModule):
            return pkg, root
    return None, None


def framework_batch(model, device):
    """What the framework would feed the first step, where the script gives it: the first batch of the
    Lightning Trainer's train data loader (the replay stopped inside ``fit``, with the loader known).
    None where there is none, or it cannot be drawn here."""
    pkg, root = _lightning_module(model)
    trainer = getattr(root, "_trainer", None) if root is not None else None
    if trainer is None:
        return None
    try:
        import torch

        loader = trainer.fit_loop._data_source.dataloader()
        batch = next(iter(loader))

        def move(x):
            if isinstance(x, torch.Tensor):
                return x.to(device)
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(move(v) for v in x)
            return x
        return move(batch)
    except Exception:  # noqa: BLE001 - no loader, or data that cannot be read here: inferred inputs instead
        return None


def forward_step(model, args, kwargs):
    """``model(*inputs)``, or what the framework runs as a step: a LightningModule's ``training_step``
    (the Trainer calls it, not ``forward``; through the strategy's wrapper when there is one, as
    Lightning's forward redirection does). The inputs are the batch; ``self.log`` does nothing here."""
    pkg, root = _lightning_module(model)
    if root is not None:
        batch = args[0] if len(args) == 1 and not kwargs else (dict(kwargs) if kwargs and not args else tuple(args))
        silent = {name: root.__dict__.get(name) for name in ("log", "log_dict")}
        root.log = root.log_dict = lambda *a, **k: None
        try:
            if model is root:
                return root.training_step(batch, 0)
            from importlib import import_module

            redirect = import_module(f"{pkg}.strategies.strategy")._ForwardRedirection()
            return redirect(model, root, "training_step", batch, 0)
        finally:
            for name, value in silent.items():
                if value is None:
                    root.__dict__.pop(name, None)
                else:
                    root.__dict__[name] = value
    return model(*args, **kwargs)


def backward(model, loss) -> None:
    """``loss.backward()``, or what the framework that set the model up requires instead: a model set up
    by Lightning Fabric refuses a plain backward (its strategy and precision run it: ``fabric.backward``)."""
    import sys

    for name in ("lightning.fabric.wrappers", "lightning_fabric.wrappers"):
        wrappers = sys.modules.get(name)
        if wrappers is not None and isinstance(model, wrappers._FabricModule):
            wrappers._in_fabric_backward = True
            try:
                model._strategy.backward(loss, model._forward_module)
            finally:
                wrappers._in_fabric_backward = False
            return
    loss.backward()


def run_steps(spec, rank, device, model, optimizers, phase, out, example_fn, track_memory: bool = False) -> bool:
    """``spec["steps"]`` training steps (zero_grad, forward, loss, backward, optimizer step) on
    synthetic inputs, collectives counted per step; with `track_memory` torch's memory tracker
    watches them (``out["memory"]``). False when they did not all run (``out`` says why)."""
    counter = comm_counter()
    memory = StepMemory(model, optimizers) if track_memory else None
    inferred = example_fn is None and not spec["input_shape"]
    with memory if memory is not None else contextlib.nullcontext():
        for step in range(1, spec["steps"] + 1):
            base = 10 * step
            phase(f"inputs (step {step})", base + 1)
            try:
                args, kwargs, how = make_inputs(spec, model, device, rank, step, example_fn)
            except InputError as exc:
                out["setup_error"] = str(exc)
                return False
            except Exception as exc:  # noqa: BLE001 - example_inputs() itself failed
                if example_fn is not None:
                    out["setup_error"] = f"example_inputs() raised {type(exc).__name__}: {one_line(str(exc))}"
                    return False
                raise
            batch = framework_batch(model, device) if example_fn is None and not spec["input_shape"] else None
            if batch is not None:
                args, kwargs, how, inferred = (batch,), {}, "the first batch of the Trainer's train data loader", False
            out["inputs"] = how
            out["inputs_inferred"] = inferred
            out["input_shapes"] = [list(t.shape) for t in list(args) + list(kwargs.values()) if hasattr(t, "shape")]
            if step == 1:
                bad = _signature_problem(model, args, kwargs)
                if bad:
                    hint = ("define example_inputs() in the model file or pass --input-shape/--input-dtype"
                            if example_fn is None else "fix example_inputs()")
                    out["setup_error"] = (f"the model's forward() does not accept the synthetic inputs ({how}): "
                                          f"{bad}; {hint}")
                    return False
            if memory is not None:
                memory.step(step)
                memory.track_inputs(args, kwargs)
            counter.reset()
            current = f"forward (step {step})"
            try:
                with counter:
                    phase(current, base + 2)
                    for opt in optimizers:
                        opt.zero_grad(set_to_none=True)
                    output = forward_step(model, args, kwargs)
                    loss = loss_of(output)
                    current = f"backward (step {step})"
                    phase(current, base + 3)
                    if loss is not None and loss.requires_grad:
                        backward(model, loss)
                    elif step == 1:
                        out["notes"].append("the loss does not require grad: no backward pass ran")
                    current = f"optimizer step (step {step})"
                    phase(current, base + 4)
                    for opt in optimizers:
                        opt.step()
                    _sync(device)
                del output, loss
            except Exception as exc:  # noqa: BLE001 - what torch raised is the evidence
                out["error"] = describe_exception(exc, current)
                out["collectives"].append(counter.snapshot())
                return False
            out["collectives"].append(counter.snapshot())
            out["steps_done"] = step
    if memory is not None:
        out["memory"] = memory.result()
    return True


def _signature_problem(model, args, kwargs) -> Optional[str]:
    import inspect

    fn = getattr(user_root(model), "forward", None)
    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _reset_peak(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device) -> Tuple[int, str]:
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "CUDA max_memory_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak RSS of the rank process (CPU)"


def _local_fingerprints(model) -> Dict[str, Tuple[Tuple[float, float], bool, int]]:
    """Per parameter: (sum, sum of squares) of this rank's local piece, requires_grad, numel."""
    import torch

    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            t = t.detach()
            if t.numel() == 0:
                out[name] = ((0.0, 0.0), bool(p.requires_grad), 0)
                continue
            d = t.double()
            out[name] = ((float(d.sum()), float((d * d).sum())), bool(p.requires_grad), t.numel())
    return out


def _compare(spec, rank, ws, device, model, out) -> dict:
    import torch
    import torch.distributed as dist

    result: Dict[str, Any] = {"diverged": [], "tied": [], "compared": 0}
    fsdp1 = any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules())
    ctx = contextlib.nullcontext()
    if fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        ctx = FSDP.summon_full_params(model, writeback=False, recurse=True)
    comm_device = device if device.type == "cuda" else torch.device("cpu")
    with torch.no_grad(), ctx:
        full: Dict[str, Any] = {}
        for fqn in spec["params"]:
            t = resolve(model, fqn)
            if t is None:
                continue
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            full[fqn] = t.detach()
        names = list(full)
        rows = []
        for fqn in names:
            d = full[fqn].double().flatten()
            n = d.numel()
            w = torch.arange(1, n + 1, dtype=torch.float64, device=d.device) if n else d
            rows.append(torch.stack([d.sum(), (d * d).sum(), (d * w).sum() / max(1, n)]) if n
                        else torch.zeros(3, dtype=torch.float64, device=d.device))
        fps = torch.stack(rows).to(comm_device) if rows else torch.zeros((0, 3), dtype=torch.float64, device=comm_device)
        gathered = [torch.empty_like(fps) for _ in range(ws)]
        dist.all_gather(gathered, fps)
        differ = [i for i in range(len(names))
                  if any(not torch.equal(gathered[0][i], gathered[r][i]) for r in range(1, ws))]
        for i in differ:
            t = full[names[i]].double().to(comm_device)
            hi, lo = t.clone(), t.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            result["diverged"].append({"fqn": names[i], "max_diff": float((hi - lo).abs().max()) if t.numel() else 0.0})
        result["compared"] = len(names)
        for group in spec["tied"]:
            tensors = [(f, resolve(model, f)) for f in group]
            tensors = [(f, t.full_tensor() if hasattr(t, "full_tensor") else t) for f, t in tensors if t is not None]
            if len(tensors) < 2:
                continue
            base_f, base = tensors[0]
            for f, t in tensors[1:]:
                same_object = t is base
                if tuple(t.shape) != tuple(base.shape):
                    diff = float("inf")
                else:
                    diff = float((t.double() - base.double()).abs().max()) if t.numel() else 0.0
                result["tied"].append({"fqns": [base_f, f], "max_diff": diff, "same_tensor": same_object})
    return result
