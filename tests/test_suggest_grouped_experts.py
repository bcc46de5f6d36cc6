"""``--suggest`` on a mixture-of-experts model whose experts are ONE module holding stacked weights
(``GroupedExperts``: ``w1``/``w3`` ``[num_experts, dim, hidden]``, ``w2`` ``[num_experts, hidden, dim]``,
torchtitan's and transformers 5's Mixtral layout; fixtures/memory/moe_grouped), not a ``ModuleList``
of experts: the experts are not separate modules, so no candidate wraps one expert; the per-expert
axis offers the grouped module of each block as a unit of its own (``fully_shard(model.layers[0].moe.experts)``).

Oracle: that change applied with torch's API (FSDP2 ``fully_shard`` on the meta device, fake process
group, ``FakeTensorMode``, two AdamW steps under ``FSDPMemTracker``) is within the README's quarter
of the reported peak, and one real forward + backward of the model on CPU under the fake process group
issues exactly the candidate's all-gather and reduce-scatter bytes per step."""
from __future__ import annotations

import os

import torch

import oracle
from conftest import REPO
from test_suggest_applied import _every_candidate
from test_suggest_tied import TOLERANCE, _fsdp2_steps

GROUPED = os.path.join(REPO, "fixtures", "memory", "moe_grouped")
ARGV = ["--n-layers", "3", "--num-experts", "8"]
WS = 4


def _grouped():
    return _every_candidate("moe-grouped", os.path.join(GROUPED, "train.py"), ARGV, world_size=WS, input_shape="4,256")


def _model():
    import importlib.util
    import sys

    # a module of its own name in sys.modules (its dataclass reads its own module's namespace)
    spec = importlib.util.spec_from_file_location("suggest_grouped_model", os.path.join(GROUPED, "model.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return lambda: mod.Transformer(mod.ModelArgs(n_layers=3, num_experts=8))


def test_no_candidate_wraps_inside_the_grouped_experts_module():
    from fsdp_lint.suggest.search import _listed

    res, settings, cands = _grouped()
    tree = res.tree
    experts = [f for f, m in tree.modules.items() if m.cls == "GroupedExperts"]
    assert experts == ["layers.0.moe.experts", "layers.1.moe.experts", "layers.2.moe.experts"]
    assert not any(tree.modules[e].children for e in experts)        # its experts are tensors, not modules
    for c in cands:
        for unit in c["plan"]["units"]:
            for m in unit:
                assert m in tree.modules, (c["kinds"], m)
                assert not any(tree.is_ancestor(e, m) for e in experts), (c["kinds"], m)
        assert "experts[" not in c["change"] and ".w1" not in c["change"], c["change"]
    c = next(c for c in cands if c["kinds"] == ["wrap-experts"])
    assert c["plan"]["units"][:2] == [["layers.0.moe.experts"], ["layers.0"]]
    assert ("`fully_shard(model.layers[0].moe.experts)`, `fully_shard(model.layers[1].moe.experts)`, "
            "`fully_shard(model.layers[2].moe.experts)` before their blocks") in c["change"]
    assert any(d["kinds"] for d in _listed(cands))                   # --suggest lists plans that fit


def test_grouped_experts_units_applied_for_real():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from test_layout_vs_torch import _count_collectives

    res, settings, cands = _grouped()
    c = next(c for c in cands if c["kinds"] == ["wrap-experts"])
    assert c["fits"] is True
    build = _model()
    measured = _fsdp2_steps(c, build, WS, lambda: (torch.randint(0, 4096, (4, 256)),), lambda out: out.float().mean(),
                            None)
    assert abs(c["peak_bytes"] - measured) <= TOLERANCE * measured, (c["peak_bytes"], measured)

    # the change as its text says it, on real CPU tensors: one step's collectives
    with oracle.fake_pg(WS):
        mesh = init_device_mesh("cpu", (WS,))
        torch.manual_seed(0)
        model = build()
        for layer in model.layers:
            fully_shard(layer.moe.experts, mesh=mesh)
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with _count_collectives() as log:
            model(torch.randint(0, 4096, (2, 16))).float().sum().backward()
    per_rank = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
    for kind, nbytes in log:
        per_rank[kind] += nbytes * (WS - 1) // WS if kind != "all_reduce" else nbytes
    assert per_rank == {"all_gather": c["all_gather_bytes_per_step"],
                        "reduce_scatter": c["reduce_scatter_bytes_per_step"], "all_reduce": 0}, (per_rank, c)
    assert c["all_reduce_bytes_per_step"] == 0
