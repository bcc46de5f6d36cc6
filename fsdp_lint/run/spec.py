"""The run's options, the checks before anything starts, and what every rank is given (plain data:
it crosses process boundaries)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple


PG_TIMEOUT_MARGIN_S = 30.0


@dataclass
class RunOptions:
    nproc: int = 2
    steps: int = 2
    device: str = "auto"                  # "auto" | "cpu" | "cuda"
    input_shape: Optional[str] = None     # "2,128"
    input_dtype: Optional[str] = None     # "float" | "long" | "bfloat16" | "half"
    timeout: float = 300.0                # seconds for the whole run
    debug: bool = False


class RunError(Exception):
    """The run could not be carried out (one line; exit code 2). `summary`: what the run did for
    the files it could run (the report still shows it)."""

    def __init__(self, message: str, summary: Optional[dict] = None):
        super().__init__(message)
        self.summary = summary


def under_torchrun() -> bool:
    return all(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def check_options(opts: RunOptions) -> None:
    if opts.steps < 1:
        raise RunError(f"--steps must be at least 1, got {opts.steps}")
    if not opts.timeout or opts.timeout <= 0:
        raise RunError(f"--run-timeout must be positive, got {opts.timeout:g}")
    if opts.nproc < 1:
        raise RunError(f"--nproc must be at least 1, got {opts.nproc}")
    parse_input_shape(opts.input_shape)


def parse_input_shape(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    from fsdp_lint.config import input_shape_dims

    if text is None:
        return None
    dims = input_shape_dims(text)
    if dims is None:
        raise RunError(f"--input-shape must be positive integers separated by commas (e.g. 2,128), got {text!r}")
    return dims


def check_plan(res, settings) -> None:
    """The run applies the file's own wrap code; overrides of it cannot be run."""
    plan = res.plan
    name = os.path.basename(res.path)
    if plan.origin == "file":
        if settings.wrap:
            raise RunError(f"{name}: --run applies the file's own wrap code; drop --wrap to run it")
        if settings.api and settings.api != _file_api(res):
            raise RunError(f"{name}: --run applies the file's own wrap code ({_file_api(res)}); drop --api {settings.api}")
        if settings.use_orig_params is not None and plan.api == "fsdp1":
            raise RunError(f"{name}: --run applies the file's own wrap code with its own use_orig_params; "
                           f"drop --{'' if settings.use_orig_params else 'no-'}use-orig-params")


def _file_api(res) -> Optional[str]:
    return res.plan.api


def spec_for(res, settings, opts: RunOptions, seed: int = 0) -> dict:
    plan, tree = res.plan, res.tree
    return {
        "path": os.path.abspath(res.path),
        "model": settings.model,
        "steps": opts.steps,
        "input_shape": parse_input_shape(opts.input_shape),
        "input_dtype": opts.input_dtype,
        "seed": seed,
        "params": list(tree.params),
        "tied": [p.all_fqns for p in tree.params.values() if p.aliases],
        "api": plan.api,
        "apply_plan": plan.origin in ("default", "cli"),
        "units": [list(u.modules) for u in plan.units],
        "use_orig_params": bool(plan.use_orig_params),
        "debug": opts.debug,
        # the script's own command line and where it was launched from, as when it was linted
        "argv": list(getattr(res, "argv", None) or []),
        "cwd": getattr(res, "cwd", None),
        "gpu": getattr(settings, "gpu", None),     # issue 15: the node's GPU where the rank's CUDA is simulated
    }


def static_costs(res, ranks: Optional[int] = None) -> dict:
    """The static collectives and memory estimate the run's measurements compare with: for the
    run's own world size (`ranks`), with activations for the inputs the run uses."""
    lay = layout_for_run(res, ranks or res.layout.world_size)
    return {
        "world_size": lay.world_size,
        "all_gathers_per_step": lay.all_gathers_per_step,
        "reduce_scatters_per_step": lay.reduce_scatters_per_step,
        "all_reduces_per_step": sum(u.all_reduces_per_step for u in lay.units),
        "all_gather_bytes_per_step": sum(u.all_gather_bytes * u.all_gathers_per_step for u in lay.units),
        "reduce_scatter_bytes_per_step": sum(u.reduce_scatter_bytes * u.reduce_scatters_per_step for u in lay.units),
        "memory_per_rank_bytes": lay.memory.per_rank_bytes,
    }


def layout_for_run(res, ranks: int):
    """`res`'s plan laid out on `ranks` ranks (units sharded over the plan's world size are sharded
    over `ranks`), with the traced activations: the inputs the trace ran with are the run's."""
    import copy

    from fsdp_lint.plan.layout import compute_layout

    if ranks == res.layout.world_size and "activations" in res.layout.memory.covers:
        return res.layout
    plan = copy.deepcopy(res.plan)
    for unit in plan.units:
        if unit.shard_size == plan.world_size:
            unit.shard_size = ranks
    plan.world_size = ranks
    return compute_layout(plan, res.tree, trace=res.layout.trace, activations=True)


def _model_bytes(res) -> int:
    return sum(p.numel * p.itemsize for p in res.tree.params.values())


# what one more CPU rank takes besides its model (Python and torch forked from the parent, gloo, the
# allocator): measured on the 2-CPU CI machine, 16 ranks of a 140K-parameter model took 3.3 GB (MemAvailable)
_RANK_PROCESS_BYTES = 200 << 20


def check_host_memory(runnable, ranks_here: int) -> None:
    avail = _available_memory()
    if not avail:
        return
    if ranks_here * _RANK_PROCESS_BYTES > avail * 0.8:
        # a launch of many nodes (`srun python main.py --n_nodes 56`: 224 ranks) is not a session this machine runs
        raise RunError(f"{ranks_here} ranks on this machine's CPUs take about {human_bytes(ranks_here * _RANK_PROCESS_BYTES)} "
                       f"of memory before any model, and it has {human_bytes(avail)} available: pass --nproc N for a "
                       f"smaller session of the same plan (the launch's world is what the plan is for)")
    for res in runnable:
        need = _model_bytes(res) * ranks_here * 2
        if need > avail * 0.8:
            name = os.path.basename(res.path)
            raise RunError(
                f"{name}: building the model for real takes about {human_bytes(_model_bytes(res))} per rank "
                f"(x{ranks_here} ranks here) and this machine has {human_bytes(avail)} available; --run is "
                f"for small configurations: pass --model {name}:Class(num_layers=2, ...) for a smaller variant")


def _available_memory() -> Optional[int]:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def td(seconds: float):
    from datetime import timedelta

    return timedelta(seconds=max(1.0, seconds))


def human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def display_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
