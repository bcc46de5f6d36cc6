"""The repeated block the suggested plan and FSD101/FSD102/FSD104 compare against (issue 7, item 6).

Oracles:
* Hugging Face models built from tiny configs on meta: the block classes are exactly the repeated
  classes of the model's ``_no_split_modules``, which is what accelerate's FSDP plugin wraps by
  default (``TRANSFORMER_BASED_WRAP`` without class names);
* public layouts written out in ``block_zoo.py`` and the fixtures under ``fixtures/blocks/``: the
  class their own training code wraps;
* real torch under the fake process group: the plan each finding compares with, the fix it gives
  and the suggested plan of a file without wrap code are what torch builds, unit for unit.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import warnings

import pytest
import torch
import torch.nn as nn

from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file
from fsdp_lint.model.tree import build_module_tree

sys.path.insert(0, os.path.dirname(__file__))
import block_zoo  # noqa: E402
import oracle  # noqa: E402
from test_rules_granularity import _fsdp1_peak  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = os.path.join(ROOT, "fixtures", "blocks")
CPU = torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _fixture(name: str):
    """Import a fixture (its training code sits behind `if __name__ == "__main__"`)."""
    spec = importlib.util.spec_from_file_location("blocks_" + name[:-3], os.path.join(BLOCKS, name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def _lint(name: str, wrap=()):
    return lint_file(os.path.join(BLOCKS, name), Settings(world_size=4, wrap=list(wrap)))


def _hits(name: str, code: str, wrap=()):
    return [f for f in _lint(name, wrap).findings if f.code == code]


def _blocks(build) -> list:
    with torch.device("meta"):
        model = build()
    return build_module_tree(model).repeated_blocks()


def _dense_first_mixtral():
    """Two layers, the first dense (DeepSeek's `first_k_dense_replace`): no two layers alike."""
    mod = _fixture("moe_root_only_fsdp2.py")
    model = mod.MixtralForCausalLM(num_layers=2)
    model.model.layers[0].block_sparse_moe = mod.MixtralBlockSparseTop2MLP(128, 1024)
    return model


# ----------------------------------------------------------------- the block of real layouts
LAYOUTS = {
    # a nanoGPT whose embedding outweighs its blocks; its LayerNorm is a plain module (a leaf)
    "nanogpt": (lambda: block_zoo.NanoGPT(), ["Block"]),
    "torchtitan-moduledict": (lambda: block_zoo.TitanLlama(), ["TransformerBlock"]),
    # `CastedLinear(nn.Linear)` is the most repeated class and outweighs the blocks: a leaf
    "casted-linear": (lambda: (m := _fixture("casted_linear_fsdp1.py")).GPT(m.GPTConfig()), ["Block"]),
    # a leaf subclass with LoRA children is still a leaf (its MRO says so)
    "lora-linear-subclass": (lambda: block_zoo.LoRALM(), ["LoRALayer"]),
    # experts repeat inside each layer, 32 against 4: the layer is the block
    "mixtral-experts": (lambda: _fixture("moe_root_only_fsdp2.py").MixtralForCausalLM(), ["MixtralDecoderLayer"]),
    "mixtral-dense-first": (_dense_first_mixtral, ["MixtralDecoderLayer"]),
    "torchvision-resnet50": (lambda: block_zoo.ResNet(), ["Bottleneck"]),
    # stages of their own width and depth are stacks of blocks
    "timm-convnext": (lambda: block_zoo.ConvNeXt(), ["ConvNeXtBlock"]),
    # lucidrains pairs, ModuleList([Attention, FeedForward]) in a ModuleList: both classes
    "vit-pytorch-pairs": (lambda: block_zoo.LucidViT(), ["LucidFeedForward", "LucidAttention"]),
    # two towers, two block classes; the heavier stack first
    "vision-language": (lambda: _fixture("vlm_text_layers_only.py").VisionLanguageModel(),
                        ["VisionBlock", "DecoderLayer"]),
    "bare-layers": (lambda: nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)]), ["Linear"]),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_block_of_public_layouts(name):
    build, expected = LAYOUTS[name]
    assert _blocks(build) == expected


def _hf_models():
    import transformers as T

    d = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=3, vocab_size=1000)
    vision = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2, image_size=32,
                  patch_size=8)
    return {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**d, num_key_value_heads=2)),
        "gpt2-conv1d": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=1000)),
        "t5-two-stacks": lambda: T.T5ForConditionalGeneration(T.T5Config(
            d_model=64, d_ff=128, num_layers=3, num_decoder_layers=2, num_heads=4, d_kv=16, vocab_size=1000)),
        "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(**d, num_key_value_heads=2, num_local_experts=4)),
        "deepseek-v3-dense-first": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
            **d, num_key_value_heads=4, n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=1,
            q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
            topk_group=1, num_experts_per_tok=2)),
        "bert": lambda: T.BertModel(T.BertConfig(**d)),
        "vit": lambda: T.ViTModel(T.ViTConfig(**vision)),
        "whisper": lambda: _fixture("whisper_fsdp1.py").build_model(),
        "clip-two-towers": lambda: T.CLIPModel(T.CLIPConfig(
            text_config=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=3,
                             vocab_size=1000), vision_config=vision)),
        "llava": lambda: T.LlavaForConditionalGeneration(T.LlavaConfig(
            vision_config=T.CLIPVisionConfig(**vision), text_config=T.LlamaConfig(**d, num_key_value_heads=2))),
        "jamba-two-layer-kinds": lambda: T.JambaForCausalLM(T.JambaConfig(
            **{**d, "num_hidden_layers": 4}, num_key_value_heads=2, num_experts=2, attn_layer_period=2,
            attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4)),
    }


HF = ["llama", "gpt2-conv1d", "t5-two-stacks", "mixtral", "deepseek-v3-dense-first", "bert", "vit", "whisper",
      "clip-two-towers", "llava", "jamba-two-layer-kinds"]


@pytest.mark.parametrize("name", HF)
def test_block_of_hugging_face_models_is_what_accelerate_wraps(name):
    pytest.importorskip("transformers")
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = _hf_models()[name]()
    tree = build_module_tree(model)
    counts = {}
    for info in tree.modules.values():
        counts[info.cls] = counts.get(info.cls, 0) + 1
    wrapped_by_accelerate = {c for c in model._no_split_modules if counts.get(c, 0) >= 2}
    assert wrapped_by_accelerate and set(tree.repeated_blocks()) == wrapped_by_accelerate


# ------------------------------------------------------- FSD101 against the block, vs torch
def test_fsd101_on_leaf_subclasses_names_the_block_and_torch_builds_its_plan():
    (f,) = _hits("casted_linear_fsdp1.py", "FSD101")
    assert f.details["block"] == "Block" and "ModuleWrapPolicy({Block})" in f.fix
    assert "CastedLinear" not in f.text + f.fix
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mod = _fixture("casted_linear_fsdp1.py")
    units = oracle.fsdp1_units(lambda: mod.GPT(mod.GPTConfig()), world_size=4, device_id=CPU, use_orig_params=True,
                               auto_wrap_policy=ModuleWrapPolicy({mod.Block}))
    assert [u["module"] for u in units] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", ""]
    assert f.details["per_block_units"] == len(units)
    assert f.details["per_block_peak_bytes"] == _fsdp1_peak(units)


def test_fsd101_on_moe_names_the_layer_not_the_expert_and_torch_builds_the_fix():
    from torch.distributed.fsdp import fully_shard

    (f,) = _hits("moe_root_only_fsdp2.py", "FSD101")
    assert f.details["block"] == "MixtralDecoderLayer"
    assert "`for block in model.model.layers: fully_shard(block)` before `fully_shard(model)`" in f.fix

    def fixed(model, mesh):  # the finding's fix, verbatim
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    groups = oracle.fsdp2_groups(_fixture("moe_root_only_fsdp2.py").MixtralForCausalLM, world_size=4, apply=fixed)
    assert [g["modules"] for g in groups] == [[f"model.layers.{i}"] for i in range(4)] + [[""]]
    assert f.details["per_block_units"] == len(groups)


# ------------------------------------------------------- FSD102 against the block, vs torch
def test_fsd102_every_leaf_subclass_is_inside_the_block():
    """`--wrap CastedLinear` wraps every projection: units finer than `Block` (torch agrees on the
    units and the collective counts); the root is lighter than a block, so no FSD104."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    wrap = ("CastedLinear",)
    (f,) = _hits("casted_linear_fsdp1.py", "FSD102", wrap)
    assert f.details["block"] == "Block" and "ModuleWrapPolicy({Block})" in f.fix
    assert not _hits("casted_linear_fsdp1.py", "FSD104", wrap)
    mod = _fixture("casted_linear_fsdp1.py")
    fine = oracle.fsdp1_units(lambda: mod.GPT(mod.GPTConfig()), world_size=4, device_id=CPU,
                              auto_wrap_policy=ModuleWrapPolicy({mod.CastedLinear}))
    coarse = oracle.fsdp1_units(lambda: mod.GPT(mod.GPTConfig()), world_size=4, device_id=CPU,
                                auto_wrap_policy=ModuleWrapPolicy({mod.Block}))
    assert [u.module for u in _lint("casted_linear_fsdp1.py", wrap).plan.units] == [u["module"] for u in fine]
    per_step = lambda units: sum(2 if u["module"] else 1 for u in units) + len(units)  # noqa: E731
    assert f.details["units_inside_block"] == len([u for u in fine if u["module"].startswith("blocks.")])
    assert (f.details["collectives_per_step"], f.details["per_block_collectives_per_step"]) == \
        (per_step(fine), per_step(coarse))


# ------------------------------------------- FSD104: blocks of a second stack left in the root
def test_fsd104_vision_tower_left_in_the_root_and_torch_empties_it_with_the_fix():
    from torch.distributed.fsdp import fully_shard

    name = "vlm_text_layers_only.py"
    assert not _hits(name, "FSD101") and not _hits(name, "FSD102")
    (f,) = _hits(name, "FSD104")
    assert f.severity == ("info" if f.details["device_share"] < 0.05 else "warning")   # memory-info-share
    assert f.details["blocks_left"] == [f"vision_tower.blocks.{i}" for i in range(4)]
    assert "4 VisionBlock blocks" in f.text
    assert f.fix.startswith("shard the blocks left in the root, `for block in model.vision_tower.blocks: "
                            "fully_shard(block)`, then")
    groups = re.findall(r"`(fully_shard\(\[[^`]*\]\))`", f.fix)
    assert groups == ["fully_shard([model.vision_tower, model.multi_modal_projector, "
                      "model.language_model.embed_tokens])", "fully_shard([model.language_model.norm, model.lm_head])"]

    def fixed(model, mesh):  # the file's calls plus the fix, verbatim (children before parents)
        for layer in model.language_model.layers:
            fully_shard(layer, mesh=mesh)
        for block in model.vision_tower.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard([model.vision_tower, model.multi_modal_projector, model.language_model.embed_tokens], mesh=mesh)
        fully_shard([model.language_model.norm, model.lm_head], mesh=mesh)
        fully_shard(model, mesh=mesh)

    after = oracle.fsdp2_groups(_fixture(name).VisionLanguageModel, world_size=4, apply=fixed)
    assert [g["params"] for g in after if g["modules"] == [""]] == [[]]
    assert [f"vision_tower.blocks.{i}" for i in range(4)] == [g["modules"][0] for g in after[4:8]]


def test_fsd104_fsdp1_tied_head_stays_but_the_decoder_layers_leave_the_root():
    """Whisper with an encoder-only policy: the root keeps the decoder layers. Its tied embedding and
    head must stay in the root under FSDP1, but that no longer makes the finding info: the decoder
    layers can leave, and torch builds the suggested policy with them as units."""
    pytest.importorskip("transformers")
    name = "whisper_fsdp1.py"
    (f,) = _hits(name, "FSD104")
    assert f.severity == ("info" if f.details["device_share"] < 0.05 else "warning")   # memory-info-share
    assert f.details["blocks_left"] == [f"model.decoder.layers.{i}" for i in range(4)]
    lambda_src = re.search(r"lambda_fn=(lambda m: [^`]*)\)`", f.fix).group(1)
    assert "isinstance(m, WhisperDecoderLayer)" in lambda_src and "keep the tie in the root" in f.fix
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy
    from transformers.models.whisper import modeling_whisper

    def apply(model, fsdp):
        ns = {"model": model, **vars(modeling_whisper)}
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=eval(lambda_src, ns))
        return fsdp(model, auto_wrap_policy=policy, device_id=CPU, use_orig_params=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        units = oracle.fsdp1_units(_fixture(name).build_model, world_size=4, apply=apply)
    modules = [u["module"] for u in units]
    assert all(f"model.decoder.layers.{i}" in modules for i in range(4))
    (root,) = [u for u in units if u["module"] == ""]
    assert {p.rsplit(".", 1)[0] for p in root["params"]} == {"model.decoder.embed_tokens",
                                                            "model.decoder.embed_positions",
                                                            "model.decoder.layer_norm"}


# ------------------------------------------ the suggested plan of a file without wrap code
@pytest.mark.parametrize("name,build", [("vlm_text_layers_only.py", "VisionLanguageModel"),
                                        ("whisper_fsdp1.py", "build_model")])
def test_suggested_plan_wraps_both_stacks_and_torch_builds_it(tmp_path, name, build):
    """A model file without wrap code (the fixture up to its `main`): the suggested plan has one
    group per block of both stacks, then the root; real `fully_shard` accepts it, group for group."""
    if name.startswith("whisper"):
        pytest.importorskip("transformers")
    with open(os.path.join(BLOCKS, name), encoding="utf-8") as fh:
        source = fh.read()
    path = tmp_path / "model.py"
    path.write_text(source[:source.index("\ndef main(")])
    res = lint_file(str(path), Settings(world_size=4))
    plan = res.plan
    assert plan.origin == "default" and not [x for x in res.findings if x.severity in ("error", "warning")]
    blocks = res.tree.repeated_blocks()
    assert len(blocks) == 2
    assert [u.cls for u in plan.units[:-1]] == [c for c in sorted(blocks, key=lambda c: plan.units[0].cls != c)
                                                for _ in range(4)]
    from torch.distributed.fsdp import fully_shard

    def apply(model, mesh):
        for unit in plan.units:
            fully_shard(model.get_submodule(unit.module), mesh=mesh)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = oracle.fsdp2_groups(getattr(_fixture(name), build), world_size=4, apply=apply)
    assert [g["modules"] for g in groups] == [[u.module] for u in plan.units]
    assert [[p["fqn"] for p in g["params"]] for g in groups] == [u.params for u in plan.units]
