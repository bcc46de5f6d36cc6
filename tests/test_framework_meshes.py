"""A framework that builds its own world mesh in a helper and shards the model in its train module
(issue 15, framework-built meshes; the idiom of OLMo-core's ``build_world_mesh`` + train module).

fixtures/repos/mesh_framework: ``prepare_environment()`` sets ``TORCH_DIST_INIT_BARRIER=1`` (every new
group waits on the store for all ranks) and initialises the process group; the train module builds an
HSDP world mesh with ``init_device_mesh``, asserts it exists, flattens its data-parallel dims into one
group, shards with ``fully_shard`` and initialises the weights with ``torch.Generator(device)``.
Before: the bare call that sets the environment was left out, then (kept) the flattened group's store
barrier failed on the fake store ("pure virtual function Store::add"), and the CUDA generator failed on
the CPU build. Oracle: real torch FSDP2 under the fake process group."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

FW = os.path.join(REPO, "fixtures", "repos", "mesh_framework")
TRAIN = os.path.join(FW, "scripts", "train.py")


@pytest.fixture
def in_fw(monkeypatch):
    monkeypatch.chdir(FW)
    monkeypatch.delenv("TORCH_DIST_INIT_BARRIER", raising=False)
    yield
    for name in [n for n in sys.modules if n == "meshfw" or n.startswith("meshfw.")]:
        sys.modules.pop(name, None)


def test_a_world_mesh_built_by_the_framework_plans_as_torch_builds_it(in_fw):
    res, _ = assert_plan_matches_torch(TRAIN, 8, argv=["--replicas", "2"])
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], [""]]
    assert {(u.shard_size, u.replicate_size) for u in res.plan.units} == {(4, 2)}
    assert not res.skipped_statements, res.skipped_statements
    assert "TORCH_DIST_INIT_BARRIER" not in os.environ      # the replay's environment is put back
