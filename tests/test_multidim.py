"""Multi-dimensional plans (issue 11) against real torch: TP + FSDP2, HSDP 2-D and 3-D, FSDP1
HYBRID_SHARD with a device mesh, with a (shard, replicate) process-group pair and with node groups,
``reshard_after_forward`` as an int.

Every case is one wrap snippet over the Llama-shaped model of ``fixtures/multidim/model.py`` (uneven
dims: a 203-token vocabulary, 2 KV heads, a 250-wide FFN) with the tensor-parallel plan of
``fixtures/multidim/parallelize.py``. The snippet is linted in a file laid out like a training repo
(``model.py`` and ``parallelize.py`` beside it) and run for real by ``tests/oracle_nd.py`` under the
fake process group, as rank 0, the last rank and a middle rank; compared:

* every parameter's local shape on those ranks, its padded shard and its placements (FSDP2), every
  FlatParameter's shard size and the element spans the ranks hold (FSDP1);
* the collectives of one forward + backward recorded from torch (count, group size, bytes per rank)
  against the units' all-gathers, reduce-scatters and replica all-reduces.
"""
from __future__ import annotations

import collections
import functools
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import fsdp1_units  # noqa: E402
from oracle_nd import device_count, fsdp2_nd, step_collectives  # noqa: E402

from fsdp_lint.config import Settings  # noqa: E402
from fsdp_lint.engine import analyse  # noqa: E402
from fsdp_lint.plan.layout import ring_all_reduce_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "multidim"

HEADER = '''\
import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, ShardingStrategy, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from model import ModelArgs, Transformer, TransformerBlock
from parallelize import apply_tp
'''

BF16 = "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"

# name -> (api, mesh shape, mesh dim names, wrap snippet); the snippet sees `model`, `world_mesh`, `device`
CASES = {
    "tp-sp": ("fsdp2", (4, 2), ("dp", "tp"), f"""
apply_tp(model, world_mesh["tp"])
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh["dp"], mp_policy={BF16})
fully_shard(model, mesh=world_mesh["dp"], mp_policy={BF16})
"""),
    "tp-plain": ("fsdp2", (4, 2), ("dp", "tp"), """
apply_tp(model, world_mesh["tp"], sequence_parallel=False)
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh["dp"])
fully_shard(model, mesh=world_mesh["dp"])
"""),
    "hsdp-2d": ("fsdp2", (2, 4), ("dp_replicate", "dp_shard"), f"""
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh, mp_policy={BF16})
fully_shard(model, mesh=world_mesh, mp_policy={BF16})
"""),
    "hsdp-tp-3d": ("fsdp2", (2, 2, 2), ("dp_replicate", "dp_shard", "tp"), """
apply_tp(model, world_mesh["tp"])
dp_mesh = world_mesh["dp_replicate", "dp_shard"]
for block in model.layers.values():
    fully_shard(block, mesh=dp_mesh)
fully_shard(model, mesh=dp_mesh)
"""),
    # expert-parallel style: parameters sharded by distribute_module/distribute_tensor, not a ParallelStyle
    "ep-distribute": ("fsdp2", (4, 2), ("dp", "ep"), """
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor


def shard_experts(name, module, mesh):
    for pname, param in list(module.named_parameters(recurse=False)):
        dim = 1 if name.endswith("w2") else 0
        module.register_parameter(pname, torch.nn.Parameter(distribute_tensor(param, mesh, [Shard(dim)])))


for block in model.layers.values():
    distribute_module(block.feed_forward, world_mesh["ep"], shard_experts)
    fully_shard(block, mesh=world_mesh["dp"])
fully_shard(model, mesh=world_mesh["dp"])
"""),
    # torchtitan's HSDP with context parallelism: FSDP shards over dp_shard x cp flattened
    "hsdp-cp-3d": ("fsdp2", (2, 2, 2), ("dp_replicate", "dp_shard", "cp"), """
world_mesh["dp_shard", "cp"]._flatten(mesh_dim_name="dp_shard_cp")
dp_mesh = world_mesh["dp_replicate", "dp_shard_cp"]
for block in model.layers.values():
    fully_shard(block, mesh=dp_mesh)
fully_shard(model, mesh=dp_mesh)
"""),
    "reshard-int": ("fsdp2", (8,), ("dp",), """
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh, reshard_after_forward=2)
fully_shard(model, mesh=world_mesh, reshard_after_forward=4)
"""),
    "hsdp-reshard-int": ("fsdp2", (2, 4), ("dp_replicate", "dp_shard"), f"""
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh, reshard_after_forward=2, mp_policy={BF16})
fully_shard(model, mesh=world_mesh, mp_policy={BF16})
"""),
    "fsdp1-hybrid-mesh": ("fsdp1", (2, 4), ("replicate", "shard"), """
model = FSDP(model, device_mesh=world_mesh, sharding_strategy=ShardingStrategy.HYBRID_SHARD,
             auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), use_orig_params=True, device_id=device)
"""),
    "fsdp1-hybrid-zero2-flat": ("fsdp1", (2, 4), ("replicate", "shard"), """
model = FSDP(model, device_mesh=world_mesh, sharding_strategy=ShardingStrategy._HYBRID_SHARD_ZERO2,
             auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), device_id=device,
             mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
"""),
    "fsdp1-hybrid-groups": ("fsdp1", None, None, """
# a (shard, replicate) pair: shard inside a node of 4, replicate across the 2 nodes
rank, node = dist.get_rank(), 4
shard_groups = [dist.new_group(list(range(n * node, (n + 1) * node))) for n in range(dist.get_world_size() // node)]
replicate_groups = [dist.new_group(list(range(i, dist.get_world_size(), node))) for i in range(node)]
model = FSDP(model, process_group=(shard_groups[rank // node], replicate_groups[rank % node]),
             sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
             auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), device_id=device)
"""),
    "fsdp1-hybrid-nodes": ("fsdp1", None, None, """
model = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
             auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), device_id=device)
"""),
}
WORLD = 8
NODE = 4            # fsdp1-hybrid-nodes: --gpus-per-node 4 / torch's device_count() 4


def _file_text(name: str) -> str:
    api, shape, names, snippet = CASES[name]
    mesh = f'world_mesh = init_device_mesh("cuda", {shape!r}, mesh_dim_names={names!r})\n' if shape else ""
    return (f"{HEADER}\ndist.init_process_group(\"nccl\")\ndevice = torch.device(\"cuda\", int(os.environ['LOCAL_RANK']))\n"
            f"{mesh}model = Transformer(ModelArgs())\n{snippet}")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A training repository: the case files beside the model and the parallelize helpers."""
    root = tmp_path_factory.mktemp("multidim_repo")
    for helper in ("model.py", "parallelize.py"):
        shutil.copy(FIXTURES / helper, root / helper)
    for name in CASES:
        (root / f"train_{name.replace('-', '_')}.py").write_text(_file_text(name))
    return root


@functools.lru_cache(maxsize=None)
def _lint(root: str, name: str):
    settings = Settings(world_size=WORLD, gpus_per_node=NODE)
    res = analyse(os.path.join(root, f"train_{name.replace('-', '_')}.py"), settings)
    assert res.skipped is None and not res.plan.unsupported, (res.skipped, res.plan.unsupported)
    return res


@functools.lru_cache(maxsize=None)
def _namespace() -> dict:
    """The fixtures' model and helpers, imported for the torch side -- and taken out of sys.modules
    again, so that a later lint of a file importing `model`/`parallelize` imports its own."""
    sys.path.insert(0, str(FIXTURES))
    try:
        ns: dict = {"__name__": "multidim_case"}
        exec(compile(HEADER + "from parallelize import parallelize_llama\n", "<header>", "exec"), ns)
    finally:
        sys.path.remove(str(FIXTURES))
        for name in ("model", "parallelize"):
            sys.modules.pop(name, None)
    return ns


_oracle_cache: dict = {}


def _wrap_fn(name: str):
    import torch

    snippet = CASES[name][3]

    def wrap(model, mesh):
        g = dict(_namespace(), model=model, world_mesh=mesh, device=torch.device("cpu"))  # one class per name
        exec(compile(snippet, f"<{name}>", "exec"), g)
        return g["model"]
    return wrap


def _model_fn():
    ns = _namespace()
    return lambda: ns["Transformer"](ns["ModelArgs"]())


def torch_fsdp2(name: str, rank: int):
    key = ("fsdp2", name, rank)
    if key not in _oracle_cache:
        _, shape, names, _ = CASES[name]
        _oracle_cache[key] = fsdp2_nd(_model_fn(), _wrap_fn(name), world_size=WORLD, rank=rank, mesh_shape=shape,
                                      mesh_dim_names=names)
    return _oracle_cache[key]


def torch_fsdp1(name: str, rank: int):
    key = ("fsdp1", name, rank)
    if key not in _oracle_cache:
        _, shape, names, _ = CASES[name]
        wrap = _wrap_fn(name)

        def apply(model, FSDP):
            from oracle_nd import _mesh

            return wrap(model, _mesh(shape, names) if shape else None)

        with device_count(NODE):
            _oracle_cache[key] = fsdp1_units(_model_fn(), world_size=WORLD, rank=rank, apply=apply)
    return _oracle_cache[key]


def torch_collectives(name: str):
    import torch

    key = ("step", name)
    if key not in _oracle_cache:
        api, shape, names, _ = CASES[name]
        with device_count(NODE):
            _oracle_cache[key] = step_collectives(_model_fn(), _wrap_fn(name), lambda: torch.randint(0, 203, (2, 8)),
                                                  world_size=WORLD, rank=0, mesh_shape=shape, mesh_dim_names=names)
    return _oracle_cache[key]


UNEVEN_TP = "FSDP+TP sharding does not support uneven sharding"


def _or_refusal(findings, build):
    """What torch builds (``build()``); or None where torch refuses the plan while building it, and
    then fsdp-lint reports that refusal as FSD701, quoting torch's exception. torch 2.6 refuses FSDP
    over a TP ``Shard(0)`` parameter whose dim 0 does not split evenly over DP x TP (the fixture's
    203-token vocabulary, 250-wide FFN); later torch builds it. `findings`: (code, text) pairs."""
    try:
        want = build()
    except NotImplementedError as exc:      # torch's own refusal
        if UNEVEN_TP not in str(exc):
            raise
        said = f"NotImplementedError: {str(exc).splitlines()[0]}"
        assert any(code == "FSD701" and said in text for code, text in findings), (said, findings)
        return None
    assert not [text for code, text in findings if code == "FSD701" and UNEVEN_TP in text]
    return want


def _findings(res):
    from fsdp_lint.engine import check_rules

    return [(f.code, f.text) for f in check_rules(res, Settings(world_size=WORLD, gpus_per_node=NODE))]


RANKS = (0, 3, WORLD - 1)      # first, a middle one ((1, 1) on a 4x2 mesh), last
FSDP2_CASES = [n for n, c in CASES.items() if c[0] == "fsdp2"]
FSDP1_CASES = [n for n, c in CASES.items() if c[0] == "fsdp1"]


def _local_shape_at(res, ul, p, rank):
    from fsdp_lint.plan.layout import param_local_shape

    return list(param_local_shape(res.plan, ul.unit, p, rank))


@pytest.mark.parametrize("name", FSDP2_CASES)
def test_fsdp2_local_shapes_placements_and_padding(repo, name):
    res = _lint(str(repo), name)
    for rank in RANKS:
        want = _or_refusal(_findings(res), lambda: torch_fsdp2(name, rank))
        if want is None:
            return
        assert [u.unit.modules for u in res.layout.units] == [g["modules"] for g in want]
        for ul, g in zip(res.layout.units, want):
            assert [p.fqn for p in ul.params] == [t["fqn"] for t in g["params"]], ul.unit.module
            for p, t in zip(ul.params, g["params"]):
                assert list(p.shape) == t["shape"]
                assert _local_shape_at(res, ul, p, rank) == t["local_shape"], (p.fqn, rank)
                assert p.placements == t["placements"], p.fqn
                assert p.mesh_dims == t["mesh_dims"], p.fqn
                if rank == 0:
                    assert list(p.local_shape_first) == t["local_shape"], p.fqn
                    assert p.padded_numel == math.prod(t["padded_local_shape"]) * ul.world_size, p.fqn
                if rank == WORLD - 1:
                    assert list(p.local_shape_last) == t["local_shape"], p.fqn
            if rank == 0:
                assert ul.shard_numel == sum(math.prod(t["padded_local_shape"]) for t in g["params"])


@pytest.mark.parametrize("name", FSDP1_CASES)
def test_fsdp1_hybrid_shards_and_spans(repo, name):
    res = _lint(str(repo), name)
    units = [u for u in res.layout.units if u.unit.params]
    for rank in RANKS:
        want = torch_fsdp1(name, rank)
        assert [u.unit.module for u in units] == [o["module"] for o in want]
        for ul, o in zip(units, want):
            assert ul.unit.params == o["params"]
            assert (ul.padded_numel, ul.shard_numel) == (o["padded_numel"], o["shard_numel"]), ul.unit.module
            shard_rank = ul.unit.mesh.shard.coordinate(rank)
            assert [[s.fqn, s.start, s.end] for s in ul.rank_spans(shard_rank)] == o["spans"], (ul.unit.module, rank)
            assert ul.world_size == 4 and ul.replicate_size == 2


def _torch_counter(log):
    """torch's collectives as (kind, group size, bytes one rank sends): all-gather (n-1) x its input,
    reduce-scatter (n-1) x its output, all-reduce 2 (n-1)/n x the tensor (ring)."""
    out = collections.Counter()
    for kind, size, nbytes, source, _ in log:
        if source != "c10d":
            continue
        per_rank = ring_all_reduce_bytes(nbytes, size) if kind == "all_reduce" else (size - 1) * nbytes
        out[(kind, size, per_rank)] += 1
    return out


def _layout_counter(layout):
    out = collections.Counter()
    for ul in layout.units:
        unit = ul.unit
        raf = unit.reshard_after_forward
        if ul.all_gathers_per_step:
            out[("all_gather", ul.world_size, ul.all_gather_bytes)] += 1
        if ul.all_gathers_per_step == 2:
            if ul.backward_all_gather_bytes is not None:
                out[("all_gather", raf, ul.backward_all_gather_bytes)] += 1
            else:
                out[("all_gather", ul.world_size, ul.all_gather_bytes)] += 1
        if ul.reduce_scatters_per_step:
            out[("reduce_scatter", ul.world_size, ul.reduce_scatter_bytes)] += ul.reduce_scatters_per_step
        if ul.all_reduces_per_step:
            out[("all_reduce", ul.replicate_size, ul.all_reduce_bytes)] += ul.all_reduces_per_step
    return out


@pytest.mark.parametrize("name", [n for n in CASES if n != "ep-distribute"])  # no forward without input_fn
def test_fsdp_collectives_of_one_step_match_torch(repo, name):
    res = _lint(str(repo), name)
    log = _or_refusal(_findings(res), lambda: torch_collectives(name))
    if log is None:
        return
    assert _layout_counter(res.layout) == _torch_counter(log)
    lay = res.layout
    assert lay.step_bytes == sum(u.all_gather_bytes_per_step + u.reduce_scatter_bytes_per_step
                                 + u.all_reduce_bytes_per_step for u in lay.units)


TOKENS = 2 * 8      # the inputs of torch_collectives: batch 2 x sequence 8


@pytest.mark.parametrize("name", ["tp-sp", "tp-plain", "hsdp-tp-3d"])
def test_tp_collectives_of_one_step_match_torch(repo, name):
    """Every DTensor collective of a forward + backward (tensor parallelism): kind, group size and the
    elements moved (activations: elements per token x tokens; SequenceParallel weights: their numel)."""
    res = _lint(str(repo), name)
    log = _or_refusal(_findings(res), lambda: torch_collectives(name))
    if log is None:
        return
    ours = collections.Counter(
        (c.kind, c.group_size, c.numel if c.numel is not None else c.elements_per_token * TOKENS)
        for c in res.layout.tp_collectives)
    theirs = collections.Counter((kind, size, full) for kind, size, _, source, full in log
                                 if source == "functional")
    assert ours == theirs
    assert {c.mesh_dim for c in res.layout.tp_collectives} == {"tp"}


# ----------------------------------------------------------------------------- the fixtures, as a user runs them
def _json(cli, *args, **kwargs):
    import json

    res = cli(*args, "--format", "json", **kwargs)
    return res, json.loads(res.out)


def test_tp_entry_point_reports_the_mesh_it_builds_and_tp_shapes(cli, repo):
    """train_tp.py derives its (dp_shard, tp) mesh from WORLD_SIZE: the header, the JSON and the
    shapes follow the mesh; the shards are those torch builds for the same plan (case tp-sp)."""
    res, doc = _json(cli, "fixtures/multidim/train_tp.py", "--world-size", "8")
    findings = [(f["code"], f"{f['message']}: {f['detail']}") for f in doc["files"][0]["findings"]]
    want = _or_refusal(findings, lambda: torch_fsdp2("tp-sp", 0))   # the same TP plan and FSDP wrap
    if want is None:
        assert res.code == 1, res.err
        return
    assert res.code == 0, res.err
    plan = doc["files"][0]["plan"]
    assert plan["mesh"]["shape"] == [4, 2] and plan["mesh"]["dim_names"] == ["dp_shard", "tp"]
    assert plan["world_size"] == 8 and plan["world_size_source"] == "mesh" and plan["mesh"]["line"] == 26
    assert plan["unsupported"] == []
    for unit, g in zip(plan["units"], want):
        assert unit["shard_numel"] == sum(math.prod(t["padded_local_shape"]) for t in g["params"])
        assert [p["local_shape"] for p in unit["params"]] == [t["local_shape"] for t in g["params"]]
        assert [p["placements"] for p in unit["params"]] == [t["placements"] for t in g["params"]]
        assert unit["all_gather_bytes_per_step"] == unit["all_gather_bytes"] * unit["all_gathers_per_step"]
    assert {c["mesh_dim"] for c in plan["tp_collectives"]} == {"tp"}
    # the corners of the (dp_shard 4, tp 2) mesh: ranks 0, 1, 6, 7
    corners = [d["rank"] for d in plan["units"][0]["params"][0]["local_shapes"]]
    assert corners == [0, 1, 6, 7]
    for rank in corners:
        want = torch_fsdp2("tp-sp", rank)
        for unit, g in zip(plan["units"], want):
            got = [next(d["shape"] for d in p["local_shapes"] if d["rank"] == rank) for p in unit["params"]]
            assert got == [t["local_shape"] for t in g["params"]], rank
    text = cli("fixtures/multidim/train_tp.py", "--world-size", "16").out
    assert "mesh (dp_shard 8, tp 2) at train_tp.py:26" in text.splitlines()[0]
    assert "TP (tp 2):" in text.splitlines()[0]


def test_fsdp1_hybrid_entry_point_shards_inside_a_node(cli):
    """--world-size 16 with 8 GPUs per node: the file's (replicate, shard) mesh is (2, 8); every
    FlatParameter is sharded over 8 ranks and all-reduced over 2, as torch does (ranks 0 and 15)."""
    import torch

    res, doc = _json(cli, "fixtures/multidim/train_fsdp1_hybrid.py", "--world-size", "16")
    assert res.code == 0, res.err
    plan = doc["files"][0]["plan"]
    assert plan["mesh"]["shape"] == [2, 8] and plan["sharding_strategy"] == "HYBRID_SHARD"
    units = [u for u in plan["units"] if u["numel"]]
    assert {(u["shard_group_size"], u["replicate_group_size"], u["all_reduces_per_step"]) for u in units} == {(8, 2, 1)}
    ns = _namespace()
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    def apply(model, FSDP):
        from oracle_nd import _mesh

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={ns["TransformerBlock"]})
        return FSDP(model, device_mesh=_mesh((2, 8), ("replicate", "shard")), auto_wrap_policy=policy,
                    sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=True,
                    mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                    device_id=torch.device("cpu"))

    for rank in (0, 15):
        want = fsdp1_units(lambda: ns["Transformer"](ns["ModelArgs"](n_layers=4)), world_size=16, rank=rank,
                           apply=apply)
        assert [u["module"] for u in units] == [o["module"] for o in want]
        assert [(u["padded_numel"], u["shard_numel"]) for u in units] == \
            [(o["padded_numel"], o["shard_numel"]) for o in want]


def test_literal_mesh_launched_on_more_ranks_is_a_finding(cli):
    """A mesh of 8 written in the file, linted for 128 ranks: the plan is the mesh's (8 ranks, said
    in the header and the JSON), and FSD703 says what torch does on the other ranks."""
    res, doc = _json(cli, "fixtures/multidim/train_fixed_mesh.py", "--world-size", "128")
    assert res.code == 1
    entry = doc["files"][0]
    assert entry["plan"]["world_size"] == 8 and entry["plan"]["world_size_source"] == "mesh"
    assert {u["shard_group_size"] for u in entry["plan"]["units"]} == {8}
    [finding] = [f for f in entry["findings"] if f["code"] == "FSD703"]
    assert finding["line"] == 11 and "launched on 128" in (finding["message"] + " " + str(finding.get("detail")))
    assert "IndexError: list index out of range" in (finding["message"] + " " + str(finding.get("detail")))
    # without --world-size the file's mesh is simply the plan
    res = cli("fixtures/multidim/train_fixed_mesh.py")
    assert res.code == 0 and "FSD703" not in res.out and "mesh (dp 8) at train_fixed_mesh.py:11" in res.out


def test_mesh_messages_are_torchs():
    """The messages FSD703/FSD704 quote for what torch raises at run time, checked against torch."""
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdp_lint.plan.multidim import MESH_TOO_BIG, MESH_TOO_SMALL
    from fsdp_lint.replay.placements import reshard_int_dtensor_error
    from oracle import fake_pg, raises

    with fake_pg(8, 0):
        e = raises(lambda: init_device_mesh("cpu", (16,)))
    assert f"{type(e).__name__}: {e}" == MESH_TOO_BIG.format(world=8, mesh=16)
    with fake_pg(16, 12):
        mesh = init_device_mesh("cpu", (8,))
        with torch.device("meta"):
            lin = nn.Linear(4, 4)
        e = raises(lambda: fully_shard(lin, mesh=mesh))
    assert f"{type(e).__name__}: {e}" == MESH_TOO_SMALL
    # reshard_after_forward=2 over TP parameters: the first forward raises
    log_case = "tp-plain"
    snippet = CASES[log_case][3].replace("fully_shard(block, mesh=world_mesh[\"dp\"])",
                                         "fully_shard(block, mesh=world_mesh[\"dp\"], reshard_after_forward=2)")
    assert snippet != CASES[log_case][3]

    def wrap(model, mesh):
        g = dict(_namespace(), model=model, world_mesh=mesh)
        exec(compile(snippet, "<raf>", "exec"), g)
        return model

    # dims that split evenly over dp x tp (torch 2.6 refuses the fixture's uneven ones before this check)
    even = lambda: _namespace()["Transformer"](_namespace()["ModelArgs"](vocab_size=208, ffn_hidden=256))  # noqa: E731
    e = raises(lambda: step_collectives(even, wrap, lambda: torch.randint(0, 208, (2, 8)), world_size=8,
                                        rank=0, mesh_shape=(4, 2), mesh_dim_names=("dp", "tp")))
    assert f"{type(e).__name__}: {e}" == reshard_int_dtensor_error()


def test_what_is_not_modelled_is_said_and_exits_2_unless_allow_partial(cli, tmp_path):
    """A process group of an irregular rank set: exit 2 naming it; --allow-partial reports the plan
    with the element listed (text and JSON, with its line)."""
    shutil.copy(FIXTURES / "model.py", tmp_path / "model.py")
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "from model import ModelArgs, Transformer\n\n"
        "dist.init_process_group('nccl')\n"
        "group = dist.new_group([0, 1, 5, 7])\n"
        "model = FSDP(Transformer(ModelArgs()), process_group=group, device_id=torch.cuda.current_device())\n")
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2
    assert "train.py:7:" in res.err and "[0, 1, 5, 7]" in res.err and "--allow-partial" in res.err
    res = cli("train.py", "--allow-partial", cwd=str(tmp_path))
    assert res.code in (0, 1) and "train.py:7: not modelled (process_group)" in res.out
    res, doc = _json(cli, "train.py", "--allow-partial", cwd=str(tmp_path))
    [item] = doc["files"][0]["plan"]["unsupported"]
    assert item["line"] == 7 and item["what"] == "process_group"


def test_custom_parallel_style_is_said(cli, tmp_path):
    """A ParallelStyle of the file's own (torchtitan's NoParallel-like): its placements are torch's,
    its collectives are not counted -- said, exit 2 unless --allow-partial."""
    for helper in ("model.py", "parallelize.py"):
        shutil.copy(FIXTURES / helper, tmp_path / helper)
    (tmp_path / "train.py").write_text(HEADER + '''
from torch.distributed.tensor import Replicate, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module


class NoParallel(ParallelStyle):
    """Replicate the module's parameters over the TP mesh (a norm outside sequence parallelism)."""

    def _apply(self, module, device_mesh):
        def replicate(name, mod, mesh):
            for pname, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(pname, torch.nn.Parameter(distribute_tensor(p, mesh, [Replicate()])))
        return distribute_module(module, device_mesh, replicate)


world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
model = Transformer(ModelArgs())
apply_tp(model, world_mesh["tp"], sequence_parallel=False)
parallelize_module(model.norm, world_mesh["tp"], NoParallel())
for block in model.layers.values():
    fully_shard(block, mesh=world_mesh["dp"])
fully_shard(model, mesh=world_mesh["dp"])
''')
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2 and "NoParallel" in res.err and "--allow-partial" in res.err
    res, doc = _json(cli, "train.py", "--allow-partial", cwd=str(tmp_path))
    plan = doc["files"][0]["plan"]
    assert [u["what"] for u in plan["unsupported"]] == ["tp-style"]
    norm = next(p for u in plan["units"] for p in u["params"] if p["fqn"] == "norm.weight")
    assert norm["placements"] == ["Shard(dim=0)", "Replicate()"] and norm["local_shape"] == [24]


@pytest.mark.parametrize("index", range(3))
def test_fsd701_quotes_what_torch_raises(tmp_path, index):
    """Each INVALID example of FSD701, run with real torch (fake process group, meta model): the
    exception fully_shard raises is the one the finding quotes."""
    import torch

    from fsdp_lint.engine import lint_file
    from fsdp_lint.check.rule import rule_by_code
    from oracle import fake_pg

    ex = rule_by_code("FSD701").INVALID[index]
    path = tmp_path / "example.py"
    path.write_text(ex.source)
    [finding] = [f for f in lint_file(str(path), Settings(world_size=ex.world_size)).findings
                 if f.code == "FSD701"][:1]
    with fake_pg(ex.world_size, 0), torch.device("meta"):
        with pytest.raises(Exception) as info:
            exec(compile(ex.source.replace('"cuda"', '"cpu"'), "<example>", "exec"), {"__name__": "example"})
    assert f"`{type(info.value).__name__}: {str(info.value).splitlines()[0]}`" in finding.text


def test_torchtitan_shaped_entry_equals_torch(cli):
    """train_titan.py builds its 3-D mesh in a function and applies TP then HSDP through
    parallelize.parallelize_llama (a helper module): linted as launched (16 ranks, `-- --tp 2
    --dp-replicate 2`), every parameter's shape and placements equal what torch builds from the same
    helper on ranks 0, 5 and 15, and so do the collectives of one step (FSDP's and TP's)."""
    import torch

    res = analyse(str(FIXTURES / "train_titan.py"), Settings(world_size=16), argv=["--tp", "2", "--dp-replicate", "2"])
    assert res.plan.mesh.shape == (2, 4, 2) and res.plan.mesh.names == ("dp_replicate", "dp_shard", "tp")
    assert not res.plan.unsupported and res.plan.world_size == 16
    ns = _namespace()

    def wrap(model, mesh):
        return ns["parallelize_llama"](model, mesh, tp=2, dp_replicate=2)

    shape, names = (2, 4, 2), ("dp_replicate", "dp_shard", "tp")
    model_fn = lambda: ns["Transformer"](ns["ModelArgs"]())  # noqa: E731
    from fsdp_lint.engine import check_rules

    findings = [(f.code, f.text) for f in check_rules(res, Settings(world_size=16))]
    for rank in (0, 5, 15):
        want = _or_refusal(findings, lambda: fsdp2_nd(model_fn, wrap, world_size=16, rank=rank, mesh_shape=shape,
                                                       mesh_dim_names=names))
        if want is None:        # torch refuses the fixture's uneven dims (2.6): fsdp-lint reports it
            return
        assert [u.unit.modules for u in res.layout.units] == [g["modules"] for g in want]
        for ul, g in zip(res.layout.units, want):
            assert ul.replicate_size == 2 and ul.world_size == 4
            for p, t in zip(ul.params, g["params"]):
                assert (_local_shape_at(res, ul, p, rank), p.placements) == (t["local_shape"], t["placements"]), p.fqn
    log = step_collectives(model_fn, wrap, lambda: torch.randint(0, 203, (2, 8)), world_size=16, rank=0,
                           mesh_shape=shape, mesh_dim_names=names)
    assert _layout_counter(res.layout) == _torch_counter(log)
    ours = collections.Counter((c.kind, c.group_size, c.numel if c.numel is not None else c.elements_per_token * TOKENS)
                               for c in res.layout.tp_collectives)
    assert ours == collections.Counter((k, n, full) for k, n, _, src, full in log if src == "functional")
    # the units report the helper's fully_shard lines and the linted file's call site
    assert {os.path.basename(u.path) for u in res.plan.units} == {"parallelize.py"}
    call_line = next(i for i, ln in enumerate((FIXTURES / "train_titan.py").read_text().splitlines(), 1)
                     if "parallelize_llama(model" in ln)
    assert {u.call_site[1] for u in res.plan.units if u.call_site} == {call_line}


def test_dtensor_caches_are_emptied_between_files():
    """A TP op fills DTensor's sharding and redistribution caches, keyed by meshes that compare by
    value; the replay empties every one of them after a file (on torch 2.6 and 2.9 they have other
    names and no ``cache_clear``: clearing used to stop at the first AttributeError, silently)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from oracle import fake_pg

    from fsdp_lint.replay.parallel import clear_dtensor_caches, dtensor_caches

    with fake_pg(4, 0):
        mesh = init_device_mesh("cpu", (4,))
        x = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
        (x * 2).redistribute(mesh, [Replicate()]).sum()
        caches = dtensor_caches()
        assert len(caches) == 3
        assert sum(c.cache_info().currsize for c in caches) > 0     # the op filled them
        clear_dtensor_caches()
        assert [c.cache_info().currsize for c in caches] == [0, 0, 0]
