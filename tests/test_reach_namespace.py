"""Entry points of repositories without ``__init__.py`` files, launched as ``python -m apps.lm.train
config=...`` from the repository root (facebookresearch/lingua's shape): the core library beside
``apps/`` is found as Python finds it, a module-level statement of an imported module that cannot run
here is skipped like the entry's own, and a value that comes from a package that is not installed
names the package.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

APP = os.path.join(REPO, "fixtures", "repos", "namespace_apps")
TRAIN = os.path.join(APP, "apps", "lm", "train.py")
TINY = "config=" + os.path.join(APP, "apps", "lm", "configs", "tiny.yaml")


@pytest.mark.parametrize("argv,world_size", [([TINY], 4), ([TINY, "parallel.shard_groups=2", "model.depth=2"], 8)],
                         ids=["fsdp-ws4", "hsdp-ws8"])
def test_namespace_package_entry_point_plan_equals_real_torch(argv, world_size):
    res, _ = assert_plan_matches_torch(TRAIN, world_size, argv=argv)
    depth = 2 if "model.depth=2" in argv else 3
    assert [u.modules for u in res.plan.units] == (
        [["embed"]] + [[f"trunk.layers.{i}"] for i in range(depth)] + [["head"], [""]])
    assert [u.reshard_after_forward for u in res.plan.units][:2] == [False, True]


def test_a_module_level_statement_of_an_imported_module_that_cannot_run_here_is_skipped():
    """`SAVE_OPS = {torch.ops.quickattn.fwd.default, ...}` in the sharding helper's module needs a kernels
    package that is not installed: the statement is skipped and noted, the helper still wraps."""
    from fsdp_lint.replay import replay

    res = replay(TRAIN, 4, argv=[TINY])
    first = res.skipped[0]
    assert first.path == os.path.join(APP, "corelib", "sharding.py")
    assert "quickattn" in first.error
    assert len(res.wrap_calls) == 6


def test_a_model_size_read_from_a_package_that_is_not_installed_names_the_package(cli):
    # vocab.kind=bpe: the vocabulary size is `bpe_turbo.load(path).size`, a stand-in: the error says so
    res = cli(TRAIN, "--world-size", "4", "--", TINY, "vocab.kind=bpe", "vocab.path=merges.bin", cwd=APP)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1
    assert "the model uses `bpe_turbo.load().size`" in res.err
    assert "`bpe_turbo` is not installed: pip install bpe-turbo" in res.err
    assert "Missing" not in res.err


def test_a_key_value_config_argument_that_does_not_exist_is_the_error(cli):
    # OmegaConf-style `config=PATH`, relative to the launch folder; the script opens it by absolute path
    res = cli(TRAIN, "--world-size", "4", "--", "config=apps/lm/configs/8b.yaml", cwd=APP)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1
    assert "named in the script's arguments, cannot be read" in res.err
    assert "8b.yaml" in res.err


def test_an_override_the_config_loader_rejects_is_the_error_not_a_none_config(cli):
    # the loader's `try: ... return OmegaConf.to_object(merged)` re-raises the schema error as its own:
    # the statement holding the return runs as written, so the error is the loader's, not a None config
    res = cli(TRAIN, "--world-size", "4", "--", TINY, "model.widthh=3", cwd=APP)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1
    assert "SettingsError: Key 'widthh' not in 'LMArgs'" in res.err
    assert "corelib/settings.py" in res.err and "NoneType" not in res.err


def test_a_script_that_needs_its_arguments_and_got_none_says_how_to_pass_them(cli):
    # `config=` is required by the settings helper (no argparse to recognise): the failure is the
    # cause, and the hint says the script ran without arguments
    res = cli(TRAIN, "--world-size", "4", cwd=APP)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1
    assert "Key not found: 'config'" in res.err
    assert "the script ran without arguments: pass those of a real launch after --" in res.err
    # with arguments, a failure gets no such hint
    res = cli(TRAIN, "--world-size", "4", "--", TINY, "model.widthh=3", cwd=APP)
    assert "without arguments" not in res.err


def test_the_device_type_from_torch_accelerator_is_the_simulated_cuda(cli, tmp_path):
    # device-generic scripts take the mesh's device type from torch.accelerator (torch >= 2.6): on a
    # CPU-only build it is None, but the replay simulates CUDA, and the accelerator API says the same
    (tmp_path / "train.py").write_text('''
import os
import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main():
    device_type = torch.accelerator.current_accelerator().type
    assert torch.accelerator.is_available() and torch.accelerator.device_count() >= 1
    torch.accelerator.set_device_index(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("dp",))
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


if __name__ == "__main__":
    main()
''')
    res = cli(str(tmp_path / "train.py"), "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    units = json.loads(res.out)["files"][0]["plan"]["units"]
    assert [u["module"] for u in units] == ["0", "1", "2", "3", ""]
