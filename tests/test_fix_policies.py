"""Fixes of FSDP1 auto-wrap policies written in Python (libcst edits of the class set): FSD103 (a class
that matches nothing -> the model's class), and the FSDP1 variants of FSD105 and FSD401. Each fixture has
comments and odd formatting; the fixed file keeps them, re-linted no longer has the finding, and builds
and steps under real torch (FSDP1 on CPU, fake process group)."""
from __future__ import annotations

import torch

import oracle
from test_fix import _codes, _copy, _load, _step


def _fsdp1(path: str, build: str = "TinyDecoder"):
    """wrap(<build>(), cpu) of the file under the fake process group, then a step; the FSDP units."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ns = _load(path)
    with oracle.fake_pg(2):
        model = ns["wrap"](ns[build](), torch.device("cpu"))
        _step(model)
        return model, FSDP.fsdp_modules(model)


def test_fsd103_fix_names_the_models_block_in_a_partial_policy(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_policy_wrong_class.py")
    before = open(path).read()
    model, units = _fsdp1(path)
    assert units == [model]                       # torch: the policy matches nothing, one unit
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 1 and open(path).read() == before and "FSD103 [error]" in res.out   # unsafe only
    res = cli(path, "--fix", "--unsafe-fixes", "--world-size", "2", "--output-format", "concise")
    assert open(path).read() == before.replace(
        "from model import TinyDecoder\n", "from model import TinyDecoder, Block\n").replace(
        "        nn.TransformerDecoderLayer,    # the decoder blocks\n", "        Block,    # the decoder blocks\n")
    codes = _codes(cli, path)
    assert "FSD103" not in codes and "FSD101" not in codes, codes
    model, units = _fsdp1(path)
    assert {type(u.module).__name__ for u in units if u is not model} == {"Block"}
    assert len(units) == 1 + len(model.module.layers)


def test_fsd103_fix_in_a_module_wrap_policy_uses_the_imported_name(cli, tmp_path):
    """`ModuleWrapPolicy({Block, Blok})`: of two classes one is a typo of the other; it is dropped."""
    path = _copy(tmp_path, "fsdp1_policy_wrong_class.py")
    src = open(path).read().replace("from model import TinyDecoder\n", "from model import Block, TinyDecoder\n\n\n"
                                    "class Blok(torch.nn.Module):   # an old name, kept for checkpoints\n    pass\n")
    src = src.replace("from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy",
                      "from torch.distributed.fsdp.wrap import ModuleWrapPolicy")
    start, end = src.index("AUTO_WRAP = "), src.index("\n\n\ndef wrap")
    src = src[:start] + "AUTO_WRAP = ModuleWrapPolicy( { Blok ,Block } )  # spacing kept" + src[end:]
    open(path, "w").write(src)
    cli(path, "--fix", "--unsafe-fixes", "--world-size", "2")
    assert open(path).read() == src.replace("{ Blok ,Block }", "{ Block }")
    assert "FSD103" not in _codes(cli, path)
    model, units = _fsdp1(path)
    assert len(units) == 1 + len(model.module.layers)


def test_fsd103_no_edit_for_a_lambda_policy(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_policy_wrong_class.py")
    src = open(path).read()
    start, end = src.index("AUTO_WRAP = "), src.index("\n\n\ndef wrap")
    src = src[:start] + ("AUTO_WRAP = functools.partial(\n    transformer_auto_wrap_policy,\n"
                         "    transformer_layer_cls={cls for cls in (nn.TransformerDecoderLayer,)},\n)") + src[end:]
    open(path, "w").write(src)
    import json

    res = cli(path, "--output-format", "json", "--world-size", "2")
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD103"]
    assert f["fix_edits"] is None and "Block" in f["fix"]       # a set built by code: the text fix only


def test_fsd105_fsdp1_fix_names_the_element_class_in_the_policy(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_container_policy.py")
    before = open(path).read()
    assert oracle.raises(lambda: _fsdp1(path)) is not None      # torch: the blocks run on sharded storage
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    assert open(path).read() == before.replace(
        "from model import TinyDecoder\n", "from model import TinyDecoder, Block\n").replace(
        "ModuleWrapPolicy({nn.ModuleList})      # one", "ModuleWrapPolicy({Block})      # one")
    assert _codes(cli, path) == []
    model, units = _fsdp1(path)
    assert len(units) == 1 + len(model.module.layers)


def test_fsd105_fsdp1_fix_wraps_each_element_of_a_container_wrapped_by_hand(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_container_policy.py")
    src = open(path).read()
    start, end = src.index("    policy = ModuleWrapPolicy"), src.index("\n\n\ndef main")
    src = src[:start] + ("    model.layers = FSDP(model.layers,\n                        device_id=device, use_orig_params=True)"
                         "  # the stack\n    return FSDP(model, device_id=device, use_orig_params=True)") + src[end:]
    open(path, "w").write(src)
    assert oracle.raises(lambda: _fsdp1(path)) is not None
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    assert open(path).read() == src.replace(
        "    model.layers = FSDP(model.layers,\n                        device_id=device, use_orig_params=True)  # the stack\n",
        "    for i, block in enumerate(model.layers):\n"
        "        model.layers[i] = FSDP(block, device_id=device, use_orig_params=True)  # the stack\n")
    assert _codes(cli, path) == []
    model, units = _fsdp1(path)
    assert len(units) == 1 + len(model.module.layers)


def test_fsd401_fsdp1_fix_takes_the_tied_class_out_of_the_policy(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_tied_policy.py")
    before = open(path).read()
    assert oracle.raises(lambda: _fsdp1(path, "build")) is not None   # torch: the head reads a flat shard
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert "FSD401" not in res.out and "0 remaining" in res.out, res.out    # FSD402's read: the same edit
    assert open(path).read() == before.replace("{Block,\n                                                      nn.Embedding})",
                                               "{Block})")
    assert _codes(cli, path) == []
    model, units = _fsdp1(path, "build")
    assert {type(u.module).__name__ for u in units if u is not model} == {"Block"}
    with type(model).summon_full_params(model):
        assert model.module.output.weight is model.module.tok_embeddings.weight     # still tied


def test_fsd401_fsdp1_fix_removes_the_separate_wrap_of_the_head(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_tied_policy.py")
    src = open(path).read().replace("{Block,\n                                                      nn.Embedding})", "{Block})")
    src = src.replace("    return FSDP(model, auto_wrap_policy",
                      "    model.output = FSDP(model.output, device_id=device,\n"
                      "                        use_orig_params=True)   # the head alone\n"
                      "    return FSDP(model, auto_wrap_policy")
    open(path, "w").write(src)
    assert oracle.raises(lambda: _fsdp1(path, "build")) is not None
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert "FSD401" not in res.out, res.out
    assert open(path).read() == src.replace("    model.output = FSDP(model.output, device_id=device,\n"
                                            "                        use_orig_params=True)   # the head alone\n", "")
    assert _codes(cli, path) == []
    _fsdp1(path, "build")
