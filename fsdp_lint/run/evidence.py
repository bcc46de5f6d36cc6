"""Evidence: turning the ranks' reports into ``confirmed``/``evidence`` per finding, findings of
its own for what no rule predicted (code ``RUN``), and the run summary."""
from __future__ import annotations

import os
import re
import time
from typing import List, Optional, Tuple

from fsdp_lint.run.failures import at_frame
from fsdp_lint.run.spec import RunOptions, display_path, human_bytes, static_costs


RUN_CODE = "RUN"
RUN_NAME = "run-error"

# findings torch turns into an exception, and words its messages use
_EXCEPTION_CODES = ("FSD105", "FSD201", "FSD203", "FSD204", "FSD302", "FSD401", "FSD402")
_KEYWORDS = {
    "FSD105": re.compile(r"container|does not implement forward|not iterable|modulelist|moduledict|"
                         r"has no attribute 'forward'", re.I),
    "FSD201": re.compile(r"requires_grad", re.I),
    "FSD203": re.compile(r"dtype", re.I),
    "FSD204": re.compile(r"\bint\d*\b|integer|floating|dtype|requires_grad", re.I),
    "FSD302": re.compile(r"already been applied|only be applied|more than once|invariant", re.I),
    "FSD401": re.compile(r"shared|tied", re.I),
    "FSD402": re.compile(r"mixed torch\.Tensor and DTensor|DTensor|mat1 and mat2|size mismatch", re.I),
}
_DIVERGENCE_CODES = ("FSD301", "FSD502")
_COST_CODES = ("FSD101", "FSD102", "FSD103", "FSD104", "FSD202", "FSD601")


def run_summary(files, backend, device, ranks, opts, mode, t0) -> dict:
    findings = [f for fs in files for f in fs.pop("_findings", [])]
    return {
        "backend": backend, "device": device, "ranks": ranks, "steps": opts.steps, "mode": mode,
        "wall_time_s": round(time.monotonic() - t0, 1),
        "confirmed": sum(1 for f in findings if f.confirmed is True),
        "not_confirmed": sum(1 for f in findings if f.confirmed is False),
        "undetermined": sum(1 for f in findings if f.confirmed is None),
        "files": files,
    }


def apply_evidence(res, per_rank: List[dict], spec: dict, ranks: int, opts: RunOptions) -> dict:
    from fsdp_lint.check.rule import Finding

    plan = res.plan
    r0 = per_rank[0]
    errors = [r["error"] for r in per_rank if r.get("error")]
    err = errors[0] if errors else None
    err_rank = next((r["rank"] for r in per_rank if r.get("error")), None)
    steps_done = min((r.get("steps_done", 0) for r in per_rank), default=0)
    completed = err is None and steps_done == opts.steps and all(not r.get("unfinished") for r in per_rank)
    compare = r0.get("compare")
    static = static_costs(res, ranks)
    measured = _measured_costs(per_rank)
    diverged = {d["fqn"]: d["max_diff"] for d in (compare or {}).get("diverged", [])}
    tied = [t for t in (compare or {}).get("tied", []) if t["max_diff"] != 0.0]
    run_findings: List[Finding] = []

    matched = _match_exception(res.findings, err, plan.api) if err else []
    for f in res.findings:
        f.confirmed, f.evidence = None, None
    for f in matched:
        f.confirmed = True
        f.evidence = f"torch raised {err['type']} in {err['phase']} on rank {err_rank}: {err['message']}{at_frame(err)}"

    stopped = (f"not reached: the run stopped in {err['phase']} with {err['type']}" if err else
               "not reached: the run did not complete its steps")
    explained: set = set()
    for f in res.findings:
        if f in matched:
            continue
        code = f.code
        if code in _DIVERGENCE_CODES or (code == "FSD401" and plan.api == "fsdp1"):
            if not completed or compare is None:
                f.evidence = stopped
                continue
            if ranks < 2 and code != "FSD401":
                f.evidence = "parameters cannot differ across ranks in a 1-rank run (use --nproc 2 or more)"
                continue
            if code == "FSD401":
                hits = _about_module(tied, f.module, lambda t: t["fqns"])
                if hits:
                    f.confirmed = True
                    f.evidence = (f"after {_steps(opts.steps)} tied weights are no longer equal: "
                                  + "; ".join(f"{t['fqns'][0]} vs {t['fqns'][1]} max |diff| {_num(t['max_diff'])}"
                                              for t in hits[:4]))
                    explained.update(x for t in hits for x in t["fqns"])
                else:
                    f.confirmed = False
                    f.evidence = f"after {_steps(opts.steps)} every tied group is still equal"
                continue
            pool = plan.leftover_params if code == "FSD301" else plan.ignored_params
            pool = _about_module(pool, f.module, lambda n: [n])
            hits = [(n, diverged[n]) for n in pool if n in diverged]
            if hits:
                f.confirmed = True
                f.evidence = (f"after {_steps(opts.steps)} {len(hits)} of {len(pool)} parameters differ across "
                              f"ranks: " + ", ".join(f"{n} (max |diff| {_num(d)})" for n, d in hits[:6])
                              + (", ..." if len(hits) > 6 else ""))
                explained.update(n for n, _ in hits)
            else:
                f.confirmed = False
                f.evidence = (f"after {_steps(opts.steps)} the {len(pool)} parameter{'s' if len(pool) != 1 else ''} "
                              f"{'outside every unit' if code == 'FSD301' else 'ignored by FSDP'} are identical on "
                              f"all ranks")
        elif code in _EXCEPTION_CODES:
            if err:
                f.evidence = stopped + " (see the finding it confirms)" if any(m is not f for m in matched) else stopped
            elif completed:
                f.confirmed = False
                f.evidence = (f"torch raised nothing: wrap, {opts.steps} forward/backward/optimizer "
                              f"step{'s' if opts.steps != 1 else ''} ran on {ranks} ranks")
            else:
                f.evidence = stopped
        elif code == "FSD501":
            infos = r0.get("optimizers") or []
            if not infos:
                f.evidence = stopped if err else "the run built no optimizer from the file"
                continue
            bad = [o for o in infos if o["held"] > o["held_of_model"]]
            changed = r0.get("params_changed")
            total = r0.get("params_trainable")
            tail = (f"; {changed} of the {total} trainable model parameters rank 0 holds changed in "
            f"{_steps(r0.get('steps_done', 0))}"
                    if changed is not None else "")
            if bad:
                f.confirmed = True
                f.evidence = "; ".join(
                    f"{o['cls']} (line {o['line']}) holds {o['held']} tensors, {o['held_of_model']} of them the "
                    f"model's parameters after wrapping (the model has {o['model_params']})" for o in bad) + tail
            else:
                f.confirmed = False
                f.evidence = "; ".join(f"{o['cls']} (line {o['line']}) holds only the model's parameters"
                                       for o in infos) + tail
        elif code in _COST_CODES:
            if not completed:
                f.evidence = stopped
                continue
            same, text = _cost_evidence(static, measured, ranks, per_rank)
            f.confirmed = same
            f.evidence = text
        else:
            f.evidence = f"--run has no check for {code}"

    # what no rule predicted: a gap in the rules, reported as a finding of its own
    if err and not matched:
        run_findings.append(_run_finding(res, err, err_rank, per_rank))
    if completed and compare is not None:
        unexplained = [(n, d) for n, d in diverged.items() if n not in explained
                       and not _predicted_divergence(res, n)]
        if unexplained:
            run_findings.append(Finding(
                code=RUN_CODE, name=RUN_NAME, severity="error", path=res.path, line=_first_wrap_line(res),
                message=(f"--run: after {_steps(opts.steps)} {len(unexplained)} parameter"
                         f"{'s' if len(unexplained) != 1 else ''} differ across ranks and no rule predicted it: "
                         + ", ".join(f"{n} (max |diff| {_num(d)})" for n, d in unexplained[:6])),
                confirmed=True, evidence="parameters compared after the steps (all-gathered fingerprints)"))
        bad_opts = [o for o in (r0.get("optimizers") or []) if o["held"] > o["held_of_model"]]
        if bad_opts and not any(f.code == "FSD501" for f in res.findings):
            o = bad_opts[0]
            run_findings.append(Finding(
                code=RUN_CODE, name=RUN_NAME, severity="error", path=o["path"] if o["path"] else res.path,
                line=o["line"] or 1,
                message=(f"--run: {o['cls']} holds {o['held']} tensors, only {o['held_of_model']} of them the "
                         f"model's parameters after wrapping, and no rule predicted it"),
                confirmed=True, evidence=f"{r0.get('params_changed')} of the {r0.get('params_trainable')} trainable "
                                         f"model parameters rank 0 holds changed in {_steps(opts.steps)}"))
    res.findings.extend(run_findings)

    file_summary = {
        "path": display_path(res.path),
        "api": plan.api,
        "status": "completed" if completed else (f"raised in {err['phase']}" if err else "incomplete"),
        "steps_done": steps_done,
        "inputs": r0.get("inputs"),
        "optimizer": r0.get("optimizer"),
        "measured": measured,
        "static": {k: v for k, v in static.items()},
        "peak_memory_bytes": [r.get("peak_memory") for r in per_rank],
        "memory_measure": r0.get("memory_measure"),
        "memory_breakdown": (r0.get("memory") or {}).get("breakdown"),
        "rss_peak_bytes": [r.get("rss_peak") for r in per_rank] if any(r.get("rss_peak") for r in per_rank) else None,
        "error": ({**{k: err[k] for k in ("type", "message", "phase", "frame")}, "rank": err_rank} if err else None),
        "diverged": [{"fqn": n, "max_diff": d} for n, d in diverged.items()],
        "notes": r0.get("notes") or [],
        "_findings": list(res.findings),
    }
    return file_summary


def _about_module(items: list, module: str, fqns_of) -> list:
    """The items with a parameter under the finding's module (all of them when none is, or the
    finding is about the root)."""
    if not module:
        return list(items)
    mine = [x for x in items if any(n == module or n.startswith(module + ".") for n in fqns_of(x))]
    return mine or list(items)


def _predicted_divergence(res, fqn: str) -> bool:
    return fqn in res.plan.leftover_params or fqn in res.plan.ignored_params


def _first_wrap_line(res) -> int:
    lines = [u.line for u in res.plan.units if u.line]
    return min(lines) if lines else 1


def _run_finding(res, err: dict, rank, per_rank):
    from fsdp_lint.check.rule import Finding

    path, line = res.path, _first_wrap_line(res)
    if err.get("user_path") and os.path.isfile(err["user_path"]):
        path, line = err["user_path"], err["user_line"] or line
    hint = ""
    if per_rank[0].get("inputs_inferred") and err["phase"].startswith("forward"):
        hint = (f" (inputs were inferred: {per_rank[0].get('inputs')}; pass --input-shape/--input-dtype or define "
                f"example_inputs() if they do not fit the model)")
    return Finding(
        code=RUN_CODE, name=RUN_NAME, severity="error", path=path, line=line,
        message=(f"--run: torch raised {err['type']} in {err['phase']} on rank {rank} and no rule predicted it: "
                 f"{err['message']}{at_frame(err)}{hint}"),
        confirmed=True, evidence=f"{err['type']}: {err['message']}{at_frame(err)}")


def _match_exception(findings, err: dict, api: Optional[str]) -> list:
    cands = [f for f in findings if f.code in _EXCEPTION_CODES]
    if not cands:
        return []
    text = f"{err['type']}: {err['message']}"
    hits = [f for f in cands if _KEYWORDS[f.code].search(text)]
    if hits:
        named = [f for f in hits if f.module and re.search(rf"(?<![\w.]){re.escape(f.module)}(?![\w])", err["message"])]
        return named or hits
    codes = {f.code for f in cands}
    early = err["phase"] in ("wrap",) or err["phase"].startswith("forward (step 1)")
    if len(codes) == 1 and (err.get("in_fsdp") or early):
        return cands
    return []


def _measured_costs(per_rank: List[dict]) -> dict:
    r0 = per_rank[0]
    steps = r0.get("collectives") or []
    if not steps:
        return {}
    last = steps[-1]
    return {
        "all_gathers_per_step": last["all_gather"]["count"],
        "reduce_scatters_per_step": last["reduce_scatter"]["count"],
        "all_reduces_per_step": last["all_reduce"]["count"],
        "all_gather_bytes_per_step": last["all_gather"]["bytes"],
        "reduce_scatter_bytes_per_step": last["reduce_scatter"]["bytes"],
        "per_step": [{k: v["count"] for k, v in s.items()} for s in steps],
    }


def _cost_evidence(static: dict, measured: dict, ranks: int, per_rank) -> Tuple[bool, str]:
    if not measured:
        return False, "no step was measured"
    same_ws = static["world_size"] == ranks
    counts_equal = (measured["all_gathers_per_step"] == static["all_gathers_per_step"]
                    and measured["reduce_scatters_per_step"] == static["reduce_scatters_per_step"])
    bytes_equal = (measured["all_gather_bytes_per_step"] == static["all_gather_bytes_per_step"]
                   and measured["reduce_scatter_bytes_per_step"] == static["reduce_scatter_bytes_per_step"])
    peaks = [r.get("peak_memory") for r in per_rank if r.get("peak_memory")]
    text = (f"measured per step on {ranks} ranks: {measured['all_gathers_per_step']} all-gathers "
            f"({human_bytes(measured['all_gather_bytes_per_step'])}/rank) + {measured['reduce_scatters_per_step']} "
            f"reduce-scatters ({human_bytes(measured['reduce_scatter_bytes_per_step'])}/rank); static "
            f"{static['all_gathers_per_step']} ({human_bytes(static['all_gather_bytes_per_step'])}) + "
            f"{static['reduce_scatters_per_step']} ({human_bytes(static['reduce_scatter_bytes_per_step'])})")
    if not same_ws:
        text += f" for world size {static['world_size']} (bytes not comparable)"
    if peaks:
        # a framework's own batch (the Lightning Trainer's loader) is not the input shape the estimate used
        own_batch = str(per_rank[0].get("inputs") or "").startswith("the first batch")
        text += (f"; peak memory {human_bytes(max(peaks))}/rank ({per_rank[0].get('memory_measure')}), "
                 f"static estimate {human_bytes(static['memory_per_rank_bytes'])}"
                 + (" (without that batch's activations)" if own_batch else " for the same inputs"))
    return counts_equal and (bytes_equal or not same_ws), text


def _steps(n: int) -> str:
    return f"{n} step{'s' if n != 1 else ''}"


def _num(x: float) -> str:
    if x == float("inf"):
        return "shape differs"
    return f"{x:.3g}"
