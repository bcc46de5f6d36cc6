"""``--suggest`` candidates of the granularity and sharding axes, each applied for real: per expert,
blocks plus the embeddings and the head, HSDP and ``reshard_after_forward`` to the GPUs of a node
(FSDP2, an MoE decoder with an untied embedding and head, fixtures/memory/moe), and FSDP1's
candidates of a file that wraps with a policy (fixtures/memory/fsdp1_policy).

For each: the change, written with torch's own API as its text says, builds and runs two steps under
the fake process group (FSDP2: ``fully_shard`` on the meta device under ``FakeTensorMode`` and
``FSDPMemTracker``; FSDP1: ``device_id=torch.device("cpu")`` and ``MemTracker``), the measured peak fits
the usable memory and is within the README's quarter of the reported peak; and the change written
into the file gives, in fsdp-lint's own plan of that file, the candidate's collectives per step."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import pytest
import torch

import oracle
from conftest import REPO

MOE = os.path.join(REPO, "fixtures", "memory", "moe")
MOE_ARGV = ["--n-layers", "3", "--n-experts", "2"]     # the script's own model options: a quick search
TOLERANCE = 0.25          # README "Plans that fit": the reported peak vs FSDPMemTracker / MemTracker
_CACHE = {}


def _load(path, name):
    """The fixture's module under a name of its own (the fixtures' `model`/`train` stay out of
    sys.modules, where other tests' fixtures of the same name would collide)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.dirname(path))
        for n in ("model", "train"):
            sys.modules.pop(n, None)
    return mod


def _analyse(path, settings, argv):
    from fsdp_lint.engine import analyse

    try:
        return analyse(path, settings, keep_model=True, argv=list(argv))
    finally:
        for n in ("model", "train"):
            sys.modules.pop(n, None)


def _every_candidate(key, path, argv, **options):
    """(the file's result, settings, every candidate the search builds): the device is sized so that
    the usable memory is 1.25x the file's own peak (what fits is then a question)."""
    if key not in _CACHE:
        from fsdp_lint.config import Settings
        from fsdp_lint.engine import _suggest
        from fsdp_lint.plan.budget import DEFAULT_FRAGMENTATION, GiB

        settings = Settings(activations_for_inferred_inputs=True, **options)
        res = _analyse(path, settings, argv)
        usable = int(1.25 * res.layout.memory.per_rank_bytes)
        settings = settings.with_overrides(gpu_memory=str(int(usable / (1 - DEFAULT_FRAGMENTATION)) + 2 * GiB))
        cands = _suggest(res.replay, res.tree, res.plan, res.layout, settings, every=True)
        _CACHE[key] = (res, settings, cands)
    return _CACHE[key]


def _only(cands, kind):
    (c,) = [c for c in cands if c["kinds"] == [kind]]
    return c


def _usable(res, settings):
    from fsdp_lint.plan.budget import budget_for

    return budget_for(res.layout.memory, settings).usable_bytes


def _collectives(layout):
    return (sum(u.all_gather_bytes_per_step for u in layout.units),
            sum(u.reduce_scatter_bytes_per_step for u in layout.units),
            sum(u.all_reduce_bytes_per_step for u in layout.units))


def _figures(c):
    return c["all_gather_bytes_per_step"], c["reduce_scatter_bytes_per_step"], c["all_reduce_bytes_per_step"]


def _written(tmp_path, src_dir, old, new, settings, argv, entry="train.py"):
    """fsdp-lint's plan of the fixture with `old` replaced by `new` in its entry point."""
    dst = tmp_path / os.path.basename(src_dir)
    shutil.copytree(src_dir, dst)
    text = (dst / entry).read_text()
    assert old in text
    (dst / entry).write_text(text.replace(old, new))
    return _analyse(str(dst / entry), settings, argv)


# --------------------------------------------------------------------------------------------
# FSDP2: the MoE decoder at 8 ranks, 4 GPUs per node
# --------------------------------------------------------------------------------------------
def _moe():
    return _every_candidate("moe", os.path.join(MOE, "train.py"), MOE_ARGV, world_size=8, gpus_per_node=4,
                            input_shape="4,256")


def _fsdp2_measured(wrap, mesh_shape):
    """Rank 0's peak under FSDPMemTracker: the MoE decoder (the options of MOE_ARGV) built on the meta
    device, `wrap(model, mesh)`, two AdamW steps."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh

    from test_simulate import _tracked_steps

    mod = _load(os.path.join(MOE, "model.py"), "suggest_moe_model")
    ws = 1
    for n in mesh_shape:
        ws *= n
    with oracle.fake_pg(ws):
        names = ("replicate", "shard") if len(mesh_shape) == 2 else None
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)   # outside FakeTensorMode
        with torch.device("meta"):
            model = mod.MoETransformer(n_layers=3, n_experts=2)
        wrap(model, mesh)      # on the meta device, as the file does (a mesh of a node is real ranks)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            dev = _tracked_steps(model, optimizer, lambda: (torch.randint(0, 4096, (4, 256)),),
                                 lambda out: out.float().mean(), FSDPMemTracker(model, optimizer))
    return int(dev["Total"] if "Total" in dev else next(v for k, v in dev.items() if str(k) == "Total"))


OLD_PARALLELIZE = ("    for layer in model.layers:\n        fully_shard(layer, mesh=mesh)\n"
                   "    fully_shard(model, mesh=mesh)\n")


def _check(c, measured, res, settings):
    usable = _usable(res, settings)
    assert c["fits"] is True and c["peak_bytes"] <= usable, (c["kinds"], c["peak_bytes"], usable)
    assert measured <= usable, (c["kinds"], measured, usable)
    assert abs(c["peak_bytes"] - measured) <= TOLERANCE * measured, (c["kinds"], c["peak_bytes"], measured)


def test_per_expert_units_applied_for_real(tmp_path):
    """Each expert of the `experts` ModuleList a unit of its own, inside its block's unit."""
    from torch.distributed.fsdp import fully_shard

    res, settings, cands = _moe()
    c = _only(cands, "wrap-experts")
    assert "`fully_shard(model.layers[0].moe.experts[0])`" in c["change"] and "before their blocks" in c["change"]
    assert c["plan"]["units"][:2] == [["layers.0.moe.experts.0"], ["layers.0.moe.experts.1"]]

    def wrap(model, mesh):
        for layer in model.layers:
            for expert in layer.moe.experts:
                fully_shard(expert, mesh=mesh)
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    _check(c, _fsdp2_measured(wrap, (8,)), res, settings)
    g = _written(tmp_path, MOE, OLD_PARALLELIZE,
                 "    for layer in model.layers:\n        for expert in layer.moe.experts:\n"
                 "            fully_shard(expert, mesh=mesh)\n        fully_shard(layer, mesh=mesh)\n"
                 "    fully_shard(model, mesh=mesh)\n", settings, MOE_ARGV)
    assert len(g.plan.units) == len(c["plan"]["units"])
    assert _collectives(g.layout) == _figures(c)
    assert abs(g.layout.memory.per_rank_bytes - c["peak_bytes"]) <= 0.01 * c["peak_bytes"], (g.layout.memory.per_rank_bytes, c["peak_bytes"])


def test_embeddings_and_head_units_applied_for_real(tmp_path):
    """The untied token embedding and output head as units of their own beside the blocks."""
    from torch.distributed.fsdp import fully_shard

    res, settings, cands = _moe()
    c = _only(cands, "wrap-embeddings-head")
    assert "`fully_shard(model.tok_embeddings)`, `fully_shard(model.output)` before `fully_shard(model)`" \
        in c["change"]

    def wrap(model, mesh):
        fully_shard(model.tok_embeddings, mesh=mesh)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model.output, mesh=mesh)
        fully_shard(model, mesh=mesh)

    _check(c, _fsdp2_measured(wrap, (8,)), res, settings)
    g = _written(tmp_path, MOE, OLD_PARALLELIZE,
                 "    fully_shard(model.tok_embeddings, mesh=mesh)\n" + OLD_PARALLELIZE.replace(
                     "    fully_shard(model, mesh=mesh)\n",
                     "    fully_shard(model.output, mesh=mesh)\n    fully_shard(model, mesh=mesh)\n"),
                 settings, MOE_ARGV)
    assert _collectives(g.layout) == _figures(c)
    assert abs(g.layout.memory.per_rank_bytes - c["peak_bytes"]) <= 0.01 * c["peak_bytes"]


def test_hsdp_applied_for_real(tmp_path):
    """HSDP for 8 ranks on nodes of 4 GPUs: a (replicate, shard) = (2, 4) mesh on every call."""
    from torch.distributed.fsdp import fully_shard

    res, settings, cands = _moe()
    c = _only(cands, "hsdp")
    assert "init_device_mesh(\"cuda\", (2, 4), mesh_dim_names=(\"replicate\", \"shard\"))" in c["change"]
    assert c["plan"]["mesh"] == [2, 4] and c["all_reduce_bytes_per_step"] > 0

    def wrap(model, mesh):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    _check(c, _fsdp2_measured(wrap, (2, 4)), res, settings)
    old = "    mesh = init_device_mesh(\"cuda\", (dist.get_world_size(),))\n"
    g = _written(tmp_path, MOE, old, "    mesh = init_device_mesh(\"cuda\", (2, 4), mesh_dim_names=(\"replicate\", "
                 "\"shard\"))\n", settings, MOE_ARGV)
    assert _collectives(g.layout) == _figures(c)
    assert abs(g.layout.memory.per_rank_bytes - c["peak_bytes"]) <= 0.01 * c["peak_bytes"]


def test_reshard_to_the_node_applied_for_real(cli, tmp_path):
    """`reshard_after_forward=4` on every block: after forward each block keeps its parameters
    sharded over the 4 GPUs of a node, and backward all-gathers within the node."""
    from torch.distributed.fsdp import fully_shard

    res, settings, cands = _moe()
    c = _only(cands, "reshard-to-node")
    assert "`reshard_after_forward=4` on every block's `fully_shard` call" in c["change"]

    def wrap(model, mesh):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=4)
        fully_shard(model, mesh=mesh)

    measured = _fsdp2_measured(wrap, (8,))
    _check(c, measured, res, settings)
    g = _written(tmp_path, MOE, OLD_PARALLELIZE, OLD_PARALLELIZE.replace(
        "fully_shard(layer, mesh=mesh)", "fully_shard(layer, mesh=mesh, reshard_after_forward=4)"), settings, MOE_ARGV)
    assert _collectives(g.layout) == _figures(c)
    assert abs(g.layout.memory.per_rank_bytes - c["peak_bytes"]) <= 0.01 * c["peak_bytes"]
    # --simulate of that file: fully_shard builds the node's post-forward mesh under fake tensors
    # (it failed with "ranks list must not contain duplicate entries" before)
    out = cli(str(tmp_path / "moe" / "train.py"), "--world-size", "8", "--input-shape", "4,256", "--simulate",
              "--format", "json", "--", *MOE_ARGV)
    assert out.code in (0, 1), out.err
    sim = json.loads(out.out)["files"][0]["memory"]["simulated"]
    assert "error" not in sim, sim
    assert abs(sim["peak_bytes"] - measured) <= 0.10 * measured, (sim["peak_bytes"], measured)


# --------------------------------------------------------------------------------------------
# FSDP1: the same decoder wrapped with a transformer auto-wrap policy, 8 ranks, 4 GPUs per node
# --------------------------------------------------------------------------------------------
def _moe_fsdp1():
    return _every_candidate("moe-fsdp1", os.path.join(MOE, "train_fsdp1.py"), MOE_ARGV, world_size=8,
                            gpus_per_node=4, input_shape="4,256")


def _fsdp1_measured(policy, mesh_shape=None, **fsdp_kwargs):
    """Rank 0's peak under MemTracker: FSDP1 with `policy` on the decoder of MOE_ARGV, two AdamW steps."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from test_simulate import _tracked_steps

    mod = _load(os.path.join(MOE, "model.py"), "suggest_moe_model")
    with oracle.fake_pg(8):
        if mesh_shape:
            fsdp_kwargs["device_mesh"] = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = mod.MoETransformer(n_layers=3, n_experts=2)
            model = FSDP(model, auto_wrap_policy=policy(mod, model), device_id=torch.device("cpu"), **fsdp_kwargs)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            dev = _tracked_steps(model, optimizer, lambda: (torch.randint(0, 4096, (4, 256)),),
                                 lambda out: out.float().mean(), tracker)
    return int(next(v for k, v in dev.items() if str(getattr(k, "value", k)) == "Total"))


OLD_FSDP1 = ("    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})\n"
             "    model = FSDP(model, auto_wrap_policy=policy, device_id=local_rank)\n")


def _blocks(mod, model):
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy({mod.DecoderLayer})


def _lambda(fn):
    def policy(mod, model):
        import functools

        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: fn(mod, model, m))
    return policy


FSDP1_CASES = {
    # kind: (text in the change, policy, FSDP kwargs, mesh, the file's lines written with the change)
    "wrap-experts": (
        "lambda_fn=lambda m: isinstance(m, DecoderLayer) or isinstance(m, Expert))",
        _lambda(lambda mod, model, m: isinstance(m, (mod.DecoderLayer, mod.Expert))), {}, None,
        "    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy\n\n"
        "    from model import Expert\n\n"
        "    policy = functools.partial(lambda_auto_wrap_policy,\n"
        "                               lambda_fn=lambda m: isinstance(m, DecoderLayer) or isinstance(m, Expert))\n"
        "    model = FSDP(model, auto_wrap_policy=policy, device_id=local_rank)\n"),
    "wrap-embeddings-head": (
        "lambda_fn=lambda m: isinstance(m, DecoderLayer) or m is model.tok_embeddings or m is model.output)",
        _lambda(lambda mod, model, m: isinstance(m, mod.DecoderLayer) or m is model.tok_embeddings
                or m is model.output), {}, None,
        "    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy\n\n"
        "    policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, DecoderLayer)\n"
        "                               or m is model.tok_embeddings or m is model.output)\n"
        "    model = FSDP(model, auto_wrap_policy=policy, device_id=local_rank)\n"),
    "no-reshard": (
        "`FSDP(..., sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)`", _blocks, {"sharding_strategy": "SHARD_GRAD_OP"},
        None, OLD_FSDP1.replace("device_id=local_rank)", "device_id=local_rank,\n"
                                "                 sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)")),
    "hsdp": (
        "`FSDP(..., sharding_strategy=ShardingStrategy.HYBRID_SHARD)` (shards within a node of 4 GPUs, 2 replicas)",
        _blocks, {"sharding_strategy": "HYBRID_SHARD"}, (2, 4),
        OLD_FSDP1.replace("device_id=local_rank)", "device_id=local_rank,\n"
                          "                 sharding_strategy=ShardingStrategy.HYBRID_SHARD)")),
}


@pytest.mark.parametrize("kind", list(FSDP1_CASES))
def test_fsdp1_candidates_applied_for_real(tmp_path, kind):
    """FSDP1's candidates: a lambda policy for the experts or the embeddings and head (as units of
    their own), SHARD_GRAD_OP, HYBRID_SHARD within the node."""
    from torch.distributed.fsdp import ShardingStrategy

    text, policy, kwargs, mesh, written = FSDP1_CASES[kind]
    res, settings, cands = _moe_fsdp1()
    assert res.plan.api == "fsdp1"
    c = _only(cands, kind)
    assert text in c["change"], c["change"]
    kwargs = {k: ShardingStrategy[v] for k, v in kwargs.items()}
    _check(c, _fsdp1_measured(policy, mesh, **kwargs), res, settings)
    if "ShardingStrategy" in written:
        written = "    from torch.distributed.fsdp import ShardingStrategy\n\n" + written
    g = _written(tmp_path, MOE, OLD_FSDP1, written, settings, MOE_ARGV, entry="train_fsdp1.py")
    assert [u.module for u in g.plan.units] == [m for (m,) in c["plan"]["units"]]
    assert _collectives(g.layout) == _figures(c)
    assert abs(g.layout.memory.per_rank_bytes - c["peak_bytes"]) <= 0.01 * c["peak_bytes"]


# --------------------------------------------------------------------------------------------
# accelerate with its FSDP plugin configured in code
# --------------------------------------------------------------------------------------------
PLUGIN = os.path.join(REPO, "fixtures", "frameworks", "accelerate_plugin")


def _plugin_arguments(change):
    """The keyword arguments of the ``FullyShardedDataParallelPlugin(...)`` a change names, as Python."""
    import re

    (args,) = re.findall(r"`FullyShardedDataParallelPlugin\((.*?)\)`", change)
    return eval(f"dict({args})")        # noqa: S307 - fsdp-lint's own output, literals only


def test_accelerate_plugin_in_code_changes_name_the_plugins_arguments(tmp_path):
    """`Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))`: every change is written as the
    plugin's (or the Accelerator's) arguments -- names the installed accelerate's plugin takes, values
    it accepts -- never the YAML keys; the HSDP change written into the plugin call gives the
    candidate's collectives in accelerate's own wrap of that file."""
    import inspect

    pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from torch.distributed.fsdp import ShardingStrategy

    res, settings, cands = _every_candidate("accelerate-plugin", os.path.join(PLUGIN, "train_gpt2.py"), [],
                                            world_size=16, gpus_per_node=8, input_shape="8,128")
    assert res.plan.framework == "accelerate" and res.plan.api == "fsdp1"
    names = set(inspect.signature(accelerate.FullyShardedDataParallelPlugin).parameters)
    changed = [c for c in cands if c["kinds"]]
    assert {k for c in changed for k in c["kinds"]} >= {"ac-full", "hsdp", "offload"}
    with oracle.fake_pg(16):
        for c in changed:
            assert "fsdp_config" not in c["change"] and "accelerate config" not in c["change"], c["change"]
            kwargs = _plugin_arguments(c["change"])
            assert set(kwargs) <= names, (kwargs, c["change"])
            plugin = accelerate.FullyShardedDataParallelPlugin(fsdp_version=1, **kwargs)    # accelerate accepts them
            if "hsdp" in c["kinds"]:
                # the file's SHARD_GRAD_OP with HSDP: the candidate's plan is FSDP1's _HYBRID_SHARD_ZERO2
                assert plugin.sharding_strategy == ShardingStrategy[c["plan"]["sharding_strategy"]]
    c = _only(cands, "hsdp")
    assert c["plan"]["sharding_strategy"] == "_HYBRID_SHARD_ZERO2"
    new = ", ".join(f"{k}={v!r}" for k, v in _plugin_arguments(c["change"]).items()).replace("'", '"')
    shutil.copytree(os.path.join(PLUGIN, "..", "configs", "tiny-gpt2"), tmp_path / "configs" / "tiny-gpt2")
    g = _written(tmp_path, PLUGIN, '        sharding_strategy="SHARD_GRAD_OP",\n', f"        {new},\n", settings, [],
                 entry="train_gpt2.py")
    assert g.plan.sharding_strategy == "_HYBRID_SHARD_ZERO2"
    assert _collectives(g.layout) == _figures(c)


def test_simulate_of_an_fsdp1_hybrid_shard_candidate(tmp_path):
    """``--suggest --simulate`` of FSDP1's HYBRID_SHARD candidate (8 ranks, nodes of 4 GPUs): the
    candidate applied in the simulated rank (``run.candidate``: ``FullyShardedDataParallel`` with
    ``sharding_strategy=HYBRID_SHARD`` and a (2, 4) device mesh) simulates without error, and its
    simulated peak is that of MemTracker on the same plan applied by hand (within 10 %, as
    ``--simulate`` is held to torch's tracker), within a quarter of the reported peak, and above the
    FULL_SHARD plan's (the shards are of 4 ranks, not 8)."""
    import time

    from fsdp_lint.config import Settings
    from fsdp_lint.engine import lint_file
    from fsdp_lint.run import simulate
    from fsdp_lint.run.spec import RunOptions
    from torch.distributed.fsdp import ShardingStrategy

    settings = Settings(world_size=8, gpus_per_node=4, input_shape="4,256", suggest=True,
                        activations_for_inferred_inputs=True, gpu_memory="80GiB")
    try:
        res = lint_file(os.path.join(MOE, "train_fsdp1.py"), settings, argv=list(MOE_ARGV))
    finally:
        for n in ("model", "train", "train_fsdp1"):
            sys.modules.pop(n, None)
    own = next(c for c in res.suggestions if not c["kinds"])
    c = next(c for c in res.suggestions if c["kinds"] == ["hsdp"])
    assert c["plan"]["sharding_strategy"] == "HYBRID_SHARD" and c["plan"]["mesh"] == [2, 4]
    res.suggestions = [own, c]
    res.simulated = {"peak_bytes": own["peak_bytes"]}
    simulate.simulate_candidates(res, settings, RunOptions(input_shape="4,256", timeout=600),
                                 time.monotonic() + 600)
    assert not c.get("simulated_error"), c.get("simulated_error")
    sim = c["simulated_peak_bytes"]
    measured = _fsdp1_measured(_blocks, (2, 4), sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    assert abs(sim - measured) <= 0.10 * measured, (sim, measured)
    assert abs(c["peak_bytes"] - sim) <= TOLERANCE * sim, (c["peak_bytes"], sim)
    assert sim > _fsdp1_measured(_blocks)
