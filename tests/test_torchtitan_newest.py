"""torch 2.13 and torchtitan at their newest (issue 15, item 6) against real torch.

* FSDP2's SPMD path, torchtitan's default: every parameter a DTensor on the full mesh (its tensor
  parallel shard put there by the model's own sharding code, ``distribute_tensor``, no
  ``parallelize_module``), then ``fully_shard(block, mesh=<the full mesh>, dp_mesh_dims=...)``.
  ``fixtures/repos/titan_spmd`` is linted as launched; every parameter's local shape on the first, a
  middle and the last rank, its padded shard, placements and mesh dims equal what torch builds from
  the same package under the fake process group -- FSDP + TP, HSDP + TP, and FSDP over dp_shard x cp
  flattened (+ TP).
* What torch raises on that path (a plain parameter, an int ``reshard_after_forward``) is what the
  replay reports.
* ``shard_placement_fn`` returning ``ShardPlacementResult`` on the call's own mesh is planned as torch
  shards it; on another mesh (a per-parameter expert mesh) it is refused, and stays refused with
  ``--allow-partial`` (the units' numbers would be scaled by the wrong mesh).
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import fake_pg, raises  # noqa: E402
from oracle_nd import fsdp2_nd  # noqa: E402

from fsdp_lint.config import Settings  # noqa: E402
from fsdp_lint.engine import analyse  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TITAN = REPO / "fixtures" / "repos" / "titan_spmd"
MULTIDIM = REPO / "fixtures" / "multidim"
ENTRY = TITAN / "titan_spmd" / "train.py"

# name -> (world size, argv, mesh shape, mesh dim names) as ParallelDims.build_mesh makes them
CASES = {
    "fsdp-tp": (8, ["--tp", "2"], (4, 2), ("dp_shard", "tp")),
    "hsdp-tp": (8, ["--tp", "2", "--dp-replicate", "2"], (2, 2, 2), ("dp_replicate", "dp_shard", "tp")),
    "fsdp-cp-tp": (16, ["--tp", "2", "--cp", "2"], (4, 2, 2), ("dp_shard", "cp", "tp")),
    "fsdp-only": (4, [], (4,), ("dp_shard",)),
}


@functools.lru_cache(maxsize=None)
def _package() -> dict:
    """The fixture's own modules for the torch side, taken out of sys.modules again afterwards."""
    sys.path.insert(0, str(TITAN))
    try:
        import titan_spmd.distributed.fsdp as fsdp
        import titan_spmd.distributed.parallel_dims as pdims
        import titan_spmd.models.decoder as decoder
        return {"fsdp": fsdp, "pdims": pdims, "decoder": decoder}
    finally:
        sys.path.remove(str(TITAN))
        for name in [n for n in sys.modules if n == "titan_spmd" or n.startswith("titan_spmd.")]:
            del sys.modules[name]


def _torch(name: str, rank: int):
    world, argv, shape, names = CASES[name]
    pkg = _package()
    args = dict(zip(argv[::2], map(int, argv[1::2])))

    def wrap(model, mesh):
        pd = pkg["pdims"].ParallelDims(dp_replicate=args.get("--dp-replicate", 1), dp_shard=-1,
                                       cp=args.get("--cp", 1), tp=args.get("--tp", 1), world_size=world)
        pd._mesh = mesh
        model.parallelize(mesh)
        mesh, dims = pkg["fsdp"].resolve_fsdp_mesh(pd)
        pkg["fsdp"].apply_fsdp(model, mesh, dims)

    model_fn = lambda: pkg["decoder"].Decoder(pkg["decoder"].DecoderConfig())  # noqa: E731
    return fsdp2_nd(model_fn, wrap, world_size=world, rank=rank, mesh_shape=shape, mesh_dim_names=names)


@functools.lru_cache(maxsize=None)
def _lint(name: str):
    world, argv, _, _ = CASES[name]
    return analyse(str(ENTRY), Settings(world_size=world), argv=list(argv))


@pytest.mark.parametrize("name", list(CASES))
def test_spmd_path_equals_torch(name):
    from fsdp_lint.plan.layout import param_local_shape

    world, _, shape, names = CASES[name]
    res = _lint(name)
    assert res.skipped is None and not res.plan.unsupported, (res.skipped, res.plan.unsupported)
    assert res.plan.mesh.shape == shape and res.plan.mesh.names == names and res.plan.world_size == world
    # the model's size is the model's: DTensor parameters count their global shape
    total = sum(math.prod(p.shape) for ul in res.layout.units for p in ul.params)
    pkg = _package()
    import torch

    with torch.device("meta"):
        assert total == sum(p.numel() for p in pkg["decoder"].Decoder(pkg["decoder"].DecoderConfig()).parameters())
    for rank in (0, world // 2 + 1, world - 1):
        want = _torch(name, rank)
        assert [u.unit.modules for u in res.layout.units] == [g["modules"] for g in want]
        for ul, g in zip(res.layout.units, want):
            assert [p.fqn for p in ul.params] == [t["fqn"] for t in g["params"]]
            for p, t in zip(ul.params, g["params"]):
                assert list(param_local_shape(res.plan, ul.unit, p, rank)) == t["local_shape"], (p.fqn, rank)
                assert (p.placements, p.mesh_dims) == (t["placements"], t["mesh_dims"]), p.fqn
                if rank == 0:
                    assert p.padded_numel == math.prod(t["padded_local_shape"]) * ul.world_size, p.fqn
            if rank == 0:
                assert ul.shard_numel == sum(math.prod(t["padded_local_shape"]) for t in g["params"])


def _write(tmp_path, body: str) -> Path:
    shutil.copy(MULTIDIM / "model.py", tmp_path / "model.py")
    (tmp_path / "train.py").write_text(
        "import os\n\nimport torch\nimport torch.distributed as dist\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from torch.distributed.fsdp import DataParallelMeshDims, fully_shard\n"
        "from torch.distributed.tensor import Replicate, Shard, distribute_tensor\n\n"
        "from model import ModelArgs, Transformer\n\n"
        "dist.init_process_group('nccl')\n" + body)
    return tmp_path / "train.py"


@pytest.mark.parametrize("body", [
    # a plain parameter on the SPMD path
    "mesh = init_device_mesh('cuda', (4, 2), mesh_dim_names=('dp_shard', 'tp'))\n"
    "model = Transformer(ModelArgs())\n"
    "fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard='dp_shard'))\n",
    # an int reshard_after_forward on the SPMD path
    "mesh = init_device_mesh('cuda', (4, 2), mesh_dim_names=('dp_shard', 'tp'))\n"
    "model = Transformer(ModelArgs())\n"
    "for n, p in list(model.norm.named_parameters()):\n"
    "    model.norm.register_parameter(n, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Replicate(), Replicate()])))\n"
    "fully_shard(model.norm, mesh=mesh, reshard_after_forward=2, dp_mesh_dims=DataParallelMeshDims(shard='dp_shard'))\n",
    # an axis the mesh does not have
    "mesh = init_device_mesh('cuda', (4, 2), mesh_dim_names=('dp_shard', 'tp'))\n"
    "model = Transformer(ModelArgs())\n"
    "fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard='fsdp'))\n",
    # a shard_placement_fn with an uneven shard on dim 1 (a (96, 250) weight over 8 ranks)
    "model = Transformer(ModelArgs())\n"
    "w2 = model.layers['0'].feed_forward.w2.weight\n"
    "fully_shard(model.layers['0'], shard_placement_fn=lambda p: Shard(1) if p is w2 else None)\n",
], ids=["plain-param", "reshard-int", "unknown-axis", "uneven-dim1"])
def test_spmd_errors_are_torchs(cli, tmp_path, body):
    import torch

    path = _write(tmp_path, body)
    res = cli("train.py", "--world-size", "8", cwd=str(tmp_path))
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("model", None)          # another test's `model` (a fixture folder's) is not this one
    try:
        with fake_pg(8, 0), torch.device("meta"):
            src = path.read_text().replace("'cuda'", "'cpu'").replace("dist.init_process_group('nccl')\n", "")
            err = raises(lambda: exec(compile(src, str(path), "exec"),
                                      {"__name__": "__main__"}))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    assert err is not None
    assert res.code == 2 and f"{type(err).__name__}: {str(err).splitlines()[0]}" in res.err, (res.err, err)
    assert "Traceback" not in res.err


PLACEMENT_RESULT = '''
from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult
from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info

mesh = init_device_mesh('cuda', (8,), mesh_dim_names=('fsdp',))
experts_mesh = init_device_mesh('cuda', (2, 4), mesh_dim_names=('efsdp', 'ep'))
model = Transformer(ModelArgs())
dp_info = _get_mesh_info(mesh)
other_info = _get_mesh_info(experts_mesh['efsdp'])
for block in model.layers.values():
    ffn = {block.feed_forward.w1.weight, block.feed_forward.w3.weight}   # (250, 96): dim 1 divides 8

    def placement(param, _ffn=ffn):
        if param in _ffn:
            return ShardPlacementResult(placement=Shard(1), mesh_info=MESH_INFO)
        return ShardPlacementResult(placement=None, mesh_info=dp_info)

    fully_shard(block, mesh=mesh, shard_placement_fn=placement)
fully_shard(model, mesh=mesh)
'''


def test_shard_placement_result_on_the_calls_mesh_equals_torch(tmp_path):
    import torch

    from fsdp_lint.plan.layout import param_local_shape

    path = _write(tmp_path, PLACEMENT_RESULT.replace("MESH_INFO", "dp_info"))
    res = analyse(str(path), Settings(world_size=8))
    assert res.skipped is None and not res.plan.unsupported, (res.skipped, res.plan.unsupported)
    sys.path.insert(0, str(tmp_path))
    try:
        from oracle import fsdp2_groups  # noqa: F401  (the 1-D oracle reads the same FSDPState)
        import model as fixture

        def wrap(model, _mesh):
            g = {"model": model, "__name__": "case"}
            src = path.read_text().split("model = Transformer(ModelArgs())\n", 1)[1]
            head = path.read_text().split("dist.init_process_group('nccl')\n", 1)[1].split("model = Transformer")[0]
            exec(compile("import torch\nfrom torch.distributed.device_mesh import init_device_mesh\n"
                         "from torch.distributed.fsdp import fully_shard\nfrom torch.distributed.tensor import Shard\n"
                         + head.replace("'cuda'", "'cpu'") + src, str(path), "exec"), g)

        for rank in (0, 7):
            want = fsdp2_nd(lambda: fixture.Transformer(fixture.ModelArgs()), wrap, world_size=8, rank=rank,
                            mesh_shape=(8,), mesh_dim_names=("fsdp",))
            assert [u.unit.modules for u in res.layout.units] == [g["modules"] for g in want]
            for ul, g in zip(res.layout.units, want):
                for p, t in zip(ul.params, g["params"]):
                    assert list(param_local_shape(res.plan, ul.unit, p, rank)) == t["local_shape"], (p.fqn, rank)
                    if rank == 0:
                        assert p.padded_numel == math.prod(t["padded_local_shape"]) * 8, p.fqn
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    assert torch.distributed.is_initialized() is False


def test_shard_placement_result_on_another_mesh_is_refused_even_with_allow_partial(cli, tmp_path):
    _write(tmp_path, PLACEMENT_RESULT.replace("MESH_INFO", "other_info"))
    for extra in ((), ("--allow-partial",)):
        res = cli("train.py", "--world-size", "8", *extra, cwd=str(tmp_path))
        assert res.code == 2, res.out
        assert "ShardPlacementResult" in res.err and "another mesh" in res.err and "Traceback" not in res.err
        assert "Pass --allow-partial" not in res.err
