"""Helpers the granularity rules (FSD101-FSD105, FSD601) share: the per-block alternative in the user's
terms, where a finding points, and the example model of their VALID/INVALID lists.
"""
from typing import Optional, Tuple

_MODEL = '''
import torch.nn as nn

class Block(nn.Module):
    def __init__(self, dim=256):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(self.norm(x)).relu())

class Net(nn.Module):
    def __init__(self, dim=256, layers=8):
        super().__init__()
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
'''


# --------------------------------------------------------------------------------------------
# shared helpers (FSD101-FSD105)
# --------------------------------------------------------------------------------------------
def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "0%"


def managed_numel(ctx) -> int:
    """Elements FSDP manages: the model minus ignored parameters."""
    tree = ctx.tree
    return tree.numel - sum(tree.params[p].numel for p in ctx.plan.ignored_params)


def per_block_layout(ctx, block: Optional[str] = None):
    """(plan, layout) of the per-block alternative to ctx.plan, or (None, None)."""
    from fsdp_lint.layout import compute_layout
    from fsdp_lint.plan import per_block_plan

    alt = per_block_plan(ctx.tree, ctx.plan, block)
    if alt is None:
        return None, None
    return alt, compute_layout(alt, ctx.tree)


def block_loop(tree, block: str) -> Tuple[str, str]:
    """(loop header, variable) that visits every instance of `block` in user code."""
    instances = tree.instances_of(block)
    parents = {tree.modules[f].parent for f in instances}
    if len(parents) == 1:
        parent = next(iter(parents))
        info = tree.modules.get(parent)
        is_container = info is not None and any(c in info.mro for c in ("ModuleList", "ModuleDict", "Sequential"))
        if parent and is_container and sorted(info.children) == sorted(instances):
            it = tree.expr(parent) + (".values()" if "ModuleDict" in info.mro else "")
            return f"for block in {it}:", "block"
    return f"for m in model.modules():\n    if isinstance(m, {block}):", "m"


def block_wrap_fix(tree, api: Optional[str], block: str) -> str:
    """How to make every `block` a unit, in the API the file uses."""
    if api == "fsdp1":
        return (f"`auto_wrap_policy=ModuleWrapPolicy({{{block}}})` (or `functools.partial("
                f"transformer_auto_wrap_policy, transformer_layer_cls={{{block}}})`): one unit per {block}")
    header, var = block_loop(tree, block)
    header = header.replace("\n", " ")
    return f"`{header} fully_shard({var})` before `fully_shard(model)`: one group per {block}"


def model_line(ctx) -> int:
    """Line of the model class in the linted file (where a `--wrap` plan's findings point), else 1."""
    for name, line in getattr(ctx.facts, "module_classes", None) or []:
        if name == ctx.tree.root_class:
            return line
    return 1


def where(ctx, path: str, line: int, col: int = 1) -> dict:
    """`finding()` keywords for a wrap call, policy or unit position; plans from `--wrap` (path
    `<cli>`) point at the model class."""
    if not path or path.startswith("<") or not line:
        return {"path": ctx.path, "line": model_line(ctx), "col": 1}
    return {"path": path, "line": line, "col": col or 1}


def largest_submodule(tree) -> Tuple[str, int]:
    sizes = tree.subtree_numels()
    best = max((f for f in sizes if f), key=lambda f: sizes[f], default="")
    return best, sizes.get(best, 0)
