"""FSD402 (a parameter read outside its own unit) against what real FSDP2 does, and the guard that
keeps every rule's fix from splitting such a parameter from its reader.

The positives are the two shapes the issue names -- a head tied to the embedding through a plain
Python reference, a fused loss reading ``lm_head.weight`` directly -- each confirmed by real FSDP2
(``fully_shard`` on a CPU mesh, fake process group) raising at the first forward; the negatives
(the tie left in the root, owner and reader grouped) run in torch and are not reported.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import oracle
from conftest import REPO

BAD = os.path.join(REPO, "fixtures", "bad")
HEAD = os.path.join(BAD, "fsdp2_head_reads_embedding.py")
FUSED = os.path.join(BAD, "fused_loss", "train_fsdp2.py")


def _findings(cli, path, *args):
    res = cli(path, "--format", "json", "--world-size", "2", *args)
    assert res.code in (0, 1), res.err
    return [f for f in json.loads(res.out)["files"][0]["findings"] if f["code"] == "FSD402"]


def _first_forward(wrap, build, inputs):
    """What real FSDP2 does at the first forward: None, or the exception it raised."""
    from torch.distributed.device_mesh import init_device_mesh

    with oracle.fake_pg(2):
        mesh = init_device_mesh("cpu", (2,))
        model = build()
        wrap(model, mesh)
        return oracle.raises(lambda: model(*inputs()))


def _head_module():
    ns: dict = {}
    src = open(HEAD).read().split("\nmodel = TinyLM()")[0]
    exec(compile(src, HEAD, "exec"), ns)
    return ns["TinyLM"]


def _fused_module():
    sys.path.insert(0, os.path.dirname(FUSED))
    try:
        import model as fused_model
    finally:
        sys.path.pop(0)
    return fused_model.TinyLM


def _tokens():
    return (torch.randint(0, 2048, (2, 16)),)


def test_tie_through_a_plain_reference_is_reported_and_fsdp2_raises(cli):
    from torch.distributed.fsdp import fully_shard

    (f,) = _findings(cli, HEAD)
    assert f["module"] == "tok_emb" and "tok_emb.weight" in (f["message"] + " " + str(f.get("detail"))) and "`head`" in (f["message"] + " " + str(f.get("detail")))
    assert "fsdp2_head_reads_embedding.py:34" in (f["message"] + " " + str(f.get("detail")))          # the line that reads it
    assert "fully_shard([model.tok_emb, model.head])" in f["fix"]

    def wrap(model, mesh):
        fully_shard(model.tok_emb, mesh=mesh)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    exc = _first_forward(wrap, _head_module(), _tokens)
    assert isinstance(exc, RuntimeError) and "mixed torch.Tensor and DTensor" in str(exc)


def test_fused_loss_reading_the_head_weight_is_reported_and_fsdp2_raises(cli):
    from torch.distributed.fsdp import fully_shard

    (f,) = _findings(cli, FUSED)
    assert f["module"] == "lm_head" and "lm_head.weight" in (f["message"] + " " + str(f.get("detail"))) and "model.py:13" in (f["message"] + " " + str(f.get("detail")))
    assert "register_fsdp_forward_method" in f["fix"]

    def wrap(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model.lm_head, mesh=mesh)
        fully_shard(model, mesh=mesh)

    def inputs():
        tokens = torch.randint(0, 2048, (2, 64))
        return tokens, torch.roll(tokens, -1, dims=1)

    exc = _first_forward(wrap, _fused_module(), inputs)
    assert isinstance(exc, RuntimeError) and "mixed torch.Tensor and DTensor" in str(exc)


@pytest.mark.parametrize("variant", ["in-root", "grouped"])
def test_correctly_grouped_ties_are_not_reported_and_run(cli, tmp_path, variant):
    from torch.distributed.fsdp import fully_shard

    src = open(HEAD).read()
    line = "fully_shard(model.tok_emb)\n"
    new = "" if variant == "in-root" else "fully_shard([model.tok_emb, model.head])\n"
    path = tmp_path / f"tie_{variant.replace('-', '_')}.py"
    path.write_text(src.replace(line, new))
    assert _findings(cli, str(path)) == []

    def wrap(model, mesh):
        if variant == "grouped":
            fully_shard([model.tok_emb, model.head], mesh=mesh)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    assert _first_forward(wrap, _head_module(), _tokens) is None


def test_fused_loss_with_the_head_grouped_with_a_module_that_runs_is_not_reported(cli, tmp_path):
    """torch 2.13 gathers a group at the first of its modules and completes a group whose module
    never ran at the end of the root's forward: the head's weight is gathered when the loss reads it."""
    from torch.distributed.fsdp import fully_shard

    path = tmp_path / "train_grouped.py"
    path.write_text(open(FUSED).read().replace("    fully_shard(model.lm_head)\n",
                                               "    fully_shard([model.norm, model.lm_head])\n"))
    (tmp_path / "model.py").write_text(open(os.path.join(os.path.dirname(FUSED), "model.py")).read())
    assert _findings(cli, str(path)) == []

    def wrap(model, mesh):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard([model.norm, model.lm_head], mesh=mesh)
        fully_shard(model, mesh=mesh)

    def inputs():
        tokens = torch.randint(0, 2048, (2, 64))
        return tokens, torch.roll(tokens, -1, dims=1)

    assert _first_forward(wrap, _fused_module(), inputs) is None


def test_run_confirms_it_with_the_exception_torch_raises(cli):
    res = cli(HEAD, "--run", "--format", "json", "--run-timeout", "120")
    assert res.code == 1, res.err
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD402"]
    assert f["confirmed"] is True and "mixed torch.Tensor and DTensor" in f["evidence"]


HEAVY_ROOT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(x)

class LM(nn.Module):
    def __init__(self, vocab=32000, dim=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.norm(x), self.embed.weight)     # the root's own code reads it

model = LM()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''


def test_no_fix_splits_a_parameter_from_its_reader(cli, tmp_path):
    """FSD104 would move the embedding out of the heavy root; the root's own forward reads its
    weight, so the fix keeps it there (and says why) instead of suggesting fully_shard(model.embed)."""
    path = tmp_path / "heavy_root_reads_embedding.py"
    path.write_text(HEAVY_ROOT)
    res = cli(str(path), "--format", "json", "--world-size", "2")
    findings = json.loads(res.out)["files"][0]["findings"]
    (f,) = [x for x in findings if x["code"] == "FSD104"]
    assert "fully_shard(model.embed)" not in (f["fix"] or "")
    assert "`embed` (read by the root's own forward" in (f["message"] + " " + str(f.get("detail")))
    path.write_text(HEAVY_ROOT.replace("return F.linear(self.norm(x), self.embed.weight)", "return self.norm(x)"))
    (g,) = [x for x in json.loads(cli(str(path), "--format", "json", "--world-size", "2").out)["files"][0]["findings"]
            if x["code"] == "FSD104"]
    assert "fully_shard(model.embed)" in g["fix"]      # the same root without the read: it moves


def test_peft_lora_adapter_units_reading_only_the_dtype_are_not_reported_and_run(cli):
    """PEFT's lora.Linear reads ``lora_A.weight.dtype`` before calling ``lora_A``: a metadata read,
    which FSDP2's DTensor answers as the full parameter does -- real FSDP2 runs the forward."""
    from torch.distributed.fsdp import fully_shard

    path = os.path.join(REPO, "fixtures", "idioms", "peft_lora_fsdp2_adapter_units.py")
    assert _findings(cli, path) == []
    ns: dict = {}
    exec(compile(open(path).read().replace('if __name__ == "__main__":', "if False:"), path, "exec"), ns)

    def wrap(model, mesh):
        for module in model.modules():
            if not list(module.children()) and getattr(module, "weight", None) is not None \
                    and module.weight.requires_grad:
                fully_shard(module, mesh=mesh)
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    assert _first_forward(wrap, ns["build_model"], lambda: (torch.randint(0, 512, (2, 16)),)) is None


TIED_HOLDER = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


class TiedLinear:
    """The output projection with the embedding's weight; a plain object, not a module."""

    def __init__(self, tied_module: nn.Module):
        self.tied_module = tied_module

    def __call__(self, x):
        return F.linear(x, self.tied_module.weight)


class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(x)


class Decoder(nn.Module):
    def __init__(self, tok_embeddings, layers, norm, output):
        super().__init__()
        self.tok_embeddings = tok_embeddings
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.output = output

    def forward(self, tokens):
        if int(tokens.max().item()) >= self.tok_embeddings.num_embeddings:   # data-dependent: no trace
            raise ValueError("token id out of range")
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build(vocab=32000, dim=64, n=2):
    emb = nn.Embedding(vocab, dim)
    return Decoder(emb, [Block(dim) for _ in range(n)], nn.LayerNorm(dim), TiedLinear(emb))


model = build()
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''


def test_a_weight_read_through_a_holder_object_is_not_split_even_without_a_trace(cli, tmp_path):
    """The forward cannot be traced (.item()); the embedding is held by a non-Module `TiedLinear`
    whose call reads its weight from the root's forward: FSD104's fix keeps it in the root, because
    real FSDP2 raises once it is a unit of its own."""
    from torch.distributed.fsdp import fully_shard

    path = tmp_path / "tied_holder.py"
    path.write_text(TIED_HOLDER)
    res = cli(str(path), "--format", "json", "--world-size", "2")
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD104"]
    assert "fully_shard(model.tok_embeddings)" not in (f["fix"] or "")
    assert "`tok_embeddings` (read by the root's own forward" in (f["message"] + " " + str(f.get("detail")))
    ns: dict = {}
    exec(compile(TIED_HOLDER.split("\nmodel = build()")[0], str(path), "exec"), ns)

    def split(model, mesh):
        fully_shard(model.tok_embeddings, mesh=mesh)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    exc = _first_forward(split, ns["build"], lambda: (torch.randint(0, 32000, (2, 16)),))
    assert isinstance(exc, RuntimeError) and "mixed torch.Tensor and DTensor" in str(exc)
