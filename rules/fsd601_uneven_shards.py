"""FSD601 uneven-shards."""
from typing import Dict, List, Tuple

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import where

_MODEL = '''
import torch.nn as nn

class MoEBlock(nn.Module):
    def __init__(self, dim=256, experts=4):
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList([nn.Linear(dim, dim) for _ in range(experts)])

    def forward(self, x):
        w = self.router(x).softmax(-1)
        return sum(w[..., i:i + 1] * e(x) for i, e in enumerate(self.experts))

class Net(nn.Module):
    def __init__(self, dim=256, layers=2):
        super().__init__()
        self.layers = nn.ModuleList([MoEBlock(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''

_WRAP2 = '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''


def _empty_ranks(d0: int, ws: int) -> int:
    """Ranks whose Shard(0) chunk is empty (``torch.chunk`` semantics)."""
    if ws <= 1:
        return 0
    if d0 <= 0:
        return ws
    rows = -(-d0 // ws)
    return ws - (-(-d0 // rows))


class UnevenShards(Rule):
    """Shards padded far beyond the parameters, or ranks holding empty shards.

    ## What it does
    Reports units whose padding (what the collectives move beyond the parameters themselves)
    exceeds `padding-fraction` (default 5 %) of their size, and FSDP2 parameters whose dim 0
    does not give every rank a row (`d0 < world size`, or `torch.chunk`'s rounding leaving the
    last ranks empty), listed with their shapes and the ranks left empty. Units of one wrap call
    (a loop over blocks) are reported once, at that call.

    ## Why is this bad?
    It is not a bug: FSDP pads every shard to the same size, so nothing breaks. But padding is
    communication and memory spent on zeros, and a rank with an empty shard still takes part in
    every collective of that parameter. It matters for small parameters at large world sizes
    (MoE routers, biases and norms on hundreds of ranks) and for FSDP2's per-parameter padding
    of matrices whose dim 0 is not a multiple of the world size.

    ## Example
    ```python
    self.router = nn.Linear(dim, 4, bias=False)  # weight [4, dim]: 4 of 8 ranks hold nothing
    ```

    ## Fix
    Usually none is needed. To avoid the waste: choose dim-0 sizes divisible by the world size,
    keep tiny parameters out of sharding (FSDP2 `ignored_params`, or `shard_placement_fn` to shard
    another dim), or shard over a smaller mesh dimension (HSDP).
    """

    code = "FSD601"
    name = "uneven-shards"
    severity = "info"
    summary = "padding of a unit above 5 % of its size, or params with dim-0 smaller than the world size"

    VALID = [
        Example(_MODEL + _WRAP2, world_size=4, note="dim 0 of every parameter divides the world size"),
    ]
    INVALID = [
        Example(_MODEL + _WRAP2, world_size=8, note="router [4, 256] on 8 ranks"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = Net(dim=4)
model = FSDP(model, use_orig_params=True)
''', world_size=64, note="FSDP1: a tiny FlatParameter padded to 64 ranks"),
    ]

    def check(self, ctx):
        plan, layout, settings = ctx.plan, ctx.layout, ctx.settings
        if plan.origin not in ("file", "cli") or plan.sharding_strategy == "NO_SHARD":
            return
        groups: Dict[Tuple[str, int], List[tuple]] = {}
        for ul in layout.units:
            ws = ul.world_size
            if not ul.numel or ws <= 1:
                continue
            heavy_padding = ul.padding > settings.padding_fraction * ul.numel
            empty = []
            if plan.api == "fsdp2":
                for p in ul.params:
                    base = p.pre_shape if p.pre_shape is not None else p.shape  # TP: its local rows
                    d0 = base[p.shard_dim] if base else 1          # the dim FSDP shards (shard_placement_fn)
                    k = _empty_ranks(d0, ws)
                    if k:
                        empty.append((p, k))
            if heavy_padding or empty:
                groups.setdefault((ul.unit.path, ul.unit.line), []).append((ul, heavy_padding, empty))
        for (path, line), items in groups.items():
            yield self._finding(ctx, path, line, items)

    def _finding(self, ctx, path, line, items):
        from fsdp_lint.humanize import human_count

        ul, heavy, empty = items[0]
        ws = ul.world_size
        label = f"`{ul.unit.module}`" if ul.unit.module else "the root unit"
        parts = []
        if heavy:
            parts.append(f"padding {ul.padding:,} elements on top of {ul.numel:,} "
                         f"({100.0 * ul.padding / ul.numel:.0f}%, all-gathered as {ul.padded_numel:,})")
        if empty:
            shown = "; ".join(
                f"{_rel(p.fqn, ul.unit.module)} {list(p.shape)} ({human_count(p.numel)}): {k} of {ws} ranks empty"
                for p, k in empty[:5])
            more = f"; and {len(empty) - 5} more" if len(empty) > 5 else ""
            parts.append(f"{len(empty)} parameter(s) leave ranks with empty shards: {shown}{more}")
        brief = []
        if heavy:
            brief.append(f"padding {100.0 * ul.padding / ul.numel:.0f}% ({ul.padding:,} elements)")
        if empty:
            brief.append(f"{len(empty)} parameter(s) leave ranks with empty shards")
        msg = f"{label} on {ws} ranks: " + "; ".join(brief)
        detail = "; ".join(parts)
        if len(items) > 1:
            msg += f" (and {len(items) - 1} more unit(s))"
            detail += f" (the same in {len(items) - 1} more unit(s) from this call)"
        if ctx.plan.api == "fsdp2":
            fix = ("nothing is required; to avoid the waste, give dim 0 a multiple of the world size, keep tiny "
                   "parameters out of sharding (`ignored_params`) or shard them on another dim (`shard_placement_fn`)")
        else:
            fix = "nothing is required; the FlatParameter is padded to a multiple of the world size"
        return self.finding(ctx, msg, **where(ctx, path, line, ul.unit.col), module=ul.unit.module, fix=fix,
                            detail=detail, units=[i[0].unit.module for i in items],
                            empty_params=[(p.fqn, list(p.shape), k) for p, k in empty])


def _rel(fqn: str, module: str) -> str:
    return fqn[len(module) + 1:] if module and fqn.startswith(module + ".") else fqn
