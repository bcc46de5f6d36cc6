"""Checkpoint files the setup reads that this machine lacks stand in as the model's own state dict
(`fsdp_lint.replay.checkpoints`; issue 15, checkpoints read during setup).

Fixture: fixtures/repos/ckpt_init (rank 0 loads consolidated base weights into a model built on meta --
``safetensors.torch.load_file`` through a checkpointer returning ``{"model": sd, "step": 0}``, then
``load_state_dict(..., assign=True)``; a ``torch.load`` filtered by shape, ``strict=False``), wrapped with
FSDP2. Oracle: real torch under the fake process group, and torch's own ``load_state_dict``."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

CKPT = os.path.join(REPO, "fixtures", "repos", "ckpt_init")
TRAIN = os.path.join(CKPT, "src", "ckinit", "train.py")


@pytest.fixture
def in_ckpt(monkeypatch):
    monkeypatch.chdir(CKPT)
    yield
    for name in [n for n in sys.modules if n == "ckinit" or n.startswith("ckinit.")]:
        sys.modules.pop(name, None)


def test_missing_base_weights_plan_as_torch_builds_the_model(in_ckpt):
    # before: FileNotFoundError of consolidated.safetensors, the load skipped, then
    # KeyError/AssertionError on what it would have returned
    res, _ = assert_plan_matches_torch(TRAIN, 4, argv=["example/7B.yaml"])
    assert [u.modules for u in res.plan.units] == [["layers.0"], ["layers.1"], ["layers.2"], [""]]
    notes = [n for n in res.notes if "not on this machine, stands in as the model's own state dict" in n]
    assert [n.split(":")[0] + ":" + n.split(":")[1] for n in notes] == ["checkpointing.py:17", "checkpointing.py:23"]
    assert not getattr(res, "skipped_statements", None)


def test_the_stand_in_keeps_shapes_and_dtypes_as_a_real_state_dict_would(in_ckpt, tmp_path, cli):
    """``load_state_dict(sd, assign=True)`` with the stand-in leaves the parameters torch leaves with a
    real state dict of the model's own shapes and dtypes."""
    def build():
        with torch.device("meta"):
            m = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 8)).to(torch.bfloat16)
        return m

    real = build()
    real.load_state_dict({k: torch.zeros(v.shape, dtype=v.dtype) for k, v in real.state_dict().items()},
                         assign=True)
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from safetensors.torch import load_file
from torch.distributed.fsdp import fully_shard

with torch.device("meta"):
    model = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 8)).to(torch.bfloat16)
result = model.load_state_dict(load_file("/nonexistent/base/model.safetensors"), assign=True)
assert not result.missing_keys and not result.unexpected_keys
shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()}
assert shapes == SHAPES, shapes
fully_shard(model)
'''.replace("SHAPES", repr({k: (tuple(v.shape), str(v.dtype)) for k, v in real.state_dict().items()})))
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == sum(p.numel() for p in real.parameters())
    assert any("model.safetensors" in n and "stands in" in n for n in f["notes"])


def test_an_existing_checkpoint_is_read_for_real(tmp_path, cli):
    torch.save({"width": torch.tensor(24)}, tmp_path / "meta.pt")
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

width = int(torch.load("meta.pt")["width"])
model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))
for layer in model:
    fully_shard(layer)
fully_shard(model)
''')
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == 2 * (24 * 24 + 24)
    assert not any("stands in" in n for n in f["notes"])


def test_of_several_wrapped_models_the_plan_is_of_the_trained_one(tmp_path, cli):
    """A frozen text encoder wrapped first, then the model and its EMA copy: the optimizer trains the
    model, so the plan is the model's (before: the encoder's, a confident plan of the wrong model)."""
    (tmp_path / "train.py").write_text('''
import copy

import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def shard(model):
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model


encoder = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
encoder.requires_grad_(False)
encoder = shard(encoder)
model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(3)])
ema = copy.deepcopy(model)
model = shard(model)
ema = shard(ema)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(10):
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
''')
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == 3 * (32 * 32 + 32) and f["model"]["trainable_numel"] == 3 * (32 * 32 + 32)
    assert [u["modules"] for u in f["plan"]["units"]] == [["0"], ["1"], ["2"], [""]]
