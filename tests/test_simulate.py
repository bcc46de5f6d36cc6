"""`--simulate` and the static memory estimate against torch's own memory trackers.

The oracle is a plain torch script written here: the same model and wrap code as the fixture, real
``fully_shard`` on a CPU mesh built outside ``FakeTensorMode``, the fake process group, AdamW, two
training steps under ``FSDPMemTracker`` (``MemTracker`` for FSDP1). ``--simulate`` (the file's own
setup code replayed for real in a child process) must find the same peak (within 10 %) and the same
memory per category (within 5 %); the static estimate with the same inputs must be within 25 % of
the simulated peak, and its collectives equal to the ones the simulation counted.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import oracle
from conftest import REPO

FIXTURES = os.path.join(REPO, "fixtures")
sys.path.insert(0, FIXTURES)
from article_model import Transformer  # noqa: E402



def _simulate(cli, path, *args, doc=None):
    res = cli(path, "--simulate", "--format", "json", "--run-timeout", "240", *args)
    assert res.code in (0, 1), res.err
    out = json.loads(res.out)
    if doc is not None:
        doc.update(out)
    (f,) = out["files"]
    sim = f["memory"]["simulated"]
    assert "error" not in sim, sim
    return f, sim


# --------------------------------------------------------------------------------------------
# the oracle: torch's FSDPMemTracker on the same plan
# --------------------------------------------------------------------------------------------
def _tracked_steps(model, optimizer, make_inputs, loss_fn, tracker):
    with tracker:
        for step in range(2):
            for p in model.parameters():
                p.grad = None
            args = make_inputs()
            if hasattr(tracker, "track_inputs"):        # FSDPMemTracker (MemTracker: activations)
                tracker.track_inputs((dict(args) if isinstance(args, _Kw) else args,))
            out = model(**args) if isinstance(args, _Kw) else model(*args)
            loss = loss_fn(out)
            loss.backward()
            optimizer.step()
            del out, loss
            tracker.reset_mod_stats()
    snap = tracker.get_tracker_snapshot("peak")
    (dev,) = snap.values()
    return dev


def fsdp2_oracle(build, wrap, ws, make_inputs, loss_fn, frozen=None):
    """Peak and categories of rank 0 of `ws` under FSDPMemTracker."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh

    with oracle.fake_pg(ws):
        mesh = init_device_mesh("cpu", (ws,))         # outside FakeTensorMode: a mesh holds real ranks
        with FakeTensorMode(allow_non_fake_inputs=True):
            with torch.device("meta"):
                model = build()
            if frozen:
                frozen(model)
            wrap(model, mesh)
            model.to_empty(device="cpu")
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            dev = _tracked_steps(model, optimizer, make_inputs, loss_fn, FSDPMemTracker(model, optimizer))
    return {str(getattr(k, "value", k)): int(v) for k, v in dev.items()}


_CATEGORY = {"Sharded Param": "sharded_params", "Unsharded Param": "unsharded_params", "All Gather": "all_gather_buffers",
             "Sharded Grad": "sharded_grads", "Unsharded Grad": "unsharded_grads",
             "Reduce Scatter": "reduce_scatter_buffers", "OptState": "optimizer_state", "Activation": "activations",
             "Temp": "temporaries", "Inputs": "inputs", "Buffer": "buffers"}


def _assert_like_torch(sim, torch_snap):
    peak = torch_snap["Total"]
    assert abs(sim["peak_bytes"] - peak) <= 0.10 * peak, (sim["peak_bytes"], peak)
    for name, ours in _CATEGORY.items():
        theirs = torch_snap.get(name, 0)
        got = sim["breakdown"][ours]
        assert abs(got - theirs) <= 0.05 * max(got, theirs) + 64, (ours, got, theirs)


def _mp(bf16):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()


def _per_block(blocks, bf16):
    from torch.distributed.fsdp import fully_shard

    def wrap(model, mesh):
        for b in blocks(model):
            fully_shard(b, mesh=mesh, mp_policy=_mp(bf16))
        fully_shard(model, mesh=mesh, mp_policy=_mp(bf16))
    return wrap


def _float_mean(out):
    return out.float().mean()


def _hf_loss(out):
    return out.loss


def _variant(tmp_path, fixture, bf16: bool):
    """The fixture with its mixed precision switched off (fp32 cases)."""
    with open(os.path.join(FIXTURES, fixture)) as fh:
        text = fh.read()
    if not bf16:
        text = text.replace("MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
                            "MixedPrecisionPolicy()")
    path = tmp_path / os.path.basename(fixture)
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------------------------
# --simulate == torch's tracker; static estimate within 25 %; collectives equal
# --------------------------------------------------------------------------------------------
ARTICLE_SMALL = "Transformer(num_layers=4)"


def test_article_fsdp2_bf16(cli):
    path = os.path.join(FIXTURES, "article_fsdp2.py")
    doc: dict = {}
    f, sim = _simulate(cli, path, "--world-size", "4", "--model", f"{path}:{ARTICLE_SMALL}",
                       "--input-shape", "4,64,512", "--compare-granularity", doc=doc)
    snap = fsdp2_oracle(lambda: Transformer(num_layers=4), _per_block(lambda m: m.layers, True), 4,
                        lambda: (torch.randn(4, 64, 512),), _float_mean)
    _assert_like_torch(sim, snap)
    _assert_static_close(f, sim)
    assert sim["peak_at"]["phase"] in ("forward", "backward") and sim["peak_at"]["step"] == 2
    # the forward peak of unsharded parameters the granularity table gives for this plan is the
    # most the tracker saw held at once (unsharded parameters + all-gather buffers)
    held = max(p["bytes"].get("unsharded_params", 0) + p["bytes"].get("all_gather_buffers", 0)
               for p in sim["timeline"])
    (own,) = [r for r in f["granularity"] if r["plan"] == "this file's plan"]
    assert own["forward_peak_bytes"] == held
    # every field of --simulate and --compare-granularity is in the README's schema
    from test_output_formats import _documented_json_paths, _json_paths

    assert _json_paths(doc) - _documented_json_paths() == set()


LLAMA_CFG = dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


@pytest.mark.parametrize("ws,bf16", [(2, False), (8, True)])
def test_hf_llama(cli, tmp_path, ws, bf16):
    transformers = pytest.importorskip("transformers")
    path = _variant(tmp_path, os.path.join("idioms", "hf_llama_fsdp2.py"), bf16)
    f, sim = _simulate(cli, path, "--world-size", str(ws), "--input-shape", "2,64")
    assert "labels" in sim["inputs"]                    # the model's own loss

    def build():
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_CFG))

    def inputs():
        ids = torch.randint(0, 512, (2, 64))
        return _Kw(input_ids=ids, labels=ids)

    snap = fsdp2_oracle(build, _per_block(lambda m: m.model.layers, bf16), ws, inputs, _hf_loss)
    _assert_like_torch(sim, snap)
    _assert_static_close(f, sim)


class _Kw(dict):
    """Inputs the oracle passes as keywords."""


GPT2_CFG = dict(vocab_size=4096, n_positions=256, n_embd=128, n_layer=4, n_head=4)


def test_gpt2_tied_bf16(cli):
    transformers = pytest.importorskip("transformers")
    path = os.path.join(FIXTURES, "memory", "gpt2_tied_fsdp2.py")
    f, sim = _simulate(cli, path, "--world-size", "8", "--input-shape", "4,128")

    def build():
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_CFG))
        assert model.lm_head.weight is model.transformer.wte.weight
        return model

    def inputs():
        ids = torch.randint(0, 4096, (4, 128))
        return _Kw(input_ids=ids, labels=ids)

    snap = fsdp2_oracle(build, _per_block(lambda m: m.transformer.h, True), 8, inputs, _hf_loss)
    _assert_like_torch(sim, snap)
    _assert_static_close(f, sim)


def test_half_frozen_fp32(cli):
    path = os.path.join(FIXTURES, "memory", "half_frozen_fsdp2.py")
    f, sim = _simulate(cli, path, "--world-size", "2", "--model", f"{path}:{ARTICLE_SMALL}")
    assert sim["inputs"] == "example_inputs()"

    def freeze(model):
        for block in model.layers[: len(model.layers) // 2]:
            block.requires_grad_(False)

    snap = fsdp2_oracle(lambda: Transformer(num_layers=4), _per_block(lambda m: m.layers, False), 2,
                        lambda: (torch.randn(4, 64, 512),), lambda out: out.float().pow(2).mean(), frozen=freeze)
    _assert_like_torch(sim, snap)
    _assert_static_close(f, sim)
    # the frozen first half is gathered in forward only (2 x 1), the trainable half twice (2 x 2), and
    # FSDP2's backward prefetch gathers the last frozen block once more; the root holds no parameter
    assert f["plan"]["all_gathers_per_step"] == sim["collectives"]["all_gathers_per_step"] == 7


def _assert_static_close(f, sim):
    """The static estimate (same inputs, activations from the traced forward) within 25 % of the
    simulated peak; its collectives those the simulation counted."""
    mem = f["memory"]
    assert "activations" in mem["covers"]
    assert abs(mem["per_rank_bytes"] - sim["peak_bytes"]) <= 0.25 * sim["peak_bytes"], \
        (mem["per_rank_bytes"], sim["peak_bytes"])
    plan, c = f["plan"], sim["collectives"]
    assert plan["all_gathers_per_step"] == c["all_gathers_per_step"]
    assert plan["reduce_scatters_per_step"] == c["reduce_scatters_per_step"]
    units = plan["units"]
    assert sum(u["all_gather_bytes"] * u["all_gathers_per_step"] for u in units) == c["all_gather_bytes_per_step"]
    assert sum(u["reduce_scatter_bytes"] * u["reduce_scatters_per_step"] for u in units) == \
        c["reduce_scatter_bytes_per_step"]


# --------------------------------------------------------------------------------------------
# FSDP1: MemTracker (one "Parameter" category for the FlatParameter's shard, low-precision copy
# and gathered buffer; use_orig_params=True it cannot track); fsdp-lint labels FSDP1's buffers
# --------------------------------------------------------------------------------------------
def fsdp1_oracle(build, block_cls, ws, make_inputs, **fsdp_kwargs):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    with oracle.fake_pg(ws), FakeTensorMode(allow_non_fake_inputs=True):
        model = FSDP(build(), auto_wrap_policy=ModuleWrapPolicy({block_cls}), device_id=torch.device("cpu"),
                     **fsdp_kwargs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        dev = _tracked_steps(model, optimizer, make_inputs, _float_mean, tracker)
    return {str(getattr(k, "value", k)): int(v) for k, v in dev.items()}


def test_article_fsdp1_fp32(cli):
    from article_model import TransformerBlock

    path = os.path.join(FIXTURES, "article_fsdp1.py")
    f, sim = _simulate(cli, path, "--world-size", "2", "--model", f"{path}:{ARTICLE_SMALL}", "--input-shape", "4,64,512")
    assert sim["measure"].startswith("MemTracker")
    snap = fsdp1_oracle(lambda: Transformer(num_layers=4), TransformerBlock, 2, lambda: (torch.randn(4, 64, 512),))
    b = sim["breakdown"]
    assert abs(sim["peak_bytes"] - snap["Total"]) <= 0.10 * snap["Total"]
    for ours, theirs in ((b["sharded_params"] + b["unsharded_params"] + b["all_gather_buffers"], snap["Parameter"]),
                         (b["optimizer_state"], snap["Optstate"]), (b["temporaries"], snap["Temp"]),
                         (b["activations"] + b["inputs"], snap["Activation"])):
        assert abs(ours - theirs) <= 0.05 * max(ours, theirs) + 64, (ours, theirs)
    assert b["unsharded_params"] > 0 and b["sharded_params"] == f["memory"]["breakdown"]["sharded_params"]
    _assert_static_close(f, sim)


def test_fsdp1_use_orig_params_is_simulated_where_memtracker_fails(cli, tmp_path):
    """torch's MemTracker raises on use_orig_params=True (it hooks the gradients of the original
    parameters, views there); --simulate labels FSDP1's buffers itself and still measures."""
    from article_model import TransformerBlock

    with pytest.raises(RuntimeError, match="non-leaf"):
        fsdp1_oracle(lambda: Transformer(num_layers=2), TransformerBlock, 2, lambda: (torch.randn(2, 16, 512),),
                     use_orig_params=True)
    src = open(os.path.join(FIXTURES, "article_fsdp1.py")).read()
    path = tmp_path / "article_fsdp1_uop.py"
    path.write_text(src.replace("device_id=", "use_orig_params=True, device_id=", 1))
    f, sim = _simulate(cli, str(path), "--world-size", "2", "--model", f"{path}:Transformer(num_layers=2)",
                       "--input-shape", "2,16,512")
    assert f["plan"]["use_orig_params"] is True
    b = sim["breakdown"]
    assert sum(b.values()) == sim["peak_bytes"] and b["sharded_params"] > 0 and b["optimizer_state"] > 0
    _assert_static_close(f, sim)


# --------------------------------------------------------------------------------------------
# an FSDP2 group that skips a module (a chunked loss reading the head's weight) keeps torch's
# group semantics under the tracker: gathered once per pass, completed at the root's end
# --------------------------------------------------------------------------------------------
def test_group_skipping_a_module_is_simulated_as_torch_runs_it(cli, tmp_path):
    src = open(os.path.join(FIXTURES, "bad", "fused_loss", "train_fsdp2.py")).read()
    path = tmp_path / "train_grouped.py"
    path.write_text(src.replace("    fully_shard(model.lm_head)\n", "    fully_shard([model.norm, model.lm_head])\n"))
    (tmp_path / "model.py").write_text(open(os.path.join(FIXTURES, "bad", "fused_loss", "model.py")).read())
    f, sim = _simulate(cli, str(path), "--world-size", "2")
    assert not [x for x in f["findings"] if x["code"] == "FSD402"]
    _assert_static_close(f, sim)


HSDP_SCRIPT = """\
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optim = torch.optim.AdamW(model.parameters())
"""


def test_hsdp_steps_and_its_replica_all_reduces_are_counted(cli, tmp_path):
    """FSDP2 HSDP on a (2, 2) mesh: the simulated rank runs backward (torch 2.7 asserts an event its
    CPU stream does not return; fsdp_lint.run.compat gives it one), counts one all-reduce per unit
    across the replicas as the plan does, and the text report says both."""
    path = tmp_path / "train_hsdp.py"
    path.write_text(HSDP_SCRIPT)
    f, sim = _simulate(cli, str(path), "--world-size", "4", "--input-shape", "8,64")
    assert f["plan"]["all_reduces_per_step"] == 4
    assert sim["collectives"]["all_reduces_per_step"] == f["plan"]["all_reduces_per_step"]
    text = cli(str(path), "--simulate", "--world-size", "4", "--input-shape", "8,64")
    assert "all-reduces 4, static 4" in text.out, text.out


def test_trunc_normal_initialised_model_is_simulated(cli):
    """trunc_normal_ resamples on a data-dependent mask that fake tensors cannot evaluate; the
    simulated rank fills such tensors without reading them back, and the plan is measured."""
    path = os.path.join(FIXTURES, "memory", "vit_trunc_normal_fsdp2.py")
    f, sim = _simulate(cli, path, "--world-size", "2")
    assert sim["peak_bytes"] > 0 and sim["peak_step"] == 2 and sim["first_step_peak_bytes"] > 0
    _assert_static_close(f, sim)


def test_a_simulation_that_dies_keeps_its_cause_and_long_ones_show_progress(cli, tmp_path, monkeypatch):
    """A rank that dies in a step (os._exit in the forward, once the fake process group is up)
    reports how it died and where, in JSON and on stderr; a long simulation says on stderr that it is
    still running."""
    import fsdp_lint.run.simulate as simulate_mod

    # a tick long before a rank can start: the rank dies within half a second on a quiet machine
    monkeypatch.setattr(simulate_mod, "PROGRESS_EVERY_S", 0.01)
    src = open(os.path.join(FIXTURES, "memory", "mlp_stack_fsdp2.py")).read()
    src = src.replace("    def forward(self, x):\n        for layer",
                      "    def forward(self, x):\n        import os\n        import torch.distributed as dist\n"
                      "        if dist.is_initialized():\n            os._exit(7)\n        for layer")
    path = tmp_path / "dies.py"
    path.write_text(src)
    res = cli(str(path), "--world-size", "2", "--simulate", "--format", "json", "--run-timeout", "240")
    assert res.code == 2
    (f,) = json.loads(res.out)["files"]
    err = f["memory"]["simulated"]["error"]
    assert "exited with code 7" in err and "forward (step 1)" in err, err
    assert "still running" in res.err
    assert f["memory"]["simulated"]["cause"]["type"] == "exited"
    assert f["memory"]["simulated"]["cause"]["phase"] == "forward (step 1)"


def test_an_exception_in_a_step_keeps_its_type_message_and_phase_and_quiet_shows_no_progress(cli, tmp_path,
                                                                                             monkeypatch):
    """The model raises in the second step's forward (a check on the step count, once the fake
    process group is up): JSON memory.simulated keeps the exception's type, message and phase, not
    only the last phase; with --quiet no progress line is printed (and never any on stdout)."""
    import fsdp_lint.run.simulate as simulate_mod

    # a tick long before a rank can start: the rank dies within half a second on a quiet machine
    monkeypatch.setattr(simulate_mod, "PROGRESS_EVERY_S", 0.01)
    src = open(os.path.join(FIXTURES, "memory", "mlp_stack_fsdp2.py")).read()
    src = src.replace("    def forward(self, x):\n        for layer",
                      "    def forward(self, x):\n        import torch.distributed as dist\n"
                      "        self.calls = getattr(self, 'calls', 0) + 1\n"
                      "        if dist.is_initialized() and self.calls == 2:\n"
                      "            raise ValueError('sequence length 512 is over the limit of this cache')\n"
                      "        for layer")
    path = tmp_path / "raises.py"
    path.write_text(src)
    res = cli(str(path), "--world-size", "2", "--simulate", "--format", "json", "--quiet", "--run-timeout", "240")
    assert res.code == 2
    (f,) = json.loads(res.out)["files"]
    sim = f["memory"]["simulated"]
    assert sim["cause"]["type"] == "ValueError" and sim["cause"]["phase"] == "forward (step 2)", sim
    assert "over the limit of this cache" in sim["cause"]["message"]
    assert "ValueError" in sim["error"] and "forward (step 2)" in sim["error"]
    assert "still running" not in res.err


# --------------------------------------------------------------------------------------------
# torch 2.6 (the oldest torch the package supports): its CPU stream has no record_event/wait_event
# and it has no fake kernels for c10d's collectives. Here the installed torch is made to look like
# it; benchmarks/torch_versions.sh runs the same simulations on a real 2.6.0 (README table).
# --------------------------------------------------------------------------------------------
def test_on_a_torch_shaped_like_2_6_fsdp2_simulates_the_same_and_fsdp1_names_the_minimum(cli, monkeypatch):
    import fsdp_lint.run.collectives as collectives

    path = os.path.join(FIXTURES, "article_fsdp2.py")
    args = ("--world-size", "4", "--model", f"{path}:{ARTICLE_SMALL}", "--input-shape", "2,16,512")
    _, measured = _simulate(cli, path, *args)
    # the ranks are forked from this process: they see the same torch
    monkeypatch.delattr(torch.cpu.Stream, "record_event")
    monkeypatch.delattr(torch.cpu.Stream, "wait_event")
    monkeypatch.setattr(collectives, "fake_collectives_registered", lambda: False)
    _, on_old = _simulate(cli, path, *args)
    assert on_old["collectives"] == measured["collectives"] and measured["collectives"]["all_gathers_per_step"] > 0
    assert on_old["peak_bytes"] == measured["peak_bytes"]
    # FSDP1's all-gathers reach the dispatcher and have no fake kernel there: refused in one line
    res = cli(os.path.join(FIXTURES, "article_fsdp1.py"), "--world-size", "4", "--simulate", "--format", "json")
    assert res.code == 2
    line = [x for x in res.err.splitlines() if x.strip()]
    assert len(line) == 1 and "simulating an FSDP1 plan needs torch 2.13 or later" in line[0], res.err
    (f,) = json.loads(res.out)["files"]
    assert "needs torch 2.13 or later" in f["memory"]["simulated"]["error"]
