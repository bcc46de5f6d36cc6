"""`report` for machines: JSON (the documented schema), SARIF 2.1.0 and GitHub annotations."""
from __future__ import annotations

import json
import os
from typing import Optional

from fsdp_lint.version import __version__
from fsdp_lint.humanize import display_path
from fsdp_lint.report.text import SCHEMA_VERSION, summary_counts

# --------------------------------------------------------------------------------------------
def _replay_json(res) -> dict:
    stopped = getattr(res, "stopped", None)
    return {
        "stopped_at": None if not stopped else {"reason": stopped[0], "path": display_path(stopped[1].path),
                                                "line": stopped[1].line},
        "skipped_statements": [{"path": display_path(s.path), "line": s.line, "error": s.error}
                               for s in getattr(res, "skipped_statements", None) or []],
    }


def file_to_json(res, *, layout: Optional[str] = None) -> dict:
    path = display_path(res.path)
    if res.skipped:
        return {"path": path, "args": list(getattr(res, "argv", None) or []), "skipped": res.skipped}
    tree, plan, lay = res.tree, res.plan, res.layout
    from fsdp_lint.plan.layout import param_local_shape

    # a mesh of several dimensions: the local shapes at the first and last coordinate of each
    corners = plan.mesh.corner_ranks() if plan.api == "fsdp2" and plan.mesh is not None and plan.mesh.ndim > 1 \
        else []
    units = []
    for ul in lay.units:
        u = ul.unit
        params = []
        for p in ul.params:
            entry = {"fqn": p.fqn, "shape": list(p.shape), "dtype": p.dtype, "requires_grad": p.requires_grad,
                     "numel": p.numel}
            if plan.api == "fsdp2":
                entry["local_shape"] = list(p.local_shape_first)
                entry["local_shape_last"] = list(p.local_shape_last)
                entry["padded_numel"] = p.padded_numel
                entry["placements"] = p.placements
                entry["mesh_dims"] = p.mesh_dims
                entry["pre_shard_shape"] = list(p.pre_shape) if p.pre_shape is not None else None
                entry["shard_dim"] = p.shard_dim
                if corners:
                    entry["local_shapes"] = [{"rank": r, "coordinates": list(plan.mesh.coordinates(r)),
                                              "shape": list(param_local_shape(plan, u, p, r))} for r in corners]
            else:
                entry["offset"] = p.offset
                entry["padding_before"] = p.padding_before
            params.append(entry)
        unit = {
            "module": u.module, "modules": u.modules, "class": u.cls, "path": display_path(u.path) if u.line else None,
            "line": u.line or None,
            "call_site": {"path": display_path(u.call_site[0]), "line": u.call_site[1]} if u.call_site else None,
            "origin": u.origin, "numel": ul.numel, "trainable_numel": ul.trainable_numel,
            "dtypes": ul.dtypes, "param_dtype": ul.param_dtype, "reduce_dtype": ul.reduce_dtype,
            "padded_numel": ul.padded_numel, "shard_numel": ul.shard_numel,
            "all_gather_bytes": ul.all_gather_bytes, "reduce_scatter_bytes": ul.reduce_scatter_bytes,
            "all_gathers_per_step": ul.all_gathers_per_step, "reduce_scatters_per_step": ul.reduce_scatters_per_step,
            "all_reduces_per_step": ul.all_reduces_per_step,
            "all_reduce_bytes": ul.all_reduce_bytes,
            "backward_all_gather_bytes": ul.backward_all_gather_bytes,
            "all_gather_bytes_per_step": ul.all_gather_bytes_per_step,
            "reduce_scatter_bytes_per_step": ul.reduce_scatter_bytes_per_step,
            "all_reduce_bytes_per_step": ul.all_reduce_bytes_per_step,
            "shard_group_size": ul.world_size, "replicate_group_size": ul.replicate_size,
            "mesh_dims": _unit_mesh_json(u),
            "reshard_after_forward": u.reshard_after_forward, "is_root": u.is_root, "params": params,
        }
        if plan.api == "fsdp1" and layout == "ranks":
            unit["ranks"] = [[{"fqn": s.fqn, "start": s.start, "end": s.end} for s in ul.rank_spans(r)]
                             for r in range(ul.world_size)]
        units.append(unit)
    return {
        "path": path,
        "args": list(getattr(res, "argv", None) or []),
        "notes": list(getattr(res, "notes", None) or []),
        "replay": _replay_json(res),
        "model": {"target": res.target, "class": tree.root_class, "numel": tree.numel,
                  "trainable_numel": tree.trainable_numel},
        "plan": {
            "api": plan.api, "world_size": plan.world_size, "root_wrapped": plan.root_wrapped,
            "use_orig_params": plan.use_orig_params, "sharding_strategy": plan.sharding_strategy,
            "origin": plan.origin, "framework": getattr(plan, "framework", None), "units": units,
            "leftover_params": plan.leftover_params, "ignored_params": plan.ignored_params,
            "all_gathers_per_step": lay.all_gathers_per_step,
            "reduce_scatters_per_step": lay.reduce_scatters_per_step,
            "all_reduces_per_step": lay.all_reduces_per_step,
            "step_bytes": lay.step_bytes,
            "tp_collectives": [_tp_json(c) for c in lay.tp_collectives],
            "mesh": _mesh_json(plan.mesh),
            "world_size_source": plan.world_size_source,
            "unsupported": [item.to_json(display_path) for item in plan.unsupported],
        },
        "memory": memory_to_json(res),
        "findings": [f.to_json(display_path(f.path), display_path) for f in res.findings],
        **({"granularity": granularity_to_json(res)} if getattr(res, "granularity", None) else {}),
        **({"suggestions": res.suggestions} if getattr(res, "suggestions", None) is not None else {}),
    }


def memory_to_json(res) -> dict:
    mem = res.layout.memory
    out = {"per_rank_bytes": mem.per_rank_bytes, "breakdown": mem.breakdown, "optimizer": mem.optimizer,
           "covers": mem.covers, "phase": mem.phase, "note": mem.activation_note,
           "checkpointed_regions": mem.checkpointed_regions, "activations_by_unit": mem.activations_by_unit,
           "host_bytes": mem.host_bytes}
    if getattr(res, "simulated", None) is not None:
        out["simulated"] = res.simulated
    budget = getattr(res, "budget", None)
    if budget is not None:
        out["budget"] = budget.to_json()
    return out


def granularity_to_json(res) -> list:
    return [{"plan": r.name, "units": r.units, "all_gathers_per_step": r.all_gathers_per_step,
             "bytes_per_all_gather": r.bytes_per_all_gather, "forward_peak_bytes": r.forward_peak_bytes,
             "per_rank_bytes": r.per_rank_bytes, "verdict": r.verdict} for r in res.granularity]


def _mesh_json(mesh) -> Optional[dict]:
    if mesh is None:
        return None
    return {"shape": list(mesh.shape), "dim_names": list(mesh.names), "size": mesh.size,
            "path": display_path(mesh.path) if mesh.path else None, "line": mesh.line or None}


def _tp_json(c) -> dict:
    return {"module": c.module, "style": c.style, "kind": c.kind, "phase": c.phase, "mesh_dim": c.mesh_dim,
            "group_size": c.group_size, "what": c.what, "elements_per_token": c.elements_per_token,
            "numel": c.numel, "path": display_path(c.path) if c.path else None, "line": c.line or None}


def _unit_mesh_json(unit) -> Optional[dict]:
    m = unit.mesh
    if m is None:
        return None
    return {"shard": m.shard.name, "replicate": m.replicate.name if m.replicate is not None else None,
            "source": m.source}


def render_json(results, *, layout: Optional[str] = None, run_summary: Optional[dict] = None,
                failures=()) -> str:
    counts = summary_counts(results)
    files = [file_to_json(r, layout=layout) for r in results]
    files += [{"path": display_path(path), "error": message} for path, message in failures]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "files": files,
        "summary": {"files": len(files), **counts, "skipped": sum(1 for r in results if r.skipped),
                    "failed": len(failures)},
    }
    if run_summary is not None:
        doc["run"] = run_summary
    return json.dumps(doc, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# SARIF 2.1.0 and GitHub annotations
# --------------------------------------------------------------------------------------------
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def repo_root(start: Optional[str] = None) -> str:
    d = os.path.abspath(start or os.getcwd())
    probe = d
    while True:
        if os.path.exists(os.path.join(probe, ".git")):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return d
        probe = parent


def _artifact_location(path: str, root: str) -> dict:
    """A repo-relative URI (what GitHub code scanning maps to the file); absolute outside the repo."""
    from pathlib import Path
    from urllib.parse import quote

    ap = os.path.abspath(path)
    rel = os.path.relpath(ap, root)
    if rel.startswith(".."):
        return {"uri": Path(ap).as_uri()}
    return {"uri": quote(rel.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}


def _sarif_fix(fix, root) -> dict:
    """SARIF 2.1.0 §3.55: the edits of one fix, per file, as replacements of regions."""
    by_path = {}
    for e in fix.edits:
        by_path.setdefault(e.path, []).append({
            "deletedRegion": {"startLine": e.line, "startColumn": e.col, "endLine": e.end_line,
                              "endColumn": e.end_col},
            "insertedContent": {"text": e.content}})
    return {"description": {"text": f"{fix.title} ({fix.applicability})"},
            "artifactChanges": [{"artifactLocation": _artifact_location(p, root), "replacements": reps}
                                for p, reps in by_path.items()]}


def rule_anchor(rule) -> str:
    """The rule's heading in README.md's "Rule reference" (``#### FSD301 `missing-root-wrap` ``) as
    GitHub spells its anchor: ``fsd301-missing-root-wrap``."""
    return f"{rule.code.lower()}-{rule.name}"


def docs_url() -> Optional[str]:
    """Where the rule reference lives: the package's ``Documentation`` project URL when its metadata
    has one (``[project.urls]``), else README.md beside the package (a source or editable install);
    None when neither is known (a SARIF rule then has no ``helpUri``)."""
    try:
        from importlib.metadata import PackageNotFoundError, metadata

        for entry in metadata("fsdp-lint").get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() == "documentation" and url.strip():
                return url.strip()
    except (ImportError, PackageNotFoundError):
        pass
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "README.md"
    return readme.as_uri() if readme.is_file() else None


def _region(f, line: int, col: int) -> dict:
    """SARIF region: the start, and the end where the file's syntax knows it (§3.30: endColumn is
    one past the last character)."""
    from fsdp_lint.report.positions import end_position

    region = {"startLine": max(1, line), "startColumn": max(1, col)}
    end = end_position(f.path, f.line, f.col) if line == f.line else None
    if end is not None:
        region.update(endLine=end[0], endColumn=end[1])
    return region


def render_sarif(results, failures=()) -> str:
    from fsdp_lint.check.rule import all_rules

    root = repo_root()
    rules = all_rules()
    index = {r.code: i for i, r in enumerate(rules)}
    sarif_rules = []
    extra = {}   # codes no rule owns (--run's "RUN" findings): described from the finding itself
    for res in results:
        for f in res.findings:
            if f.code not in index and f.code not in extra:
                extra[f.code] = f
    base = docs_url()
    for r in rules:
        doc = r.doc()
        sarif_rules.append({
            "id": r.code,
            "name": r.name,
            **({"helpUri": f"{base}#{rule_anchor(r)}"} if base else {}),
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": doc.split("\n\n")[0] if doc else r.summary},
            "help": {"text": doc or r.summary, "markdown": doc or r.summary},
            "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
            "properties": {"tags": ["fsdp", r.name]},
        })
    for code, f in extra.items():
        index[code] = len(sarif_rules)
        sarif_rules.append({"id": code, "name": f.name, "shortDescription": {"text": f.name},
                            "defaultConfiguration": {"level": _SARIF_LEVEL[f.severity]},
                            "properties": {"tags": ["fsdp", f.name]}})
    out_results = []
    for res in results:
        for f in res.findings:
            result = {
                "ruleId": f.code,
                "ruleIndex": index.get(f.code, 0),
                "level": _SARIF_LEVEL[f.severity],
                "message": {"text": full_message(f)},
                "locations": [{"physicalLocation": {
                    "artifactLocation": _artifact_location(f.path, root),
                    "region": _region(f, f.line, f.col),
                }}],
            }
            if f.call_site is not None:
                result["relatedLocations"] = [{"id": 1, "message": {"text": "called from here"}, "physicalLocation": {
                    "artifactLocation": _artifact_location(f.call_site[0], root),
                    "region": {"startLine": max(1, f.call_site[1])}}}]
            if f.module:
                result["properties"] = {"module": f.module}
            if f.confirmed is not None or f.evidence:
                result.setdefault("properties", {}).update({"confirmed": f.confirmed, "evidence": f.evidence})
            if f.fix_edits is not None and f.fix_edits.edits:
                result["fixes"] = [_sarif_fix(f.fix_edits, root)]
                result.setdefault("properties", {})["fixApplicability"] = f.fix_edits.applicability
            out_results.append(result)
    from pathlib import Path

    notifications = [{
        "level": "error",
        "message": {"text": message},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact_location(path, root)}}],
    } for path, message in failures]
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "fsdp-lint", "version": __version__, "semanticVersion": __version__,
                                "rules": sarif_rules}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).as_uri().rstrip("/") + "/"}},
            "invocations": [{"executionSuccessful": not failures, "toolExecutionNotifications": notifications}],
            "results": out_results,
        }],
    }
    return json.dumps(doc, indent=2) + "\n"


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def full_message(f) -> str:
    """The finding as one text for readers that show a single message (SARIF, annotations, GitLab):
    the message, its explanation and the fix."""
    return getattr(f, "text", f.message) + (f" Fix: {f.fix}" if f.fix else "")


def render_github(results, failures=()) -> str:
    """Workflow commands (GitHub's "Workflow commands for GitHub Actions"): `line`/`col` where the
    finding starts, `endLine`/`endColumn` where the file's syntax says it ends (the column one past
    the last character, as ruff and SARIF count)."""
    from fsdp_lint.report.positions import end_position

    lines = []
    level = {"error": "error", "warning": "warning", "info": "notice"}
    for path, message in failures:
        lines.append(f"::error file={_gh_escape(display_path(path), True)},"
                     f"title={_gh_escape('fsdp-lint could not lint this file', True)}::{_gh_escape(message)}")
    for res in results:
        for f in res.findings:
            msg = full_message(f)
            if f.call_site is not None:
                msg += f" (called from {display_path(f.call_site[0])}:{f.call_site[1]})"
            end = end_position(f.path, f.line, f.col)
            # the annotation is a check-run annotation: GitHub takes start and end columns only on one
            # line (its REST API, "Create a check run": omit them when start_line and end_line differ)
            span = "" if end is None else f",endLine={end[0]}" + (f",endColumn={end[1]}" if end[0] == f.line else "")
            lines.append(
                f"::{level[f.severity]} file={_gh_escape(display_path(f.path), True)},line={f.line},col={f.col}"
                f"{span},title={_gh_escape(f'fsdp-lint ({f.code})', True)}::{_gh_escape(f'{f.name}: {msg}')}")
    return "\n".join(lines) + ("\n" if lines else "")
