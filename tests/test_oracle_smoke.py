"""Smoke tests for tests/oracle.py: real FSDP1/FSDP2 under the fake process group.

The numbers are the reference article's (DESIGN.md §5): a TransformerBlock unit holds
3,152,384 params; on 4 ranks each FSDP1 shard holds 788,096; rank 0's shard is
norm1.*, all of self_attn.in_proj_weight and 640 elements of self_attn.in_proj_bias.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import fake_pg, fsdp1_units, fsdp2_groups, raises  # noqa: E402

from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy  # noqa: E402


class TransformerBlock(nn.Module):
    def __init__(self, hidden_dim=512, num_heads=8, ffn_dim=2048):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.self_attn = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden_dim)
        self.ffn = nn.Sequential(
            nn.Linear(hidden_dim, ffn_dim), nn.GELU(), nn.Linear(ffn_dim, hidden_dim)
        )

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, need_weights=False)[0]
        return x + self.ffn(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, num_layers=12, hidden_dim=512, num_heads=8, ffn_dim=2048):
        super().__init__()
        self.layers = nn.ModuleList(
            [TransformerBlock(hidden_dim, num_heads, ffn_dim) for _ in range(num_layers)]
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


BLOCK_NUMEL = 3_152_384
SHARD_NUMEL_4 = 788_096
BLOCK_PARAMS = [
    "norm1.weight",
    "norm1.bias",
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "norm2.weight",
    "norm2.bias",
    "ffn.0.weight",
    "ffn.0.bias",
    "ffn.2.weight",
    "ffn.2.bias",
]
POLICY = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={TransformerBlock})


def two_layers():
    return Transformer(num_layers=2)


def one_layer():
    return Transformer(num_layers=1)


@pytest.fixture(scope="module")
def fsdp1_rank0():
    return fsdp1_units(two_layers, world_size=4, rank=0, auto_wrap_policy=POLICY, use_orig_params=True)


def test_fsdp1_article_block_units(fsdp1_rank0):
    units = fsdp1_rank0
    # The root Transformer owns no params of its own -> no FlatParameter -> omitted.
    assert [u["module"] for u in units] == ["layers.0", "layers.1"]
    for i, u in enumerate(units):
        assert u["params"] == [f"layers.{i}.{p}" for p in BLOCK_PARAMS]
        assert u["numel"] == BLOCK_NUMEL
        assert u["padded_numel"] == BLOCK_NUMEL  # every param numel is a multiple of 4
        assert u["shard_numel"] == SHARD_NUMEL_4
        assert u["dtype"] == "float32" and u["requires_grad"] is True
        assert u["sharding_strategy"] == "FULL_SHARD"
        assert None not in [fqn for fqn, _ in u["layout"]]  # no padding needed


def test_fsdp1_article_rank0_shard(fsdp1_rank0):
    spans = fsdp1_rank0[0]["spans"]
    assert spans == [
        ["layers.0.norm1.weight", 0, 512],
        ["layers.0.norm1.bias", 0, 512],
        ["layers.0.self_attn.in_proj_weight", 0, 3 * 512 * 512],
        ["layers.0.self_attn.in_proj_bias", 0, 640],
    ]
    assert sum(end - start for _, start, end in spans) == SHARD_NUMEL_4


@pytest.mark.parametrize("use_orig_params", [True, False])
def test_fsdp1_shards_tile_the_unit(use_orig_params):
    """Every rank holds 788,096 elements and the four shards tile each param exactly."""
    covered: dict[str, list[tuple[int, int]]] = {}
    for rank in range(4):
        (unit,) = fsdp1_units(one_layer, world_size=4, rank=rank, auto_wrap_policy=POLICY,
                              use_orig_params=use_orig_params)
        assert unit["shard_numel"] == SHARD_NUMEL_4
        assert sum(e - s for _, s, e in unit["spans"]) == SHARD_NUMEL_4
        for fqn, s, e in unit["spans"]:
            covered.setdefault(fqn, []).append((s, e))
    block = TransformerBlock()
    for name, p in block.named_parameters():
        ranges = sorted(covered[f"layers.0.{name}"])
        assert ranges[0][0] == 0 and ranges[-1][1] == p.numel()
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_fsdp1_padding_and_uneven_world_size():
    mk = lambda: nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1))  # numels 15, 5, 5, 1 = 26
    (u,) = fsdp1_units(mk, world_size=4, rank=3, use_orig_params=True)
    # 16-byte alignment (4 fp32 elements) before each param, then pad to a multiple of 4
    assert u["layout"] == [["0.weight", 15], [None, 1], ["0.bias", 5], [None, 3],
                           ["1.weight", 5], [None, 3], ["1.bias", 1], [None, 3]]
    assert (u["numel"], u["padded_numel"], u["shard_numel"]) == (26, 36, 9)
    (u,) = fsdp1_units(mk, world_size=4, rank=3, use_orig_params=False)
    # no alignment; the shard is ceil(26/4)=7 and the last rank is padded by 2
    assert u["layout"] == [["0.weight", 15], ["0.bias", 5], ["1.weight", 5], ["1.bias", 1]]
    assert (u["padded_numel"], u["shard_numel"], u["shard_padding"]) == (28, 7, 2)
    assert u["spans"] == [["1.weight", 1, 5], ["1.bias", 0, 1]]


def test_fsdp1_world_size_1_is_no_shard():
    mk = lambda: nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1))
    with pytest.warns(UserWarning, match="switching to use `NO_SHARD`"):
        (u,) = fsdp1_units(mk, world_size=1, use_orig_params=True)
    assert u["sharding_strategy"] == "NO_SHARD"
    assert (u["padded_numel"], u["shard_numel"]) == (33, 33)  # still flattened + aligned


def test_fsdp1_mixed_requires_grad_raises_and_repeats():
    def frozen():
        m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        m[0].weight.requires_grad_(False)
        return m

    e = raises(lambda: fsdp1_units(frozen, world_size=2, use_orig_params=False))
    assert isinstance(e, ValueError)
    assert "uniform `requires_grad` when `use_orig_params=False`" in str(e)
    assert not dist.is_initialized()  # the fake group was torn down despite the error
    (u,) = fsdp1_units(frozen, world_size=2, use_orig_params=True)  # allowed, no warning
    assert u["requires_grad"] is True and u["numel"] == 16
    assert raises(lambda: None) is None


def test_fsdp2_article_groups():
    def apply(model, mesh):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    groups = fsdp2_groups(two_layers, world_size=4, rank=0, apply=apply)
    assert [g["modules"] for g in groups] == [["layers.0"], ["layers.1"], [""]]
    assert groups[2]["params"] == []  # the root owns nothing
    block = groups[0]["params"]
    # FSDP2 order is module post-order: out_proj (child) before in_proj (MHA's own)
    assert [p["fqn"] for p in block] == [f"layers.0.{n}" for n in [
        "norm1.weight", "norm1.bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "norm2.weight", "norm2.bias",
        "ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias"]]
    by = {p["fqn"].removeprefix("layers.0."): p for p in block}
    assert by["self_attn.in_proj_weight"]["shape"] == [1536, 512]
    assert by["self_attn.in_proj_weight"]["local_shape"] == [384, 512]
    assert by["norm1.weight"]["local_shape"] == [128]
    numel = lambda s: int(torch.Size(s).numel())
    assert sum(numel(p["shape"]) for p in block) == BLOCK_NUMEL
    assert sum(numel(p["local_shape"]) for p in block) == SHARD_NUMEL_4
    assert all(p["dtype"] == "float32" and p["requires_grad"] for p in block)


def test_fsdp2_uneven_dim0():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(5, 3))
            self.b = nn.Parameter(torch.zeros(5))

    got = []
    for rank in range(4):
        (g,) = fsdp2_groups(Odd, world_size=4, rank=rank, apply=lambda m, mesh: fully_shard(m, mesh=mesh))
        got.append([p["local_shape"] for p in g["params"]])
        assert [p["padded_local_shape"] for p in g["params"]] == [[2, 3], [2]]
    # torch.chunk semantics: ceil(5/4)=2 rows per rank, the last rank gets none
    assert got == [[[2, 3], [2]], [[2, 3], [2]], [[1, 3], [1]], [[0, 3], [0]]]


def test_fsdp2_errors():
    e = raises(lambda: fsdp2_groups(one_layer, world_size=2, apply=lambda m, mesh: fully_shard(m.layers, mesh=mesh)))
    assert isinstance(e, ValueError) and "does not support containers" in str(e)

    def twice(m, mesh):
        fully_shard(m.layers[0], mesh=mesh)
        fully_shard(m.layers[0], mesh=mesh)

    e = raises(lambda: fsdp2_groups(one_layer, world_size=2, apply=twice))
    assert isinstance(e, AssertionError) and "can only be applied to a module once" in str(e)


def test_fake_pg_direct():
    with fake_pg(8, 5):
        assert (dist.get_world_size(), dist.get_rank()) == (8, 5)
    assert not dist.is_initialized()


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.lm_head = nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.embed.weight


def test_tied_params():
    # FSDP1, same unit: the shared weight is flattened once, under its first name
    (u,) = fsdp1_units(TiedLM, world_size=2)
    assert u["params"] == ["embed.weight", "body.weight", "body.bias"] and u["numel"] == 60
    # FSDP2, same group: once as well
    (g,) = fsdp2_groups(TiedLM, world_size=2, apply=lambda m, mesh: fully_shard(m, mesh=mesh))
    assert [p["fqn"] for p in g["params"]] == ["embed.weight", "body.weight", "body.bias"]

    # FSDP2, split across groups: fully_shard accepts it; the first forward's lazy init raises
    def split(m, mesh):
        fully_shard(m.embed, mesh=mesh)
        fully_shard(m.lm_head, mesh=mesh)
        fully_shard(m, mesh=mesh)

    groups = fsdp2_groups(TiedLM, world_size=2, apply=split)
    assert [[p["fqn"] for p in g["params"]] for g in groups] == [
        ["embed.weight"], ["lm_head.weight"], ["body.weight", "body.bias"]]
    e = raises(lambda: fsdp2_groups(TiedLM, world_size=2, apply=split, lazy_init=True))
    assert isinstance(e, ValueError)
    assert "Parameter 'lm_head.weight' is shared with a parameter already managed" in str(e)
