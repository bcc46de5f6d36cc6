"""The static memory estimate with activation checkpointing, against torch's ``FSDPMemTracker``
(FSDP2, fake process group, ``FakeTensorMode``, two steps; the oracle of tests/test_simulate.py).

The estimate walks the backward of the steady step: the tensors saved before each stretch of the
forward, the region being recomputed, the gradients and reduce-scatter buffers live at that moment.
The models here were not used to shape that walk (the article's transformer under
``checkpoint_wrapper`` was): a Hugging Face Llama with ``gradient_checkpointing_enable()`` and a
torchtitan-shaped LM with full, every-other-block and op-level selective checkpointing."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from conftest import REPO
from test_simulate import _Kw, _hf_loss, _per_block, fsdp2_oracle

AC = os.path.join(REPO, "fixtures", "memory", "ac")


def _static(cli, *args):
    own, script = (args[:args.index("--")], args[args.index("--"):]) if "--" in args else (args, ())
    res = cli(*own, "--format", "json", *script)
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    return f["memory"]


def _float_mean(out):
    return out.float().mean()


LLAMA = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)


@pytest.mark.parametrize("ws", [2, 8])
def test_hf_gradient_checkpointing_within_a_quarter_of_fsdpmemtracker(cli, tmp_path, ws):
    transformers = pytest.importorskip("transformers")
    src = open(os.path.join(REPO, "fixtures", "idioms", "hf_llama_fsdp2.py")).read()
    for old, new in (("vocab_size=512", "vocab_size=2048"), ("hidden_size=64", "hidden_size=256"),
                     ("intermediate_size=172", "intermediate_size=688"), ("num_hidden_layers=2", "num_hidden_layers=4"),
                     ("max_position_embeddings=256", "max_position_embeddings=512"),
                     ("        model = LlamaForCausalLM(config)\n",
                      "        model = LlamaForCausalLM(config)\n    model.gradient_checkpointing_enable()\n")):
        assert old in src
        src = src.replace(old, new)
    path = tmp_path / "train_llama_ac.py"
    path.write_text(src)
    mem = _static(cli, str(path), "--world-size", str(ws), "--input-shape", "4,256")

    def build():
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
        model.gradient_checkpointing_enable()
        return model

    def inputs():
        ids = torch.randint(0, 2048, (4, 256))
        return _Kw(input_ids=ids, labels=ids)

    snap = fsdp2_oracle(build, _per_block(lambda m: m.model.layers, True), ws, inputs, _hf_loss)
    without = fsdp2_oracle(lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)),
                           _per_block(lambda m: m.model.layers, True), ws, inputs, _hf_loss)
    assert snap["Total"] < without["Total"]            # checkpointing saves memory in torch too
    assert abs(mem["per_rank_bytes"] - snap["Total"]) <= 0.25 * snap["Total"], (mem["per_rank_bytes"], snap["Total"])


@pytest.mark.parametrize("mode,every,ws", [("full", 1, 16), ("selective", 2, 4), ("op", 1, 8)])
def test_torchtitan_modes_within_a_quarter_of_fsdpmemtracker(cli, mode, every, ws):
    sys.path.insert(0, AC)
    try:
        import train as ac_train
        from model import ModelArgs, Transformer
    finally:
        sys.path.remove(AC)
        for name in ("train", "model"):   # a later file's own `model`/`train` must not find these
            sys.modules.pop(name, None)
    mem = _static(cli, os.path.join(AC, "train.py"), "--world-size", str(ws), "--input-shape", "4,256",
                  "--", "--ac", mode, "--ac-every", str(every))
    assert mem["checkpointed_regions"] == (4 if every == 1 else 2)

    def build():
        model = Transformer(ModelArgs(n_layers=4))
        ac_train.apply_ac(model, mode, every)
        return model

    snap = fsdp2_oracle(build, _per_block(lambda m: m.layers, False), ws, lambda: (torch.randint(0, 8192, (4, 256)),),
                        _float_mean)
    assert abs(mem["per_rank_bytes"] - snap["Total"]) <= 0.25 * snap["Total"], (mem["per_rank_bytes"], snap["Total"])


def test_checkpointing_lowers_the_estimate_as_it_lowers_the_peak(cli):
    """Without checkpointing every block's activations are alive at the start of backward; with it,
    only the blocks' inputs and the block being recomputed: the estimate drops as torch's peak does."""
    path = os.path.join(AC, "train.py")
    none = _static(cli, path, "--world-size", "4", "--input-shape", "4,256", "--", "--ac", "none")
    full = _static(cli, path, "--world-size", "4", "--input-shape", "4,256", "--", "--ac", "full")
    assert none["checkpointed_regions"] == 0 and full["checkpointed_regions"] == 4
    assert full["breakdown"]["activations"] < none["breakdown"]["activations"] / 2


@pytest.mark.parametrize("ws", [4])
def test_torch_utils_checkpoint_with_a_policy_in_forward_within_a_quarter_of_fsdpmemtracker(cli, ws):
    """Selective checkpointing written in the block's own forward -- ``torch.utils.checkpoint.checkpoint``
    with ``context_fn=create_selective_checkpoint_contexts(policy)``, a policy that keeps the attention
    outputs and every second matmul (fixtures/memory/sac_policy_fsdp2.py, a model not used for tuning):
    the static estimate is within a quarter of torch's tracker, and below the same model without it."""
    path = os.path.join(REPO, "fixtures", "memory", "sac_policy_fsdp2.py")
    mem = _static(cli, path, "--world-size", str(ws), "--input-shape", "4,256")
    assert mem["checkpointed_regions"] == 4
    sys.path.insert(0, os.path.dirname(path))
    try:
        import sac_policy_fsdp2 as sac
    finally:
        sys.path.remove(os.path.dirname(path))
        sys.modules.pop("sac_policy_fsdp2", None)
    inputs = lambda: (torch.randint(0, 8192, (4, 256)),)  # noqa: E731
    snap = fsdp2_oracle(sac.Decoder, _per_block(lambda m: m.blocks, False), ws, inputs, _float_mean)
    assert abs(mem["per_rank_bytes"] - snap["Total"]) <= 0.25 * snap["Total"], (mem["per_rank_bytes"], snap["Total"])

    def plain():
        model = sac.Decoder()
        for block in model.blocks:
            block.forward = block._forward            # the same blocks, nothing checkpointed
        return model

    without = fsdp2_oracle(plain, _per_block(lambda m: m.blocks, False), ws, inputs, _float_mean)
    assert snap["Total"] < without["Total"]
