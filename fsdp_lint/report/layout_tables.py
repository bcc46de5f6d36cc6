"""The `--layout params` and `--layout ranks` tables (per parameter, per rank of each unit), fitted to
the output width as the unit table is (`report.width`)."""
from __future__ import annotations

from fsdp_lint.humanize import exact_count as _n, unit_label
from fsdp_lint.report.width import fitted


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _pad_rows(p) -> int:
    """Rows (along the dim FSDP2 shards) the collectives pad the parameter with."""
    base = p.pre_shape if p.pre_shape is not None else p.shape
    dim = getattr(p, "shard_dim", 0) if base and len(base) > 1 else 0
    if not base or not base[dim] or not p.numel or p.padded_numel is None or not _inner(base, dim):
        return 0
    return p.padded_numel // _inner(base, dim) - base[dim]


def _inner(shape, dim: int = 0) -> int:
    """Elements per index of `dim` (per row of dim 0 by default)."""
    if not shape or not shape[dim]:
        return 0
    n = 1
    for i, d in enumerate(shape):
        if i != dim:
            n *= d
    return n


def _placements_text(p) -> str:
    """``dp_shard: _StridedShard(dim=0, sf=2), tp: Shard(dim=0)``."""
    if not p.placements:
        return ""
    return ", ".join(f"{d}: {pl}" for d, pl in zip(p.mesh_dims or [], p.placements))


def params_table(res) -> str:
    """Per parameter: FSDP2 shape, local shape on rank 0 and on the last rank, collective padding;
    FSDP1 shape, place in the unit's FlatParameter and alignment padding."""
    plan = res.plan
    rows = []
    ws = plan.world_size
    tp = bool(plan.param_sharding) or any(ul.replicate_size > 1 for ul in res.layout.units)
    by_dim = bool(getattr(plan, "param_shard_dims", None))
    for ul in res.layout.units:
        label = unit_label(", ".join(unit_label(m) for m in ul.unit.modules))
        for i, p in enumerate(ul.params):
            shown = label if i == 0 else ""
            trainable = "yes" if p.requires_grad else "no"
            if plan.api == "fsdp1":
                rows.append([shown, p.fqn, _shape(p.shape), p.dtype, trainable, _n(p.numel),
                             _n(p.offset) if p.offset is not None else "-",
                             _n(p.padding_before) if p.padding_before else ""])
            else:
                pad = _pad_rows(p)
                base = p.pre_shape if p.pre_shape is not None else p.shape
                inner = _inner(base, p.shard_dim if base and len(base) > 1 else 0)
                pad_text = "" if not pad else _n(pad * inner) + (
                    f" ({pad} row{'s' if pad != 1 else ''})" if inner > 1 else "")
                row = [shown, p.fqn, _shape(p.shape), p.dtype, trainable, _shape(p.local_shape_first or ()),
                       _shape(p.local_shape_last or ()), pad_text]
                if tp:
                    row.insert(5, _placements_text(p))
                elif by_dim:
                    row.insert(5, f"Shard({p.shard_dim})")
                rows.append(row)
    if plan.api == "fsdp1":
        headers = ["unit", "parameter", "shape", "dtype", "trainable", "numel", "flat offset", "align padding before"]
    else:
        headers = ["unit", "parameter", "shape", "dtype", "trainable", "local (rank 0)",
                   f"local (rank {ws - 1})", "padding (elements)"]
        if tp:
            headers.insert(5, "placements")
        elif by_dim:
            headers.insert(5, "sharded")
    # fitted to the width as the unit table: the least telling columns go first, then names wrap; when
    # columns would still be left out, the parameters are named within their unit (`norm1.weight`)
    from fsdp_lint.report.width import fit_table, left_out_note

    def fit(table):
        floors = {"parameter": _longest_word(table, 1), "unit": 16, "placements": 16}
        return fit_table(table, headers, drop=PARAMS_TABLE_DROP, wrap=("parameter", "unit", "placements"),
                         min_wrap=floors, last_resort=PARAMS_TABLE_LAST + (f"local (rank {ws - 1})", "shape"))

    text, left_out, full = fit(rows)
    if left_out:
        units = [ul.unit.modules for ul in res.layout.units for _ in ul.params]
        short = fit([[r[0], _rel(r[1], mods)] + r[2:] for r, mods in zip(rows, units)])
        if len(short[1]) < len(left_out):
            text, left_out = short[0], short[1]
    note = left_out_note(left_out, full)
    return text + ("\n" + note if note else "")


PARAMS_TABLE_DROP = ("trainable", "dtype")
PARAMS_TABLE_LAST = ("numel", "sharded", "padding (elements)", "align padding before")


def _longest_word(rows, col: int, cap: int = 40) -> int:
    """The longest word of a column's cells (capped): the width it wraps down to without splitting names."""
    return min(cap, max((len(w) for r in rows for w in str(r[col]).split()), default=8))


def ranks_table(res) -> str:
    """Per unit and rank: FSDP1 the FlatParameter range and the parameter slices it covers
    (element ranges into each flattened parameter); FSDP2 the dim-0 rows of each parameter."""
    plan = res.plan
    rows = []
    for ul in res.layout.units:
        ws = ul.world_size
        label = unit_label(", ".join(unit_label(m) for m in ul.unit.modules))
        for rank in range(ws):
            shown = label if rank == 0 else ""
            if plan.api == "fsdp1":
                spans = ul.rank_spans(rank)
                held = sum(s.numel for s in spans)
                desc = ", ".join(
                    _rel(s.fqn, ul.unit.modules) if (s.start == 0 and s.end == _numel_of(ul, s.fqn))
                    else f"{_rel(s.fqn, ul.unit.modules)}[{s.start}:{s.end}]"
                    for s in spans) or "(padding only)"
                rows.append([shown, rank, f"{_n(rank * ul.shard_numel)}:{_n((rank + 1) * ul.shard_numel)}",
                             _n(held), _n(ul.shard_numel - held), desc])
            else:
                parts, empty = [], []
                held = 0
                for p in ul.params:
                    base = p.pre_shape if p.pre_shape is not None else p.shape  # a DTensor: its TP-local rows
                    if not base:
                        continue
                    local = p.local_shape(rank, ws)
                    rows_per = -(-base[0] // ws) if base[0] else 0
                    start = min(rank * rows_per, base[0])
                    name = _rel(p.fqn, ul.unit.modules)
                    if local[0]:
                        parts.append(name if local[0] == base[0] else f"{name}[{start}:{start + local[0]}]")
                    else:
                        empty.append(name)
                    held += local[0] * _inner(base)
                desc = ", ".join(parts)
                if empty:
                    desc += ("; " if desc else "") + "empty: " + ", ".join(empty)
                rows.append([shown, rank, _n(held), _n(max(0, ul.shard_numel - held)), desc or "(nothing)"])
    # HSDP / HYBRID_SHARD / TP: the ranks of one shard group (at TP coordinate 0)
    rank = "shard rank" if plan.param_sharding or any(ul.replicate_size > 1 for ul in res.layout.units) else "rank"
    if plan.api == "fsdp1":
        headers = ["unit", rank, "flat range", "elements", "padding", "holds (element ranges)"]
    else:
        headers = ["unit", rank, "elements", "padding", "holds (dim-0 rows)"]
    return fitted(rows, headers, wrap=(headers[-1], "unit"), min_wrap=_longest_word(rows, len(headers) - 1),
                  last_resort=("flat range",))


def _rel(fqn: str, modules) -> str:
    """A parameter FQN relative to its unit's module (``layers.0.norm1.weight`` -> ``norm1.weight``)."""
    for m in modules:
        if m and fqn.startswith(m + "."):
            return fqn[len(m) + 1:]
    return fqn


def _numel_of(ul, fqn: str) -> int:
    for p in ul.params:
        if p.fqn == fqn:
            return p.numel
    return -1
