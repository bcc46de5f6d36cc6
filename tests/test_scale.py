"""Scale (issue 10 §5): the indexed walks give what their definitions give, on real models.

The analysis looks ancestors up by FQN and subtrees up by an index instead of pairwise walks
(`ModuleTree.subtree`, `aliases_under`, `params_under`, `nearest_ancestor_in`, `subtree_numels`;
`fsdp_lint.model.modwalk` for the replay's walks). Each is compared here with its plain definition -- the
slow code it replaced -- on models with tied weights, a module shared at two paths, a container and
deep nesting. How fast they are is measured in ``benchmarks/bench_scale.py``, not here.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn

from fsdp_lint.model import modwalk
from fsdp_lint.model.tree import build_module_tree


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)


class Tied(nn.Module):
    def __init__(self, layers=3, dim=8):
        super().__init__()
        self.embed = nn.Embedding(16, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.shared = Block(dim)
        self.blocks.append(self.shared)          # the same module at two paths
        self.head = nn.Linear(dim, 16, bias=False)
        self.head.weight = self.embed.weight     # tied weights
        self.scale = nn.Parameter(torch.ones(1))


class Level(nn.Module):
    def __init__(self, inner=None, dim=4):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.inner = inner


def _deep(depth):
    model = None
    for _ in range(depth):
        model = Level(model)
    return model


def _models():
    with torch.device("meta"):
        return {"tied": Tied(), "deep": _deep(120), "sequential": nn.Sequential(Block(), nn.ReLU(), Block())}


def _is_ancestor(a, f):
    return a != f and (a == "" or f.startswith(a + "."))


@pytest.mark.parametrize("name", ["tied", "deep", "sequential"])
def test_indexed_walks_equal_their_definitions(name):
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000))
    model = _models()[name]
    tree = build_module_tree(model)
    names = list(tree.modules)
    aliases = list(tree.alias_to_canonical)
    for fqn in names + ["not.a.module"]:
        prefix = fqn + "."
        assert [i.fqn for i in tree.subtree(fqn)] == [
            n for n in names if fqn == "" or n == fqn or n.startswith(prefix)], fqn
        assert tree.aliases_under(fqn) == [a for a in aliases if fqn == "" or a.startswith(prefix)], fqn
        expected, seen = [], set()
        for a in aliases:
            c = tree.alias_to_canonical[a]
            if (fqn == "" or a.startswith(prefix)) and c not in seen:
                seen.add(c)
                expected.append(c)
        assert tree.params_under(fqn) == expected, fqn
        assert set(tree.ancestors(fqn)) == {a for a in names + [""] if _is_ancestor(a, fqn)} | (
            {a for a in _string_ancestors(fqn)} if fqn not in tree.modules else set())
    some = set(names[::3])
    for fqn in names:
        found = tree.nearest_ancestor_in(fqn, some)
        candidates = [a for a in some if _is_ancestor(a, fqn)]
        assert found == (max(candidates, key=len) if candidates else None), fqn
    # subtree sizes: a tied tensor once per subtree
    numels = tree.subtree_numels()
    for fqn in names:
        ids = {id(p): p.numel() for p in model.get_submodule(fqn).parameters()}
        assert numels[fqn] == sum(ids.values()), fqn


def _string_ancestors(fqn):
    out = []
    while fqn:
        fqn = fqn.rpartition(".")[0]
        out.append(fqn)
    return out


@pytest.mark.parametrize("name", ["tied", "deep", "sequential"])
def test_modwalk_is_named_parameters(name):
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000))
    model = _models()[name]
    for m in [model] + [m for _, m in model.named_modules()][:40]:
        assert [(n, id(p)) for n, p in modwalk.named_parameters(m)] == [(n, id(p)) for n, p in m.named_parameters()]
        assert [id(p) for p in modwalk.parameters(m)] == [id(p) for p in m.parameters()]


def test_modwalk_leaves_overridden_walks_to_the_class():
    class Filtered(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def named_parameters(self, *args, **kwargs):     # e.g. a wrapper that hides frozen parts
            return ((n, p) for n, p in super().named_parameters(*args, **kwargs) if n.startswith("a."))

    m = nn.Sequential(Filtered())
    assert [n for n, _ in modwalk.named_parameters(m[0])] == ["a.weight", "a.bias"]
    # without a unit wrapped before (`a`), as torch's walk of the Sequential gives it
    assert [n for n, _ in modwalk.named_parameters(m, {id(m[0].a)})] == ["0.b.weight", "0.b.bias"]


@pytest.mark.parametrize("name", ["tied", "deep", "sequential"])
def test_modwalk_stops_at_units_wrapped_before(name):
    """A wrap call walks its subtree without entering units wrapped before (FSDP2 leaves their parameters
    to them): the parameters, names and order of torch's walk of the modules reached that way."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000))
    model = _models()[name]
    inner = [m for _, m in model.named_modules()][1::3][:20]
    stop = {id(m) for m in inner}

    def torch_walk_without(root):
        stopped = [n + "." for n, m in root.named_modules(remove_duplicate=False) if m is not root and id(m) in stop]
        out, seen = [], set()
        for n, p in root.named_parameters(remove_duplicate=False):
            if id(p) not in seen and not any(n.startswith(s) for s in stopped):
                seen.add(id(p))
                out.append((n, id(p)))
        return out

    for root in [model] + inner[:5]:
        assert [(n, id(p)) for n, p in modwalk.named_parameters(root, stop)] == torch_walk_without(root)
