"""FSD104 heavy-root-unit."""
from typing import Dict, List, Set

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import block_label, block_loop, per_block_layout, where
from fsdp_lint.rules._reads import reads_outside

_MODEL = '''
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(self.norm(x)).relu())

class LM(nn.Module):
    def __init__(self, vocab=32000, dim=64, layers=4, tied=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
'''


# a device small enough that the examples' roots cost more than `memory-info-share` of it
_SMALL_DEVICE = {"gpu_memory": "64MiB", "cuda_context_memory": "0B", "nccl_memory": "0B"}


def settings_of(ctx):
    return ctx.settings


class HeavyRootUnit(Rule):
    """The root unit's own parameters outweigh every other unit.

    ## What it does
    Compares the parameters the root unit keeps for itself (what no nested unit took: typically
    the embeddings, the output head and the final norm) with the largest other unit and with
    the model's repeated block (a unit of the per-block plan), in all-gathered bytes. When the
    root is larger than both, it names the modules that make it heavy and
    suggests the grouping that moves them out of the root: FSDP2
    `fully_shard(model.embed)` before the blocks and `fully_shard([model.norm, model.head])`
    after them (torchtitan's plan); FSDP1 units of their own through the auto-wrap policy.
    Whole blocks left in the root (the vision tower of a vision-language model whose plan wraps
    only the language model's layers, the decoder layers of an encoder-decoder whose policy
    names only the encoder's) become units of their own, one per block.

    Below `memory-info-share` (default 5 %) of the usable memory of the device (see FSD801) the
    finding is reported as info: the device absorbs the cost, and a plan a framework's flags cannot
    change (the HF Trainer's root on a 7B model) does not fail the gate.

    When the only way out would split a tied weight between units (FSDP1 with an output head
    tied to the embedding, whose modules share no ancestor but the root), the finding is
    reported as info: that root is the price of the tie under FSDP1.

    A root whose unsharded parameters are below `collective-floor-bytes` (default 1 MiB) is
    not reported (splitting it would only add tiny collectives), nor is an FSDP2 root sharded
    with an explicit `reshard_after_forward=True`, nor a root lighter than one block in a plan
    whose units are finer than the blocks (every `Linear` a unit: that is FSD102's finding).

    ## Why is this bad?
    FSDP never reshards the root after forward (FSDP1 never does; FSDP2 does not by default):
    its parameters are all-gathered before the first block and stay unsharded until the end of
    backward. A root heavier than a block therefore sets the peak memory on every rank, and the
    per-block wrapping buys less than it seems. With large vocabularies (32K-256K tokens) the
    embedding and head often outweigh several blocks.

    ## Example
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)  # keeps embed (32000 x 4096) and head (4096 x 32000) unsharded
    ```

    ## Fix
    ```python
    fully_shard(model.embed)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard([model.norm, model.head])
    fully_shard(model)
    ```
    """

    code = "FSD104"
    name = "heavy-root-unit"
    severity = "warning"
    summary = "the root unit (embeddings, head, norms) is larger than the largest block unit"

    VALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
fully_shard(model.embed)
for layer in model.layers:
    fully_shard(layer)
fully_shard([model.norm, model.head])
fully_shard(model)
''', note="torchtitan-style grouping"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM(vocab=256)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', note="small vocabulary: the root is lighter than a block"),
    ]
    INVALID = [
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', options=_SMALL_DEVICE, note="a 16 MB root on a 64 MiB device: a warning"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', note="the same root on an H100: below 5 % of it, info"),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(LM(), auto_wrap_policy=ModuleWrapPolicy({Block}))
'''),
        Example(_MODEL + '''
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
model = FSDP(LM(tied=True), auto_wrap_policy=ModuleWrapPolicy({Block}))
''', note="FSDP1 with a tied head: info"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = LM(tied=True)
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
''', options=_SMALL_DEVICE, note="FSDP2 with a tied head: one group for both"),
    ]

    def check(self, ctx):
        plan, layout, settings = ctx.plan, ctx.layout, ctx.settings
        if plan.origin not in ("file", "cli") or not plan.root_wrapped or plan.sharding_strategy == "NO_SHARD":
            return
        root = plan.root_unit
        rl = layout.for_unit(root) if root is not None else None
        if rl is None or not rl.numel:
            return
        if plan.api == "fsdp2" and root.reshard_after_forward_explicit and root.reshard_after_forward:
            return
        others = [ul for ul in layout.units if not ul.unit.is_root and ul.numel]
        if not others:
            return  # one unit for everything: FSD101
        root_bytes = rl.unsharded_bytes
        largest = max(others, key=lambda ul: ul.unsharded_bytes)
        if root_bytes <= largest.unsharded_bytes or root_bytes < settings.collective_floor_bytes:
            return
        if root_bytes <= self._block_bytes(ctx):
            return  # no heavier than one block: the units are finer than the blocks (FSD102's)
        yield self._finding(ctx, root, rl, largest, others)

    @staticmethod
    def _block_bytes(ctx) -> int:
        """All-gathered bytes of the largest block unit of the per-block plan (0: no block)."""
        alt, alt_layout = per_block_layout(ctx)
        if alt_layout is None:
            return 0
        return max((ul.unsharded_bytes for ul in alt_layout.units if not ul.unit.is_root), default=0)

    # ------------------------------------------------------------------------------------
    def _tops(self, tree, owned: Set[str], root_params: List[str]) -> Dict[str, List[str]]:
        """The largest sub-modules (not the root, not containers) all of whose parameters the root
        owns, each with those of `root_params` under it; "" collects parameters registered on the
        root itself. A container whose parameters the root owns is passed through (a top holds
        the blocks of its own `ModuleList`)."""
        tops: Dict[str, List[str]] = {}
        cache: Dict[str, bool] = {}

        def all_owned(fqn: str) -> bool:
            if fqn not in cache:
                cache[fqn] = bool(fqn) and all(p in owned for p in tree.params_under(fqn))
            return cache[fqn]

        def movable(fqn: str) -> bool:
            return tree.modules[fqn].has_forward and all_owned(fqn)

        for p in root_params:
            for alias in tree.params[p].all_fqns:       # a tied weight sits in every module using it
                owner = alias.rpartition(".")[0]
                top = ""
                if owner and owner in tree.modules and movable(owner):
                    top = up = owner
                    while tree.modules[up].parent and all_owned(tree.modules[up].parent):
                        up = tree.modules[up].parent
                        if movable(up):
                            top = up
                if p not in tops.setdefault(top, []):
                    tops[top].append(p)
        return tops

    @staticmethod
    def _blocks_left(tree, owned: Set[str]) -> Dict[str, List[str]]:
        """Instances of the model's repeated blocks whose parameters all stay in the root, each with
        its parameters (pre-order)."""
        instances = tree.instances_of(tree.repeated_blocks())
        inside: Dict[str, List[str]] = {b: [] for b in instances}
        for alias, canonical in tree.alias_to_canonical.items():
            up = alias.rpartition(".")[0]
            while up and up not in inside:
                up = up.rpartition(".")[0]
            if up:
                inside[up].append(canonical)
        return {b: inside[b] for b in instances if inside[b] and all(p in owned for p in inside[b])}

    def _finding(self, ctx, root, rl, largest, others):
        from fsdp_lint.humanize import human_bytes, human_count

        plan, tree = ctx.plan, ctx.tree
        owned = set(root.params)
        # whole blocks left in the root (a second tower) become units of their own, one per block
        left_params = self._blocks_left(tree, owned)
        left = list(left_params)
        in_left = {p for ps in left_params.values() for p in ps}
        rest = [p for p in root.params if p not in in_left]
        tops = self._tops(tree, owned, rest)
        stuck = tops.pop("", [])
        order = {f: i for i, f in enumerate(tree.modules)}
        # a top whose parameters are read outside it (the root's own code, a head holding the
        # embedding in a plain attribute) must stay with its reader: in the root, or grouped (FSD402)
        readers = {t: {r for _, r in reads_outside(ctx, t)} for t in tops}
        pinned: Dict[str, Set[str]] = {}
        for t in [t for t in tops if readers[t]]:
            if any(not any(r == o or tree.is_ancestor(o, r) for o in tops) for r in readers[t]):
                pinned[t] = readers[t]
                tops.pop(t)
        movable = sorted(tops, key=lambda f: order[f])
        size = {t: sum(tree.params[p].numel for p in tops[t]) for t in movable}

        # where each top sits relative to the other units: before them (inputs) or after (outputs)
        positions = [order[m] for ul in others for m in ul.unit.modules if m in order]
        lo, hi = min(positions), max(positions)
        side = {t: "input" if order[t] < lo else "output" if order[t] > hi else "middle" for t in movable}

        # tied weights: top modules that share a parameter must stay in one unit
        top_of_alias: Dict[str, str] = {}
        for t in movable:
            prefix = t + "."
            for alias, canonical in tree.alias_to_canonical.items():
                if alias.startswith(prefix) and canonical in owned:
                    top_of_alias[alias] = t
        ties: List[Set[str]] = []
        tied_names: List[str] = []
        for t in movable:
            for p, r in reads_outside(ctx, t):
                other = next((o for o in movable if r == o or tree.is_ancestor(o, r)), None)
                if other is not None and other != t:
                    ties.append({t, other})
                    tied_names.append(f"{p} read by {r}")
        for p in rest:
            holders = {top_of_alias.get(a, "") for a in tree.params[p].all_fqns}
            if len(holders) > 1:
                ties.append(holders)
                tied_names.append(" = ".join(tree.params[p].all_fqns))

        parts = ", ".join(f"`{t}` {human_count(size[t])}" for t in sorted(movable, key=lambda t: -size[t])[:5])
        if left:
            classes = sorted({tree.modules[b].cls for b in left})
            numel = sum(tree.params[p].numel for p in in_left)
            parts = f"{len(left)} {block_label(classes)} blocks {human_count(numel)}" + (", " + parts if parts else "")
        if stuck:
            stuck_numel = sum(tree.params[p].numel for p in stuck)
            parts += f", {len(stuck)} parameter(s) of the root itself ({human_count(stuck_numel)})"
        for t, who in pinned.items():
            names = ", ".join(f"`{r}`" if r else "the root's own forward" for r in sorted(who))
            parts += f", `{t}` (read by {names}: it stays with its reader)"
        ratio = rl.unsharded_bytes / max(1, largest.unsharded_bytes)
        held = "FSDP1 never reshards the root" if plan.api == "fsdp1" else "FSDP2 does not reshard the root"
        msg = (f"the root unit keeps {human_count(rl.numel)} parameters of its own: "
               f"{human_bytes(rl.unsharded_bytes)} unsharded through forward and backward, {ratio:.3g}x the largest "
               f"other unit")
        detail = (f"its own parameters: {parts}; {human_bytes(rl.unsharded_bytes)} unsharded from the first forward "
                  f"to the end of backward ({held} after forward), {ratio:.3g}x the largest other unit "
                  f"`{largest.unit.module}` ({human_bytes(largest.unsharded_bytes)})")
        severity = None
        if not movable and not left:
            fix = "the root's own parameters cannot move to a sub-module unit; register them in a sub-module"
        elif plan.api == "fsdp1":
            fix, split = self._fsdp1_fix(ctx, movable, ties, others, left)
            if split:
                severity = "info"
                detail += (f"; the weight tied across them ({'; '.join(tied_names)}) cannot leave the root without being "
                        f"split between FSDP1 units, so this root is the price of the tie")
        else:
            fix = self._fsdp2_fix(tree, movable, side, ties, left)
        from fsdp_lint.plan.budget import budget_for, share_text

        budget = budget_for(ctx.layout.memory, settings_of(ctx))
        share = budget.share(rl.unsharded_bytes)
        detail += f"; {share_text(share)} of the usable memory of the device ({budget.device})"
        if severity is None and share < settings_of(ctx).memory_info_share:
            severity = "info"     # a cost the device absorbs: reported, not a gate failure
        return self.finding(ctx, msg, **where(ctx, root.path, root.line, root.col), module="", fix=fix,
                            detail=detail, severity=severity, root_bytes=rl.unsharded_bytes, device_share=share, largest_unit=largest.unit.module,
                            largest_bytes=largest.unsharded_bytes, movable=movable, blocks_left=left)

    @staticmethod
    def _merge(groups: List[List[str]], ties: List[Set[str]]) -> List[List[str]]:
        for tie in ties:
            hit = [g for g in groups if tie & set(g)]
            if len(hit) > 1:
                merged = [m for g in hit for m in g]
                groups = [g for g in groups if g not in hit] + [merged]
        return groups

    def _fsdp2_fix(self, tree, movable, side, ties, left) -> str:
        order = {f: i for i, f in enumerate(tree.modules)}
        inputs = [t for t in movable if side[t] == "input"]
        outputs = [t for t in movable if side[t] == "output"]
        middle = [[t] for t in movable if side[t] == "middle"]
        groups = ([inputs] if inputs else []) + middle + ([outputs] if outputs else [])
        groups = self._merge(groups, ties)
        groups = [sorted(g, key=lambda f: order[f]) for g in groups]

        def call(g: List[str]) -> str:
            if len(g) == 1:
                return f"fully_shard({tree.expr(g[0])})"
            return "fully_shard([" + ", ".join(tree.expr(m) for m in g) + "])"

        before = [call(g) for g in groups if all(side[m] == "input" for m in g)]
        after = [call(g) for g in groups if not all(side[m] == "input" for m in g)]
        out = []
        if before:
            out.append("`" + "`, `".join(before) + "` before the blocks")
        if after:
            out.append("`" + "`, `".join(after) + "` after them")
        rest = " and ".join(out)
        if not left:
            return f"shard them as groups of their own: {rest}, then `fully_shard(model)`"
        header, var = block_loop(tree, tree.repeated_blocks(), left)
        loop = f"`{header} fully_shard({var})`".replace("\n", " ")
        if not groups:
            return f"shard the blocks left in the root, {loop}, then `fully_shard(model)`"
        return (f"shard the blocks left in the root, {loop}, then the rest as groups of their own: {rest}, then "
                f"`fully_shard(model)`")

    def _fsdp1_fix(self, ctx, movable, ties, others, left=()):
        """(fix, splits_a_tie): FSDP1 units are single modules; tied tops must share one."""
        tree, plan = ctx.tree, ctx.plan
        units: List[str] = list(movable)
        split = False
        for tie in ties:
            members = [t for t in tie if t]
            lca = members[0]
            for m in members[1:]:
                while lca and not (m == lca or tree.is_ancestor(lca, m)):
                    lca = tree.modules[lca].parent or ""
            taken = [m for ul in others for m in ul.unit.modules]
            if not lca or any(m == lca or tree.is_ancestor(lca, m) for m in taken):
                split = True
                units = [u for u in units if u not in members]
                continue
            units = [u for u in units if u not in members and not tree.is_ancestor(lca, u)] + [lca]
        keep = ""
        if split:
            tied = sorted({t for tie in ties for t in tie if t}, key=lambda f: list(tree.modules).index(f))
            group = "fully_shard([" + ", ".join(tree.expr(t) for t in tied) + "])"
            keep = (f"keep the tie in the root (FSDP1 cannot split it), untie the weights, or move to FSDP2, "
                    f"whose `{group}` holds tied modules in one group that reshards after forward")
            if not left:
                return keep, True
            # blocks left in the root can still leave it: the root is heavier than the tie makes it
        exprs = [tree.expr(u) for u in units]
        classes = sorted({ul.unit.cls for ul in others})
        blocks = sorted({tree.modules[b].cls for b in left} - set(classes[:2]))
        if plan.policies or left:
            cond = " or ".join([f"isinstance(m, {c})" for c in classes[:2] + blocks] + [f"m is {e}" for e in exprs])
            fix = (f"make them units of their own: `auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, "
                   f"lambda_fn=lambda m: {cond})`")
        else:
            fix = "wrap them before the root: " + "; ".join(f"`{e} = FSDP({e}, ...)`" for e in exprs)
        return (f"{fix}; for the tied weight, {keep}" if keep else fix), False
