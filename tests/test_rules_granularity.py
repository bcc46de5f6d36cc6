"""Granularity rules FSD101-FSD105 and FSD601 on realistic files, checked against real torch.

* every bad fixture fires its rule at the line of the wrap call or policy, on the right module;
* the correct plans (the article's two files, every idiom fixture, incl. the torchtitan-style
  `fsdp2_list_group.py`) get no error or warning from these rules;
* the numbers and claims in the findings are what torch builds (tests/oracle.py, fake process
  group): the per-block alternative FSD101 compares with is the plan torch builds from the
  suggested policy, the class FSD103 reports as matching nothing really wraps nothing, the root
  FSD104 calls heavy is torch's root group, FSDP2 raises on FSD105's container (FSDP1 only warns),
  and the empty shards FSD601 lists are empty on those ranks.
"""
from __future__ import annotations

import ast
import functools
import glob
import importlib.util
import os
import sys
import warnings

import pytest
import torch
import torch.nn as nn

from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file

sys.path.insert(0, os.path.dirname(__file__))
import oracle  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = os.path.join(ROOT, "fixtures", "bad")
MINE = ("FSD101", "FSD102", "FSD103", "FSD104", "FSD105", "FSD601")
CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------ helpers
@functools.lru_cache(maxsize=None)
def _lint(path: str, ws: int = 4):
    return lint_file(path, Settings(world_size=ws))


def _hits(path: str, code: str, ws: int = 4):
    return [f for f in _lint(path, ws).findings if f.code == code]


def _line_of(path: str, needle: str) -> int:
    """Line of the first code line (after the module docstring) that starts with `needle`."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    body = ast.parse(text).body
    start = body[0].end_lineno if body and isinstance(body[0], ast.Expr) else 0
    for i, line in enumerate(text.splitlines(), start=1):
        if i > start and line.strip().startswith(needle):
            return i
    raise AssertionError(f"{needle!r} not found in {path}")


@functools.lru_cache(maxsize=None)
def _module(path: str):
    """Import a fixture (its training code sits behind `if __name__ == "__main__"`)."""
    name = "granularity_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bad(name: str) -> str:
    return os.path.join(BAD, name)


# ------------------------------------------------------------------ each bad fixture, its rule
CASES = [
    # file, code, severity, line needle, module, world size
    ("fsdp1_no_policy.py", "FSD101", "error", "model = FSDP(model", "", 4),
    ("fsdp1_size_default.py", "FSD101", "error", "model = FSDP(", "", 4),
    ("fsdp1_wrong_class.py", "FSD101", "error", "model = FSDP(", "", 4),
    ("fsdp1_every_linear.py", "FSD102", "warning", "model = FSDP(model, auto_wrap_policy=", "h.0.attn.q", 4),
    ("fsdp1_wrong_class.py", "FSD103", "error", "model = FSDP(", "", 4),
    ("fsdp2_heavy_root.py", "FSD104", "info", "fully_shard(model,", "", 4),   # 4 MB root: below 5 % of an H100
    ("fsdp2_modulelist.py", "FSD105", "error", "fully_shard(model.layers", "layers", 4),
    ("fsdp2_uneven.py", "FSD601", "info", "fully_shard(layer", "moe_layers.0", 8),
]


@pytest.mark.parametrize("name,code,severity,needle,module,ws", CASES, ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_bad_fixture_fires_at_the_wrap_line(name, code, severity, needle, module, ws):
    path = _bad(name)
    hits = _hits(path, code, ws)
    assert len(hits) == 1, [(f.code, f.line, f.text) for f in _lint(path, ws).findings]
    f = hits[0]
    assert os.path.abspath(f.path) == os.path.abspath(path)
    assert f.line == _line_of(path, needle), f.text
    assert f.severity == severity
    assert f.module == module
    assert f.fix


def test_no_other_granularity_rule_fires_on_the_bad_fixtures():
    """Each bad fixture shows one mistake; the granularity rules do not pile up on it (FSD103's
    policy that matches nothing does make the whole model one unit: FSD101 too, by design)."""
    expected = {(c[0], c[1]) for c in CASES}
    for name in sorted({c[0] for c in CASES}):
        ws = 8 if name == "fsdp2_uneven.py" else 4
        got = {(name, f.code) for f in _lint(_bad(name), ws).findings if f.code in MINE and f.severity != "info"}
        assert got <= expected, got - expected


def test_root_sharded_first_is_fsd302s_not_a_whole_model_unit():
    path = _bad("fsdp2_root_first.py")
    assert not _hits(path, "FSD101")


# ------------------------------------------------------------------------ correct plans stay quiet
GOOD = sorted(glob.glob(os.path.join(ROOT, "fixtures", "article_fsdp*.py"))
              + glob.glob(os.path.join(ROOT, "fixtures", "idioms", "*.py")))


@pytest.mark.parametrize("path", GOOD, ids=[os.path.basename(p) for p in GOOD])
def test_correct_plans_get_no_error_or_warning(path):
    loud = [(f.code, f.line, f.text) for f in _lint(path, 4).findings
            if f.code in MINE and f.severity in ("error", "warning")]
    assert not loud


def test_torchtitan_plan_on_its_own_world_size():
    path = os.path.join(ROOT, "fixtures", "idioms", "fsdp2_list_group.py")
    assert not [f for f in _lint(path, 8).findings if f.code in MINE and f.severity != "info"]


# ---------------------------------------------------------------------------- FSD101 vs torch
def _fsdp1_peak(units, itemsize=4):
    """Peak unsharded bytes of a FSDP1 plan as DESIGN §5 counts it, from torch's FlatParameters:
    the root's, plus the largest other unit twice (prefetch)."""
    root = [u["padded_numel"] for u in units if u["module"] == ""]
    others = [u["padded_numel"] for u in units if u["module"] != ""]
    return itemsize * (sum(root) + (2 if len(others) > 1 else 1) * max(others, default=0))


def test_fsd101_peaks_are_the_ones_torch_builds():
    """The whole-model peak and the per-block peak in the finding come from the plans torch builds
    for the file (no policy) and for the suggested fix (`ModuleWrapPolicy({ResidualBlock})`)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    path = _bad("fsdp1_no_policy.py")
    (f,) = _hits(path, "FSD101")
    mod = _module(path)
    assert f.details["block"] == "ResidualBlock"
    assert "ModuleWrapPolicy({ResidualBlock})" in f.fix
    whole = oracle.fsdp1_units(mod.TinyLM, world_size=4, device_id=CPU)
    per_block = oracle.fsdp1_units(mod.TinyLM, world_size=4, device_id=CPU,
                                   auto_wrap_policy=ModuleWrapPolicy({mod.ResidualBlock}))
    assert [u["module"] for u in whole] == [""]
    assert f.details["peak_bytes"] == _fsdp1_peak(whole)
    assert f.details["per_block_peak_bytes"] == _fsdp1_peak(per_block)
    assert f.details["per_block_units"] == len(per_block)
    assert f.details["per_block_peak_bytes"] < f.details["peak_bytes"]


def test_fsd101_size_policy_default_wraps_nothing_in_torch():
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    path = _bad("fsdp1_size_default.py")
    (f,) = _hits(path, "FSD101")
    assert "min_num_params=100,000,000" in f.text and "EncoderBlock" in f.fix
    units = oracle.fsdp1_units(_module(path).SequenceRegressor, world_size=4, device_id=CPU,
                               auto_wrap_policy=size_based_auto_wrap_policy)
    assert [u["module"] for u in units] == [""]


def test_fsd101_a_policy_function_that_wraps_nothing_in_a_packaged_entry_point():
    """A src/ project whose FSDP1 policy function names another model's layer class: torch builds one
    unit of 100 % of the model. The blocks hold little of GPT-2's weight (the vocabulary does), but a
    policy that wraps nothing was meant to split the model: reported, with peaks torch builds."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    repo = os.path.join(ROOT, "fixtures", "repos", "gpt2_policy_fn")
    path = os.path.join(repo, "src", "gpt2_train", "train.py")
    (f,) = _hits(path, "FSD101", 8)
    assert "`decoder_layer_policy` wraps nothing" in f.text and "GPT2Block" in f.fix
    assert f.line == _line_of(path, "model = FSDP(")
    sys.path.insert(0, os.path.join(repo, "src"))
    try:
        from gpt2_train.policies import decoder_layer_policy
    finally:
        sys.path.pop(0)

    def build():
        return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4))

    whole = oracle.fsdp1_units(build, world_size=8, device_id=CPU, auto_wrap_policy=decoder_layer_policy)
    per_block = oracle.fsdp1_units(build, world_size=8, device_id=CPU, auto_wrap_policy=ModuleWrapPolicy({GPT2Block}))
    assert [u["module"] for u in whole] == [""]
    assert f.details["peak_bytes"] == _fsdp1_peak(whole)
    assert f.details["per_block_peak_bytes"] == _fsdp1_peak(per_block)


# ---------------------------------------------------------------------------- FSD102 vs torch
def test_fsd102_counts_torchs_units_and_the_per_block_plan():
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    path = _bad("fsdp1_every_linear.py")
    (f,) = _hits(path, "FSD102")
    mod = _module(path)
    assert "ModuleWrapPolicy({Layer})" in f.fix and "Layer" in f.text
    fine = oracle.fsdp1_units(mod.Model, world_size=4, device_id=CPU, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
    coarse = oracle.fsdp1_units(mod.Model, world_size=4, device_id=CPU, auto_wrap_policy=ModuleWrapPolicy({mod.Layer}))
    plan = _lint(path).plan
    assert [u.module for u in plan.units] == [u["module"] for u in fine]
    inside = [u for u in fine if u["module"].startswith("h.")]
    assert f.details["units_inside_block"] == len(inside)
    # per step: an all-gather in forward, one in backward (not for the root) and a reduce-scatter
    per_step = lambda units: sum(2 if u["module"] else 1 for u in units) + len(units)  # noqa: E731
    assert f.details["collectives_per_step"] == per_step(fine)
    assert f.details["per_block_collectives_per_step"] == per_step(coarse)
    assert str(per_step(fine)) in f.text and str(per_step(coarse)) in f.text


# ---------------------------------------------------------------------------- FSD103 vs torch
def test_fsd103_the_named_class_wraps_nothing_and_the_suggestion_wraps_the_blocks():
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    path = _bad("fsdp1_wrong_class.py")
    (f,) = _hits(path, "FSD103")
    assert "TransformerDecoderLayer" in f.text and "`DecoderLayer`" in f.text
    assert "transformer_layer_cls={DecoderLayer}" in f.fix
    mod = _module(path)
    model_cls = mod.DecoderOnlyLM
    named = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.TransformerDecoderLayer})
    suggested = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={mod.DecoderLayer})
    as_written = oracle.fsdp1_units(model_cls, world_size=2, device_id=CPU, auto_wrap_policy=named)
    fixed = oracle.fsdp1_units(model_cls, world_size=2, device_id=CPU, auto_wrap_policy=suggested)
    assert [u["module"] for u in as_written] == [""]
    blocks = [u["module"] for u in fixed if u["module"]]
    assert len(blocks) >= 2 and all(type(_module(path).DecoderOnlyLM().get_submodule(b)).__name__ == "DecoderLayer"
                                    for b in blocks)


def test_fsd103_suggests_close_names_case_insensitively():
    from fsdp_lint.rules.fsd103_wrap_class_not_found import close_names

    names = ["TransformerBlock", "Attention", "FeedForward", "RMSNorm"]
    assert close_names("transformerblock", names) == ["TransformerBlock"]
    assert close_names("TransformerBlok", names)[0] == "TransformerBlock"
    assert close_names("LlamaDecoderLayer", names) == []
    assert close_names("TransformerDecoderLayer", ["DecoderLayer", "Linear"])[0] == "DecoderLayer"


def test_fsd103_wrap_glob_from_the_command_line_points_at_the_model_class():
    path = os.path.join(ROOT, "fixtures", "article_model.py")
    res = lint_file(path, Settings(world_size=4, wrap=["transformerblock"]))
    (f,) = [f for f in res.findings if f.code == "FSD103"]
    assert f.line == _line_of(path, "class Transformer(")
    assert f.fix == "`--wrap TransformerBlock`"
    ok = lint_file(path, Settings(world_size=4, wrap=["TransformerBlock"]))
    assert not [f for f in ok.findings if f.code in MINE and f.severity != "info"]


# ---------------------------------------------------------------------------- FSD104 vs torch
def test_fsd104_root_is_torchs_root_group_and_the_fix_empties_it():
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    path = _bad("fsdp2_heavy_root.py")
    (f,) = _hits(path, "FSD104")
    assert "`fully_shard(model.embed_tokens)`" in f.fix
    assert "`fully_shard([model.norm, model.lm_head])`" in f.fix
    model_cls = _module(path).SmallLlama
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)   # as the file

    def as_written(model, mesh):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)

    def fixed(model, mesh):  # the finding's fix, verbatim
        fully_shard(model.embed_tokens, mesh=mesh, mp_policy=mp)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard([model.norm, model.lm_head], mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)

    def gathered_bytes(group, ws=4, itemsize=torch.bfloat16.itemsize):
        """What the group's all-gather rebuilds: the padded shards of every rank, in bf16."""
        n = 0
        for p in group["params"]:
            k = 1
            for d in p["padded_local_shape"]:
                k *= d
            n += k * ws
        return n * itemsize

    groups = oracle.fsdp2_groups(model_cls, world_size=4, apply=as_written)
    root = [g for g in groups if g["modules"] == [""]][0]
    largest = max((g for g in groups if g["modules"] != [""]), key=gathered_bytes)
    assert {p["fqn"] for p in root["params"]} >= {"embed_tokens.weight", "lm_head.weight"}
    assert f.details["root_bytes"] == gathered_bytes(root) > gathered_bytes(largest)
    assert f.details["largest_bytes"] == gathered_bytes(largest)
    after = oracle.fsdp2_groups(model_cls, world_size=4, apply=fixed)
    assert [g for g in after if g["modules"] == [""]][0]["params"] == []


def _example(cls, note):
    return [ex for ex in cls.INVALID if ex.note == note][0]


def _lint_source(tmp_path, ex):
    p = tmp_path / "example.py"
    p.write_text(ex.source)
    return lint_file(str(p), Settings(world_size=ex.world_size).with_overrides(**ex.options))


def test_fsd104_tied_head_is_info_for_fsdp1_and_a_shared_group_for_fsdp2(tmp_path):
    from fsdp_lint.rules.fsd104_heavy_root_unit import HeavyRootUnit

    (f1,) = [f for f in _lint_source(tmp_path, _example(HeavyRootUnit, "FSDP1 with a tied head: info")).findings
             if f.code == "FSD104"]
    assert f1.severity == "info" and "embed.weight = head.weight" in f1.text
    (f2,) = [f for f in _lint_source(tmp_path, _example(HeavyRootUnit, "FSDP2 with a tied head: one group for both")
                                     ).findings if f.code == "FSD104"]
    assert f2.severity == "warning"
    assert "fully_shard([model.embed, model.norm, model.head])" in f2.fix


# ---------------------------------------------------------------------------- FSD105 vs torch
def test_fsd105_fsdp2_raises_on_the_container():
    from torch.distributed.fsdp import fully_shard

    path = _bad("fsdp2_modulelist.py")
    (f,) = _hits(path, "FSD105")
    assert "for layer in model.layers: fully_shard(layer)" in f.fix
    model_cls = _module(path).ConvNet
    err = oracle.raises(lambda: oracle.fsdp2_groups(
        model_cls, world_size=2, apply=lambda model, mesh: fully_shard(model.layers, mesh=mesh)))
    assert isinstance(err, ValueError)
    assert "containers that do not implement forward" in str(err) and "containers that do not implement forward" \
        in f.text

    def fixed(model, mesh):  # the finding's fix
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    assert oracle.raises(lambda: oracle.fsdp2_groups(model_cls, world_size=2, apply=fixed)) is None


def test_fsd105_fsdp1_only_warns(tmp_path):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fsdp_lint.rules.fsd105_container_unit import ContainerUnit

    ex = _example(ContainerUnit, "FSDP1 only warns")
    (f,) = [f for f in _lint_source(tmp_path, ex).findings if f.code == "FSD105"]
    assert f.module == "layers"
    ns = {}
    exec(compile(ex.source.split("from torch.distributed.fsdp import")[0], "example", "exec"), ns)

    def apply(model, fsdp):
        model.layers = fsdp(model.layers, device_id=CPU)
        return fsdp(model, device_id=CPU)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        units = oracle.fsdp1_units(ns["Net"], world_size=2, apply=apply)
    assert "layers" in [u["module"] for u in units]            # torch built the container unit
    assert any("will not all-gather parameters for containers" in str(w.message) for w in caught)
    assert FSDP  # the API the example uses


# ---------------------------------------------------------------------------- FSD601 vs torch
def test_fsd601_empty_shards_are_empty_in_torch():
    from torch.distributed.fsdp import fully_shard

    path = _bad("fsdp2_uneven.py")
    (f,) = _hits(path, "FSD601", ws=8)
    empty = {fqn: k for fqn, shape, k in f.details["empty_params"]}
    assert "moe_layers.0.router.weight" in empty
    model_cls = _module(path).MoELM

    def apply(model, mesh):
        for layer in model.moe_layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    empty_in_torch = {}
    for rank in range(8):
        for g in oracle.fsdp2_groups(model_cls, world_size=8, rank=rank, apply=apply):
            for p in g["params"]:
                if p["local_shape"] and p["local_shape"][0] == 0:
                    empty_in_torch[p["fqn"]] = empty_in_torch.get(p["fqn"], 0) + 1
    group0 = {k: v for k, v in empty_in_torch.items() if k.startswith("moe_layers.0.")}
    assert group0 == empty
    assert f.details["units"] == ["moe_layers.0", "moe_layers.1"]


# ------------------------------------------------------------------ the block the rules name
def _tree(model):
    from fsdp_lint.model.tree import build_module_tree

    return build_module_tree(model)


def test_block_class_is_not_a_stack_of_blocks_nor_a_leaf_layer():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.Linear(32, 32)
            self.mlp = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))

        def forward(self, x):
            return self.mlp(self.attn(x))

    class Stack(nn.Module):  # T5Stack: encoder and decoder are the same class
        def __init__(self):
            super().__init__()
            self.block = nn.ModuleList([Block() for _ in range(3)])
            self.norm = nn.LayerNorm(32)

        def forward(self, x):
            for b in self.block:
                x = b(x)
            return self.norm(x)

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(100, 32)
            self.encoder = Stack()
            self.decoder = Stack()

        def forward(self, x):
            return self.decoder(self.encoder(self.embed(x)))

    with torch.device("meta"):
        assert _tree(Seq2Seq()).repeated_block_class() == "Block"
        # a model of bare layers: the layer is the block
        assert _tree(nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])).repeated_block_class() == "Linear"


def test_block_class_with_two_sub_blocks_of_one_class():
    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(32, 256)
            self.down = nn.Linear(256, 32)

        def forward(self, x):
            return self.down(self.up(x))

    class ConformerBlock(nn.Module):  # two FeedForward halves around attention (macaron)
        def __init__(self):
            super().__init__()
            self.ff1 = FeedForward()
            self.attn = nn.Linear(32, 32)
            self.ff2 = FeedForward()

        def forward(self, x):
            return self.ff2(self.attn(self.ff1(x)))

    class Conformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([ConformerBlock() for _ in range(4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    with torch.device("meta"):
        assert _tree(Conformer()).repeated_block_class() == "ConformerBlock"
