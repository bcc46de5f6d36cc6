"""`--simulate`: the real peak memory per rank of the file's plan, without a GPU and without memory.

For every linted file one process (started, watched and cleaned up like a ``--run`` rank) becomes
rank 0 of the plan's world size under torch's fake process group and ``FakeTensorMode``: the file's
setup code is replayed with the real FSDP1/FSDP2 (``session``: its model, freezing, dtype changes,
wrap calls and optimizer; AdamW when it builds none), then two training steps run on the same
synthetic inputs as ``--run`` with torch's memory tracker watching (``memory``: ``FSDPMemTracker``
for FSDP2, ``MemTracker`` with FSDP1's buffers labelled for FSDP1) and the collectives counted.
Tensors are fake: shapes, dtypes and storages are real, no byte is allocated, so an 8B model on
64 ranks simulates on a laptop.

The device meshes are built outside ``FakeTensorMode`` (a mesh holds real rank tensors).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

from fsdp_lint.run.spec import RunError, RunOptions, display_path, spec_for

SIMULATED_STEPS = 2


PROGRESS_EVERY_S = 15.0


def simulate(results, settings, opts: RunOptions, progress=None) -> dict:
    """Simulate every linted file; sets ``res.simulated`` (plain data) and returns a summary.
    Raises RunError (with the summary) when a file could not be simulated. `progress(line)` is told,
    every ``PROGRESS_EVERY_S`` seconds of a long simulation, which file is still running."""
    from fsdp_lint.run.launch import launch_ranks
    from fsdp_lint.run.spec import check_options

    t0 = time.monotonic()
    check_options(opts)
    deadline = t0 + opts.timeout
    runnable = [r for r in results if not r.skipped and r.plan is not None and r.tree is not None]
    failed: List[str] = []
    done = 0
    for res in runnable:
        started = time.monotonic()
        spec = simulation_spec(res, settings, opts)
        try:
            missing = torch_lacks(res.plan.api)
            if missing:
                raise RunError(missing)
            if time.monotonic() >= deadline:
                raise RunError(f"no time left for this file within --run-timeout {opts.timeout:g} s")
            with _heartbeat(progress, res.path, started):
                report = launch_ranks(spec, 1, "fake", "cpu", deadline, opts)[0]
        except RunError as exc:
            res.simulated = {"error": str(exc), "cause": getattr(exc, "cause", None) or _cause_of(str(exc))}
            failed.append(f"{display_path(res.path)}: {exc}" if len(runnable) > 1 else str(exc))
            continue
        res.simulated = _file_result(report, spec, time.monotonic() - started)
        if "error" not in res.simulated:
            judge_budget(res, settings)
            if getattr(res, "suggestions", None):
                simulate_candidates(res, settings, opts, deadline, progress)
        if "error" in res.simulated:
            failed.append(f"{display_path(res.path)}: {res.simulated['error']}" if len(runnable) > 1
                          else res.simulated["error"])
        else:
            done += 1
    summary = {"files": len(runnable), "simulated": done, "wall_time_s": round(time.monotonic() - t0, 1)}
    if failed:
        raise RunError("; ".join(failed), summary=summary)
    return summary


SIMULATED_CANDIDATES = 2


def simulate_candidates(res, settings, opts: RunOptions, deadline: float, progress=None) -> None:
    """``--suggest`` with ``--simulate``: the file's plan takes the simulated peak just measured; the
    top ``SIMULATED_CANDIDATES`` candidates that fit are simulated too, each applied with torch's own
    API (``run.candidate``) on the model the setup code builds. A candidate with CPU offload is not:
    on the simulated CPU node offloaded and device memory are the same memory. `fits` is then judged
    on the simulated peak, and the list sorted again."""
    from fsdp_lint.plan.budget import budget_for
    from fsdp_lint.run.launch import launch_ranks

    def fits(peak: int):
        mem = res.layout.memory
        return budget_for(mem, settings, {"peak_bytes": peak, "peak_at": {}}).fits

    for c in res.suggestions:
        if not c["kinds"]:
            c["simulated_peak_bytes"] = res.simulated["peak_bytes"]
            c["fits"] = fits(c["simulated_peak_bytes"])
    top = [c for c in res.suggestions if c["kinds"] and c["fits"] is True and not c["plan"].get("offload")]
    for k, c in enumerate(top[:SIMULATED_CANDIDATES], 1):
        if time.monotonic() >= deadline:
            c["simulated_error"] = f"no time left within --run-timeout {opts.timeout:g} s"
            continue
        spec = simulation_spec(res, settings, opts)
        spec.update(candidate=c["plan"], apply_plan=False)
        if c["plan"].get("optimizer") in _TORCH_OPTIMIZERS:
            spec["default_optimizer"] = c["plan"]["optimizer"]
        started = time.monotonic()
        try:
            with _heartbeat(progress, f"{res.path} (candidate {k}: {', '.join(c['kinds'])})", started):
                report = launch_ranks(spec, 1, "fake", "cpu", deadline, opts)[0]
        except RunError as exc:
            c["simulated_error"] = str(exc)
            continue
        got = _file_result(report, spec, time.monotonic() - started)
        if "error" in got:
            c["simulated_error"] = got["error"]
            continue
        c["simulated_peak_bytes"] = got["peak_bytes"]
        c["fits"] = fits(got["peak_bytes"])
    res.suggestions.sort(key=lambda c: (c["fits"] is not True, c["all_gather_bytes_per_step"]
                                        + c["reduce_scatter_bytes_per_step"] + c.get("all_reduce_bytes_per_step", 0),
                                        len(c["kinds"]), c["simulated_peak_bytes"] or c["peak_bytes"]))


_TORCH_OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta")


def _cause_of(message: str) -> dict:
    """A failure that raised nothing in the rank (a timeout, a rank killed): what and where."""
    import re

    m = re.search(r"\(last phase: ([^)]*)\)|during phase '([^']*)'|in phase '([^']*)'", message)
    phase = next((g for g in (m.groups() if m else ()) if g), None)
    kind = "timeout" if "did not finish within" in message or "no time left" in message else \
        "killed" if "killed by signal" in message or "exited with code" in message else "error"
    return {"type": kind, "message": message, "phase": phase}


# the oldest torch that simulates an FSDP1 plan, of those benchmarks/torch_versions.sh checked: 2.6.0
# has no fake kernels for c10d's collectives; on 2.9.1 and 2.11.0 the memory tracker FSDP1's is built
# on lacks what it reads (``MemTracker._fake_mode_on_entry``); 2.12 was not checked
FSDP1_MIN_TORCH = (2, 13)


def torch_lacks(api) -> str:
    """Why the installed torch cannot simulate a plan of `api` (empty: it can). FSDP2 runs from 2.6
    on (its memory tracker answers its collectives under fake tensors on 2.6; ``run.compat`` adds
    the CPU stream events 2.6 lacks); FSDP1 needs FSDP1_MIN_TORCH."""
    import re

    import torch

    from fsdp_lint.run.collectives import fake_collectives_registered

    if api != "fsdp1":
        return ""
    numbers = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if numbers < FSDP1_MIN_TORCH or not fake_collectives_registered():
        need = ".".join(map(str, FSDP1_MIN_TORCH))
        return (f"simulating an FSDP1 plan needs torch {need} or later (this torch is {torch.__version__}: "
                f"the fake kernels of c10d's collectives and the memory tracker the simulation builds on "
                f"differ before); FSDP2 plans simulate from torch 2.6 on")
    return ""


class _heartbeat:
    """While a simulation runs: `progress` every PROGRESS_EVERY_S seconds (a timer thread)."""

    def __init__(self, progress, path: str, started: float):
        self.progress, self.path, self.started = progress, path, started
        self.timer = None
        self.stopped = False

    def _tick(self) -> None:
        import threading

        if self.stopped:
            return
        self.progress(f"--simulate: {display_path(self.path)}: still running "
                      f"({time.monotonic() - self.started:.0f} s)")
        self.timer = threading.Timer(PROGRESS_EVERY_S, self._tick)
        self.timer.daemon = True
        self.timer.start()

    def __enter__(self):
        import threading

        if self.progress is not None:
            self.timer = threading.Timer(PROGRESS_EVERY_S, self._tick)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()


def judge_budget(res, settings) -> None:
    """The budget and FSD801 again, now against the simulated peak (the best figure known)."""
    from fsdp_lint.check.rule import LintContext, rule_by_code
    from fsdp_lint.check.selection import rule_enabled, suppressed
    from fsdp_lint.plan.budget import budget_for

    res.budget = budget_for(res.layout.memory, settings, res.simulated)
    rule = rule_by_code("FSD801")
    if rule is None or not rule_enabled(rule.code, settings, res.path):
        return
    ctx = LintContext(path=res.path, facts=res.facts, tree=res.tree, plan=res.plan, layout=res.layout,
                      settings=settings)
    ctx.simulated = res.simulated
    kept = [f for f in res.findings if f.code != rule.code]
    found = [f for f in rule.check(ctx) if not suppressed(f, res.facts)]
    res.findings = sorted(kept + found, key=lambda f: (f.path != res.path, f.line, f.col, f.code))


def simulation_spec(res, settings, opts: RunOptions) -> dict:
    spec = spec_for(res, settings, opts)
    spec.update(world_size=res.plan.world_size, steps=SIMULATED_STEPS,
                materialise_meta=True)
    return spec


def _file_result(report: dict, spec: dict, seconds: float) -> Dict[str, Any]:
    from fsdp_lint.run.failures import at_frame

    if report.get("setup_error"):
        return {"error": report["setup_error"],
                "cause": report.get("setup_cause") or {"type": "setup", "message": report["setup_error"],
                                                       "phase": report.get("last_phase")}}
    err = report.get("error")
    if err:
        return {"error": f"torch raised {err['type']} in {err['phase']}: {err['message']}{at_frame(err)}",
                "cause": {k: err.get(k) for k in ("type", "message", "phase", "frame")}}
    if report.get("unfinished") or "memory" not in report:
        cause = report.get("cause")
        message = (f"the simulation did not finish (last phase: {report.get('last_phase')})"
                   + (f": {cause}" if cause else ""))
        crash = report.get("crash")
        return {"error": message,
                "cause": ({k: crash.get(k) for k in ("type", "message", "phase", "frame")} if crash
                          else dict(_cause_of(cause or message), phase=report.get("last_phase")))}
    mem = report["memory"]
    steps = report.get("collectives") or []
    last = steps[-1] if steps else {}
    shapes = report.get("input_shapes") or []
    return {
        "world_size": spec["world_size"],
        "rank": 0,
        "steps": report.get("steps_done", 0),
        "peak_bytes": mem["peak_bytes"],
        "breakdown": mem["breakdown"],
        "peak_at": mem["peak_at"],
        # the peak of the steady (second) step; the first step's under fake tensors beside it
        "peak_step": mem.get("peak_step", 1),
        "first_step_peak_bytes": mem.get("first_step_peak_bytes"),
        "timeline": mem["timeline"],
        "measure": mem["measure"],
        "input_shape": shapes[0] if shapes else None,
        "inputs": report.get("inputs"),
        "optimizer": report.get("optimizer"),
        "collectives": {
            "all_gathers_per_step": last.get("all_gather", {}).get("count", 0),
            "reduce_scatters_per_step": last.get("reduce_scatter", {}).get("count", 0),
            "all_reduces_per_step": last.get("all_reduce", {}).get("count", 0),
            "all_gather_bytes_per_step": last.get("all_gather", {}).get("bytes", 0),
            "reduce_scatter_bytes_per_step": last.get("reduce_scatter", {}).get("bytes", 0),
        },
        "wall_time_s": round(seconds, 1),
    }


# --------------------------------------------------------------------------------------------
# the simulated rank (a child process)
# --------------------------------------------------------------------------------------------
