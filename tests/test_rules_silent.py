"""Silent failures, shown with real torch: FSD301, FSD401 (FSDP1), FSD501, FSD502.

Each scenario is a small model plus wrap code, as source text. The same text is

* linted (the static side: the rule fires, at the right line), and
* executed in 2 CPU processes with the gloo backend (tests/gloo.py): one optimizer step on
  different data per rank, then the damage torch really does is asserted (parameters that differ
  across ranks, tied weights that are no longer equal, an optimizer that holds none of the model's
  parameters and a model that does not change).

Every damage assertion has a control in the same run (the parameters FSDP does manage stay equal
across ranks, the weights were equal before the step, the correct plan changes the model), so the
tests cannot pass by accident. FSD401 with FSDP2 is not silent: torch raises, asserted under the
fake process group (tests/oracle.py). The fixtures in fixtures/bad/ and fixtures/idioms/ check the
static side on realistic training files.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file

sys.path.insert(0, os.path.dirname(__file__))
from gloo import RankError, run_ranks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = os.path.join(ROOT, "fixtures", "bad")
IDIOMS = os.path.join(ROOT, "fixtures", "idioms")
WS = 2
TIMEOUT = 60.0

# ------------------------------------------------------------------------------------ scenarios
_NET = '''
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())

class Net(nn.Module):
    def __init__(self, vocab=16, dim=8, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

class TiedNet(Net):
    def __init__(self, vocab=16, dim=8, layers=2):
        super().__init__(vocab, dim, layers)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight   # weight tying

torch.manual_seed(0)
cpu = torch.device("cpu")
'''

FSDP2_NO_ROOT = _NET + '''
mesh = init_device_mesh("cpu", (2,))
model = Net()
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
'''

FSDP2_WITH_ROOT = FSDP2_NO_ROOT.replace("optimizer =", "fully_shard(model, mesh=mesh)\noptimizer =")

FSDP1_NO_ROOT = _NET + '''
model = Net()
for i, layer in enumerate(model.layers):
    model.layers[i] = FSDP(layer, device_id=cpu)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
'''

FSDP1_TIED_SPLIT = _NET + '''
model = TiedNet()
model.head = FSDP(model.head, device_id=cpu)
model = FSDP(model, device_id=cpu)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
'''

FSDP2_OPTIMIZER_BEFORE = _NET + '''
mesh = init_device_mesh("cpu", (2,))
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
'''

FSDP2_OPTIMIZER_AFTER = _NET + '''
mesh = init_device_mesh("cpu", (2,))
model = Net()
for layer in model.layers:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
'''

FSDP1_OPTIMIZER_BEFORE = _NET + '''
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model = FSDP(model, device_id=cpu, use_orig_params=False)
'''

FSDP1_IGNORED_TRAINABLE = _NET + '''
model = Net()
model = FSDP(model, ignored_modules=[model.embed], device_id=cpu)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
'''


def _line_of(source: str, text: str) -> int:
    """The one line that starts with `text` (else: contains it)."""
    lines = list(enumerate(source.splitlines(), 1))
    hits = [i for i, line in lines if line.lstrip().startswith(text)] or [i for i, line in lines if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def _lint(tmp_path, source: str, name: str = "train.py"):
    path = tmp_path / name
    path.write_text(source)
    return lint_file(str(path), Settings(world_size=WS)).findings


def _codes(findings, code):
    return [f for f in findings if f.code == code]


# ------------------------------------------------------------------------- what runs in the ranks
def _clean(name: str) -> str:
    drop = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_fpw_module"}
    return ".".join(p for p in name.split(".") if p not in drop)


def _full(t) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return (t.full_tensor() if isinstance(t, DTensor) else t).clone()


def _state(model) -> dict:
    """Every parameter by its unwrapped FQN, full (unsharded) values. FSDP2 DTensors are gathered;
    FSDP1 plain tensors as they are (call inside summon_full_params for the FlatParameters)."""
    return {_clean(n): _full(p) for n, p in model.named_parameters()}


def _step(model, optimizer, rank: int) -> None:
    g = torch.Generator().manual_seed(1000 + rank)     # different data on every rank
    tokens = torch.randint(0, 16, (4, 5), generator=g)
    model(tokens).float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _exec(source: str) -> dict:
    ns: dict = {"__name__": "scenario"}
    exec(compile(source, "<scenario>", "exec"), ns)
    return ns


def rank_plain_step(rank, ws, source):
    """One step; the parameters afterwards (FSDP2: gathered; FSDP1 leftovers: local)."""
    ns = _exec(source)
    model, optimizer = ns["model"], ns["optimizer"]
    _step(model, optimizer, rank)
    return _state(model)


def rank_fsdp1_full_step(rank, ws, source):
    """FSDP1 root: the full parameters before and after one step (summon_full_params), and whether
    the two FQNs of the tied weight name the same tensor."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ns = _exec(source)
    model, optimizer = ns["model"], ns["optimizer"]
    with FSDP.summon_full_params(model, writeback=False):
        before = _state(model)
    _step(model, optimizer, rank)
    with FSDP.summon_full_params(model, writeback=False):
        after = _state(model)
    return {"before": before, "after": after}


def rank_optimizer_refs(rank, ws, source):
    """Which parameters the optimizer holds, whether the model got gradients, and the model before/after."""
    ns = _exec(source)
    model, optimizer = ns["model"], ns["optimizer"]
    model_ids = {id(p) for p in model.parameters()}
    opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    before = _state(model)
    g = torch.Generator().manual_seed(1000 + rank)
    model(torch.randint(0, 16, (4, 5), generator=g)).float().pow(2).mean().backward()
    grads = sum(p.grad is not None for p in model.parameters())
    optimizer.step()
    after = _state(model)
    return {"n_model": len(model_ids), "n_opt": len(opt_ids), "shared": len(model_ids & opt_ids),
            "grads": grads, "before": before, "after": after}


# -------------------------------------------------------------------------------------- FSD301
@pytest.mark.parametrize("source,api", [(FSDP2_NO_ROOT, "fsdp2"), (FSDP1_NO_ROOT, "fsdp1")], ids=["fsdp2", "fsdp1"])
def test_fsd301_leftover_params_drift_apart_across_ranks(tmp_path, source, api):
    hits = _codes(_lint(tmp_path, source), "FSD301")
    assert len(hits) == 1 and hits[0].severity == "error"
    wrap_line = _line_of(source, "fully_shard(layer" if api == "fsdp2" else "= FSDP(layer")
    assert hits[0].line == wrap_line
    assert "embed.weight" in hits[0].text and "head.weight" in hits[0].text

    r0, r1 = run_ranks(rank_plain_step, source, world_size=WS, timeout=TIMEOUT)
    # the leftovers (outside every unit) were updated with each rank's own gradient
    for fqn in ("embed.weight", "head.weight", "head.bias"):
        assert not torch.equal(r0[fqn], r1[fqn]), f"{fqn} is still equal across ranks"
    if api == "fsdp2":
        # control: the sharded blocks' parameters are synchronised
        for fqn in ("layers.0.fc1.weight", "layers.1.fc2.bias"):
            assert torch.equal(r0[fqn], r1[fqn]), fqn


def test_fsd301_control_root_wrapped_keeps_ranks_equal(tmp_path):
    assert not _codes(_lint(tmp_path, FSDP2_WITH_ROOT), "FSD301")
    r0, r1 = run_ranks(rank_plain_step, FSDP2_WITH_ROOT, world_size=WS, timeout=TIMEOUT)
    assert r0.keys() == r1.keys()
    for fqn in r0:
        assert torch.equal(r0[fqn], r1[fqn]), fqn


def test_fsd301_fixture(tmp_path):
    path = os.path.join(BAD, "fsdp2_no_root.py")
    findings = lint_file(path, Settings(world_size=4)).findings
    hits = _codes(findings, "FSD301")
    assert len(hits) == 1 and hits[0].severity == "error"
    source = open(path).read()
    assert hits[0].line == _line_of(source, "fully_shard(layer")
    for fqn in ("tok_embeddings.weight", "norm.weight", "output.weight"):
        assert fqn in hits[0].text


# -------------------------------------------------------------------------------------- FSD401
def test_fsd401_fsdp1_unties_the_weights_after_one_step(tmp_path):
    hits = _codes(_lint(tmp_path, FSDP1_TIED_SPLIT), "FSD401")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert hits[0].line == _line_of(FSDP1_TIED_SPLIT, "model.head = FSDP(")
    assert "silently untied" in hits[0].text

    r0, r1 = run_ranks(rank_fsdp1_full_step, FSDP1_TIED_SPLIT, world_size=WS, timeout=TIMEOUT)
    for r in (r0, r1):
        # FSDP1 keeps two copies: the head's unit and the root unit (which owns embed.weight)
        assert "embed.weight" in r["before"] and "head.weight" in r["before"]
        assert torch.equal(r["before"]["embed.weight"], r["before"]["head.weight"])     # tied at wrap time
        assert not torch.equal(r["after"]["embed.weight"], r["after"]["head.weight"])   # untied by one step
    # the damage is not a rank divergence: both ranks agree on the wrong result
    assert torch.equal(r0["after"]["head.weight"], r1["after"]["head.weight"])


def test_fsd401_fsdp1_fixtures(tmp_path):
    path = os.path.join(BAD, "fsdp1_tied_split.py")
    source = open(path).read()
    hits = _codes(lint_file(path, Settings(world_size=4)).findings, "FSD401")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert "lm_head" in hits[0].text and "wte" in hits[0].text
    assert hits[0].line == _line_of(source, "model.lm_head = FSDP(")
    assert "`lm_head`" in hits[0].fix
    for name in ("fsdp1_tied.py",):
        assert not _codes(lint_file(os.path.join(IDIOMS, name), Settings(world_size=4)).findings, "FSD401")


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"fixture_{os.path.basename(path)[:-3]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fsd401_fsdp2_torch_raises_and_the_suggested_group_does_not():
    from oracle import fsdp2_groups, raises
    from torch.distributed.fsdp import fully_shard

    path = os.path.join(BAD, "fsdp2_tied_split.py")
    findings = lint_file(path, Settings(world_size=4)).findings
    hits = _codes(findings, "FSD401")
    assert len(hits) == 1 and hits[0].severity == "error"
    source = open(path).read()
    assert hits[0].line == _line_of(source, "fully_shard(model.tok_embeddings")
    group = hits[0].details["group"]
    assert "tok_embeddings" in group and "output" in group
    assert f"fully_shard([{', '.join('model.' + m for m in group)}])" in hits[0].fix

    fixture = _load(path)
    exc = raises(lambda: fsdp2_groups(fixture.Transformer, world_size=4, lazy_init=True,
                                      apply=lambda model, mesh: fixture.apply_fsdp(model, mesh)))
    assert isinstance(exc, ValueError) and "shared with a parameter already managed by another FSDP group" in str(exc)

    def grouped(model, mesh):
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard([model.get_submodule(m) for m in group], mesh=mesh)
        fully_shard(model, mesh=mesh)

    groups = fsdp2_groups(fixture.Transformer, world_size=4, lazy_init=True, device="cpu", apply=grouped)
    tied = [g for g in groups if "tok_embeddings.weight" in [p["fqn"] for p in g["params"]]]
    assert len(tied) == 1 and set(group) <= set(tied[0]["modules"])


# -------------------------------------------------------------------------------------- FSD501
def test_fsd501_optimizer_built_before_fully_shard_updates_nothing(tmp_path):
    hits = _codes(_lint(tmp_path, FSDP2_OPTIMIZER_BEFORE), "FSD501")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert hits[0].line == _line_of(FSDP2_OPTIMIZER_BEFORE, "optimizer = torch.optim.SGD")
    assert f"line {_line_of(FSDP2_OPTIMIZER_BEFORE, 'fully_shard(model, mesh')}" in hits[0].fix
    assert not _codes(_lint(tmp_path, FSDP2_OPTIMIZER_AFTER, "after.py"), "FSD501")

    bad = run_ranks(rank_optimizer_refs, FSDP2_OPTIMIZER_BEFORE, world_size=WS, timeout=TIMEOUT)
    good = run_ranks(rank_optimizer_refs, FSDP2_OPTIMIZER_AFTER, world_size=WS, timeout=TIMEOUT)
    for r in bad:
        assert r["n_opt"] == r["n_model"] > 0
        assert r["shared"] == 0                     # the optimizer holds none of the model's parameters
        assert r["grads"] == r["n_model"]           # ... although every model parameter got a gradient
        for fqn, before in r["before"].items():
            assert torch.equal(before, r["after"][fqn]), f"{fqn} changed"
    for r in good:                                  # control: built after the wrap, the step trains
        assert r["shared"] == r["n_model"]
        assert all(not torch.equal(b, r["after"][f]) for f, b in r["before"].items())


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_fsd501_fsdp1(tmp_path, use_orig_params):
    source = FSDP1_OPTIMIZER_BEFORE.replace("use_orig_params=False", f"use_orig_params={use_orig_params}")
    hits = _codes(_lint(tmp_path, source), "FSD501")
    assert len(hits) == 1 and hits[0].line == _line_of(source, "optimizer = torch.optim.SGD")
    assert hits[0].severity == ("warning" if use_orig_params else "error")

    for r in run_ranks(rank_optimizer_refs, source, world_size=WS, timeout=TIMEOUT):
        changed = [f for f, b in r["before"].items() if not torch.equal(b, r["after"][f])]
        if use_orig_params:
            # FSDP1 keeps the original Parameter objects: the step does train (hence only a warning)
            assert r["shared"] == r["n_model"] > 0 and changed
        else:
            # the FlatParameters are new: the optimizer holds none of them and the model does not move
            assert r["shared"] == 0 and r["grads"] == r["n_model"] > 0 and not changed


def test_fsd501_fixture():
    path = os.path.join(BAD, "fsdp2_optimizer_before.py")
    source = open(path).read()
    hits = _codes(lint_file(path, Settings(world_size=4)).findings, "FSD501")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert hits[0].line == _line_of(source, "optimizer = torch.optim.AdamW(")
    wrap = _line_of(source, "fully_shard(model, mesh")
    assert f"line {wrap}" in hits[0].fix and str(wrap) in hits[0].text


# -------------------------------------------------------------------------------------- FSD502
def test_fsd502_ignored_trainable_params_drift_apart(tmp_path):
    hits = _codes(_lint(tmp_path, FSDP1_IGNORED_TRAINABLE), "FSD502")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert hits[0].line == _line_of(FSDP1_IGNORED_TRAINABLE, "ignored_modules=")
    assert "embed.weight" in hits[0].text

    r0, r1 = run_ranks(rank_fsdp1_full_step, FSDP1_IGNORED_TRAINABLE, world_size=WS, timeout=TIMEOUT)
    assert torch.equal(r0["before"]["embed.weight"], r1["before"]["embed.weight"])
    assert not torch.equal(r0["after"]["embed.weight"], r1["after"]["embed.weight"])
    # control: what FSDP manages stays synchronised
    managed = [f for f in r0["after"] if not f.startswith("embed.")]
    assert managed
    for fqn in managed:
        assert torch.equal(r0["after"][fqn], r1["after"][fqn]), fqn
        assert not torch.equal(r0["before"][fqn], r0["after"][fqn]), fqn


def test_fsd502_fixtures():
    path = os.path.join(BAD, "fsdp1_ignored_trainable.py")
    source = open(path).read()
    hits = _codes(lint_file(path, Settings(world_size=4)).findings, "FSD502")
    assert len(hits) == 1 and hits[0].severity == "error"
    assert _line_of(source, "ignored_modules=") >= hits[0].line >= _line_of(source, "model = FSDP(")
    assert not _codes(lint_file(os.path.join(IDIOMS, "fsdp1_ignored.py"), Settings(world_size=4)).findings,
                      "FSD502")


def test_fsd502_freezing_after_the_wrap_counts(tmp_path):
    source = FSDP1_IGNORED_TRAINABLE.replace("optimizer =", "model.embed.requires_grad_(False)\noptimizer =")
    # (in the FSDP1 wrapper `model.embed` resolves to the wrapped module's attribute)
    assert not _codes(_lint(tmp_path, source), "FSD502")


# ------------------------------------------------------------------------------ the gloo helper
def _boom(rank, ws):
    if rank == 1:
        raise ValueError("boom on rank 1")
    import torch.distributed as dist

    dist.barrier()          # rank 0 would wait forever for rank 1


def _sleep(rank, ws):
    import time

    time.sleep(600)


def test_gloo_helper_reports_a_rank_error_and_stops_the_others():
    import time

    t = time.monotonic()
    with pytest.raises(RankError, match="boom on rank 1"):
        run_ranks(_boom, world_size=2, timeout=30)
    assert time.monotonic() - t < 20


def test_gloo_helper_times_out_and_kills_children():
    import multiprocessing
    import time

    t = time.monotonic()
    with pytest.raises(RankError, match="timed out"):
        run_ranks(_sleep, world_size=2, timeout=1.5)
    assert time.monotonic() - t < 10
    assert not multiprocessing.active_children()
