"""``--suggest`` never offers a plan that puts a tied embedding and its output head in different
units: FSDP2 raises at the first forward ("shared with a parameter already managed by another FSDP
group"), FSDP1 flattens two copies and unties them after the first step. Models: a Hugging Face
Llama with ``tie_word_embeddings=True``, a hand-written decoder with ``self.head.weight =
self.tok_embeddings.weight`` and an untied position embedding (fixtures/memory/tied_head_fsdp2.py),
FSDP1 on a GPT with a tied head (fixtures/idioms/fsdp1_tied.py), and a file whose own plan splits the
tie (fixtures/bad/fsdp2_tied_split.py): only the file's own plan keeps the split.

Oracle: each listed change (and the one that shards the tied pair as one group) applied for real --
FSDP2 ``fully_shard`` on the meta device, FSDP1 with ``device_id=torch.device("cpu")``, the fake
process group, ``FakeTensorMode`` -- keeps the tensor shared (FSDP2: one DTensor registered on both
modules; FSDP1: one FlatParameter holds it once) and runs two AdamW steps; FSDP2's peak under
``FSDPMemTracker`` is within the README's quarter of the reported peak."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import oracle
from conftest import REPO
from test_suggest_applied import _every_candidate, _load

TOLERANCE = 0.25
TIED_HEAD = os.path.join(REPO, "fixtures", "memory", "tied_head_fsdp2.py")
FSDP1_TIED = os.path.join(REPO, "fixtures", "idioms", "fsdp1_tied.py")
SPLIT = os.path.join(REPO, "fixtures", "bad", "fsdp2_tied_split.py")
LLAMA_TIED = dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


def _unit_of(units, module):
    """The candidate's unit (an index into its plan's units) holding `module`: the innermost."""
    best = None
    for i, mods in enumerate(units):
        for m in mods:
            if m == "" or module == m or module.startswith(m + "."):
                depth = m.count(".") + 1 if m else 0
                if best is None or depth > best[0]:
                    best = (depth, i)
    return best[1]


def _assert_no_split(cands, owners, *, file_splits=False):
    for c in cands:
        held = {_unit_of(c["plan"]["units"], m) for m in owners}
        if file_splits and not c["kinds"]:
            assert len(held) == 2, c["plan"]["units"]        # the file's own plan, listed as it is
            continue
        assert len(held) == 1, (c["kinds"], c["plan"]["units"])


def _applied(cands):
    """The listed candidates, and the one that gives the tied pair (or its neighbours) units of their own."""
    from fsdp_lint.suggest.search import _listed

    out = [c for c in _listed(cands) if c["kinds"]]
    out += [c for c in cands if c["kinds"] == ["wrap-embeddings-head"] and c not in out]
    return out


def _fsdp2_steps(cand, build, ws, inputs, loss_fn, tied):
    """`cand` applied with torch's API (fsdp_lint.run.candidate) on the meta device, two AdamW steps
    under FSDPMemTracker; asserts that `tied(model)` (the two modules' parameters, if given) stays one
    tensor. Rank 0's peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from fsdp_lint.run.candidate import apply_candidate
    from test_simulate import _tracked_steps

    with oracle.fake_pg(ws):
        with torch.device("meta"):
            model = build()
        unique = sum(p.numel() for p in model.parameters())
        model = apply_candidate(cand["plan"], model, ws, torch.device("cpu"))     # the mesh outside fake mode
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            a, b = tied(model) if tied else (None, None)
            assert a is b, cand["kinds"]
            assert sum(p.numel() for p in model.parameters()) == unique
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            dev = _tracked_steps(model, optimizer, inputs, loss_fn, FSDPMemTracker(model, optimizer))
            a, b = tied(model) if tied else (None, None)
            assert a is b, cand["kinds"]
    return int(next(v for k, v in dev.items() if str(getattr(k, "value", k)) == "Total"))


def _check_fsdp2(cands, build, ws, inputs, loss_fn, tied):
    applied = _applied(cands)
    assert applied
    for c in applied:
        measured = _fsdp2_steps(c, build, ws, inputs, loss_fn, tied)
        assert abs(c["peak_bytes"] - measured) <= TOLERANCE * measured, (c["kinds"], c["peak_bytes"], measured)


def test_hf_llama_tied_fsdp2(tmp_path):
    transformers = pytest.importorskip("transformers")
    src = open(os.path.join(REPO, "fixtures", "idioms", "hf_llama_fsdp2.py")).read()
    assert "tie_word_embeddings=False" in src
    path = tmp_path / "hf_llama_tied_fsdp2.py"
    path.write_text(src.replace("tie_word_embeddings=False", "tie_word_embeddings=True"))
    res, settings, cands = _every_candidate(("llama-tied", str(tmp_path)), str(path), [], world_size=4,
                                            input_shape="2,64")
    assert res.tree.params["model.embed_tokens.weight"].aliases == ["lm_head.weight"]
    assert len(cands) > 1
    _assert_no_split(cands, ["model.embed_tokens", "lm_head"])
    from test_simulate import _Kw, _hf_loss

    def inputs():
        ids = torch.randint(0, 512, (2, 64))
        return _Kw(input_ids=ids, labels=ids)

    _check_fsdp2(cands, lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_TIED)), 4, inputs,
                 _hf_loss, lambda m: (m.model.embed_tokens.weight, m.lm_head.weight))


def test_hand_written_tied_head_fsdp2_shards_the_pair_as_one_group():
    res, settings, cands = _every_candidate("tied-head", TIED_HEAD, [], world_size=4, input_shape="4,128")
    _assert_no_split(cands, ["tok_embeddings", "head"])
    c = next(c for c in cands if c["kinds"] == ["wrap-embeddings-head"])
    assert c["plan"]["units"][:2] == [["tok_embeddings", "head"], ["pos_embeddings"]]
    assert "`fully_shard([model.tok_embeddings, model.head])`" in c["change"], c["change"]
    assert "`fully_shard(model.pos_embeddings)`" in c["change"]
    mod = _load(TIED_HEAD, "suggest_tied_head")
    _check_fsdp2(cands, lambda: mod.TiedLM(), 4, lambda: (torch.randint(0, 8192, (4, 128)),),
                 lambda out: out.float().mean(), lambda m: (m.tok_embeddings.weight, m.head.weight))


def test_a_file_that_splits_the_tie_gets_only_plans_that_keep_it():
    """torchtitan's grouping (``tok_embeddings`` alone, ``[norm, output]``) on a tied model: every
    candidate but the file's own keeps the tie; the blocks-only plan and the tied pair as one group
    are offered."""
    res, settings, cands = _every_candidate("tied-split", SPLIT, [], world_size=4, input_shape="2,64")
    _assert_no_split(cands, ["tok_embeddings", "output"], file_splits=True)
    kinds = {tuple(c["kinds"]) for c in cands}
    assert ("wrap-blocks",) in kinds and ("wrap-embeddings-head",) in kinds
    assert not any(c["kinds"] and "wrap-blocks" not in c["kinds"] and "wrap-embeddings-head" not in c["kinds"]
                   for c in cands)
    mod = _load(SPLIT, "suggest_tied_split")
    _check_fsdp2(cands, lambda: mod.Transformer(), 4, lambda: (torch.randint(0, 512, (2, 64)),),
                 lambda out: out.float().mean(), lambda m: (m.tok_embeddings.weight, m.output.weight))


def _fsdp1_units(model):
    """(path in the unwrapped model, FSDP instance) of every FSDP1 unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = []
    for name, m in model.named_modules():
        if isinstance(m, FSDP):
            parts = [p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
            out.append((".".join(parts), m))
    return out


def test_fsdp1_tied_gpt():
    """FSDP1 cannot shard two modules as one unit: the tied embedding and head stay in the root in
    every candidate (the untied position embedding may get a unit of its own); applied for real, the
    root's FlatParameter holds the shared weight once and two steps run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from fsdp_lint.run.candidate import apply_candidate
    from test_simulate import _tracked_steps

    res, settings, cands = _every_candidate("fsdp1-tied", FSDP1_TIED, [], world_size=4, input_shape="8,64")
    assert res.plan.api == "fsdp1"
    _assert_no_split(cands, ["tok_emb", "lm_head"])
    c = next(c for c in cands if c["kinds"] == ["wrap-embeddings-head"])
    assert [["pos_emb"]] == [u for u in c["plan"]["units"] if u[0] in ("tok_emb", "pos_emb", "lm_head")]
    assert "m is model.pos_emb" in c["change"] and "tok_emb" not in c["change"] and "lm_head" not in c["change"]
    mod = _load(FSDP1_TIED, "suggest_fsdp1_tied")
    for cand in _applied(cands):
        # CPUOffload pins its CPU copies, which fake tensors cannot (aten._pin_memory): an offloaded
        # candidate is built and checked with the same units, without the pinning
        cand = dict(cand, plan=dict(cand["plan"], offload=False))
        with oracle.fake_pg(4), FakeTensorMode(allow_non_fake_inputs=True):
            model = mod.GPT()
            unique = sum(p.numel() for p in model.parameters())
            model = apply_candidate(cand["plan"], model, 4, torch.device("cpu"))
            units = _fsdp1_units(model)
            holders = set()
            for owner in ("tok_emb", "lm_head"):
                inner = max((u for u in units if u[0] == "" or owner == u[0] or owner.startswith(u[0] + ".")),
                            key=lambda u: len(u[0]))
                holders.add(id(inner[1]))
            assert len(holders) == 1, cand["kinds"]
            flat = sum(m._handle.flat_param._unpadded_unsharded_size.numel() for _, m in units if m._handle)
            assert flat == unique, (cand["kinds"], flat, unique)       # a split tie is flattened twice
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            _tracked_steps(model, optimizer, lambda: (torch.randint(0, 640, (8, 64)),), lambda out: out.float().mean(),
                           tracker)
