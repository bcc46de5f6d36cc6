"""Helpers the granularity rules (FSD101-FSD105, FSD601) share: the per-block alternative in the user's
terms, where a finding points, and the example model of their VALID/INVALID lists.
"""
from typing import Dict, List, Optional, Tuple

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


def block_label(blocks) -> str:
    """The block class(es) in a sentence: ``Block``, ``EncoderLayer/DecoderLayer``."""
    return blocks if isinstance(blocks, str) else "/".join(blocks)


def _class_set(blocks) -> str:
    return "{" + ", ".join([blocks] if isinstance(blocks, str) else blocks) + "}"


def per_block_layout(ctx, block=None):
    """(plan, layout) of the per-block alternative to ctx.plan (`block`: a class or several;
    default: the model's repeated blocks), or (None, None)."""
    from fsdp_lint.plan.layout import compute_layout
    from fsdp_lint.plan.alternatives import per_block_plan

    alt = per_block_plan(ctx.tree, ctx.plan, block)
    if alt is None:
        return None, None
    return alt, compute_layout(alt, ctx.tree)


def block_loop(tree, block, instances=None) -> Tuple[str, str]:
    """(loop header, variable) that visits every instance of `block` (a class or several; or only
    `instances` of it) in user code: the containers that hold exactly those instances, or an
    `isinstance` walk (a list of the instances when only some are meant)."""
    some = instances is not None
    instances = list(instances) if some else tree.instances_of(block)
    by_parent: Dict[str, List[str]] = {}
    for f in instances:
        by_parent.setdefault(tree.modules[f].parent, []).append(f)
    its = []
    for parent, kids in by_parent.items():
        info = tree.modules.get(parent)
        is_container = info is not None and any(c in info.mro for c in ("ModuleList", "ModuleDict", "Sequential"))
        if not (parent and is_container and sorted(info.children) == sorted(kids)):
            its = []
            break
        its.append(tree.expr(parent) + (".values()" if "ModuleDict" in info.mro else ""))
    if len(its) == 1:
        return f"for block in {its[0]}:", "block"
    if its and (len(its) == 2 or some):  # two stacks (encoder and decoder, two towers)
        return "for block in [" + ", ".join(f"*{it}" for it in its) + "]:", "block"
    if some:
        return "for block in [" + ", ".join(tree.expr(f) for f in instances) + "]:", "block"
    names = [block] if isinstance(block, str) else list(block)
    cls = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    return f"for m in model.modules():\n    if isinstance(m, {cls}):", "m"


def block_wrap_fix(tree, api: Optional[str], block) -> str:
    """How to make every `block` (a class or several) a unit, in the API the file uses."""
    label, classes = block_label(block), _class_set(block)
    if api == "fsdp1":
        return (f"`auto_wrap_policy=ModuleWrapPolicy({classes})` (or `functools.partial("
                f"transformer_auto_wrap_policy, transformer_layer_cls={classes})`): one unit per {label}")
    header, var = block_loop(tree, block)
    header = " ".join(header.split())
    return f"`{header} fully_shard({var})` before `fully_shard(model)`: one group per {label}"


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
