"""fsdp-lint's plan/layout arithmetic against what torch really builds (DESIGN.md §5, issue 2).

Every case is one model + wrap file, written to a temporary directory and linted with
``fsdp_lint.engine.analyse``. The *same* model source and the *same* wrap statements are then run
for real by ``tests/oracle.py`` (FSDP1 on CPU, FSDP2 on meta, both under torch's fake process group,
as rank 0 and as the last rank) and the two answers are compared field by field:

FSDP1  unit membership and application order, each unit's parameters and their order, unpadded
       numel, the FlatParameter layout (alignment padding with ``use_orig_params=True``), padded
       numel, shard numel and the element spans rank 0 and rank ws-1 hold.
FSDP2  groups (modules, in call order), each group's parameter order (torch's post-order walk),
       every parameter's global and local shape on rank 0 and rank ws-1, dtype, requires_grad,
       and the padded shard the collectives move.

The collective tests run one real forward + backward under the fake process group with the
collectives counted, and compare counts and bytes per unit with ``UnitLayout``.

Matrix: 4 models (the article's 2-block transformer, tied embedding/lm_head in the root,
uneven dims, frozen/mixed-dtype params) x world sizes 1, 2, 3, 4, 8 x use_orig_params (FSDP1)
x fp32 / bf16 param_dtype. Each torch result is built once (module-level caches).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import math
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import cpu_stream_events, fake_pg, fsdp1_units, fsdp2_groups, raises  # noqa: E402

from fsdp_lint.config import Settings  # noqa: E402
from fsdp_lint.engine import analyse  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORLD_SIZES = [1, 2, 3, 4, 8]

HEADER = '''\
import functools
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy, lambda_auto_wrap_policy, transformer_auto_wrap_policy,
)
'''


def _article_source() -> str:
    text = (REPO / "fixtures" / "article_model.py").read_text()
    return text.split('"""', 2)[2]  # drop the module docstring, keep imports and classes


# ----------------------------------------------------------------------------- models
# Each model: its source, the constructor expression, and wrap statements per API. The wrap
# statements see ``model``; {kw} is replaced by the options of the case (use_orig_params,
# mixed precision), always as trailing keyword arguments.
MODELS: Dict[str, dict] = {
    "article": dict(
        src=_article_source(),
        ctor="Transformer(num_layers=2)",
        input="torch.randn(2, 4, 512)",
        fsdp1="""
            model = FSDP(
                model,
                auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                   transformer_layer_cls={{TransformerBlock}}),
                device_id=torch.device("cpu"){kw},
            )
        """,
        fsdp2="""
            for layer in model.layers:
                fully_shard(layer{kw})
            fully_shard(model{kw})
        """,
    ),
    # embedding tied to lm_head, both in the root unit/group
    "tied": dict(
        src='''
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 3 * d)
        self.down = nn.Linear(3 * d, d, bias=False)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TiedLM(nn.Module):
    def __init__(self, vocab=50, d=12, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
''',
        ctor="TiedLM()",
        input="torch.randint(0, 50, (2, 5))",
        fsdp1="""
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{Block}}),
                         device_id=torch.device("cpu"){kw})
        """,
        fsdp2="""
            for i, layer in enumerate(model.layers):
                fully_shard(layer{kw})
            fully_shard(model{kw})
        """,
    ),
    # dims that do not divide the world size, a module with its own params registered before its
    # children, params with dim 0 smaller than the world size, nested FSDP2 groups, manual FSDP1 wraps
    "uneven": dict(
        src='''
class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(5, 3))
        self.proj = nn.Linear(37, 13)
        self.table = nn.Embedding(11, 7)
        self.tiny = nn.Parameter(torch.zeros(2, 9))


class OddNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(13, 37)
        self.blocks = nn.ModuleList([Odd() for _ in range(3)])
        self.head = nn.Linear(13, 3)
        self.gain = nn.Parameter(torch.ones(1))
''',
        ctor="OddNet()",
        fsdp1="""
            kw = dict(device_id=torch.device("cpu"){kw})
            for i, block in enumerate(model.blocks):
                model.blocks[i] = FSDP(block, **kw)
            model = FSDP(model, **kw)
        """,
        fsdp2="""
            for block in model.blocks:
                fully_shard(block.table{kw})
                fully_shard(block{kw})
            fully_shard(model{kw})
        """,
    ),
    # LoRA-style adapters: the base weights are frozen (FSDP1: same unit as trainable params,
    # which torch accepts with use_orig_params=True only); FSDP2 also casts them to bf16
    "mixed": dict(
        src='''
class Adapter(nn.Module):
    def __init__(self, d, r):
        super().__init__()
        self.base = nn.Linear(d, d)
        self.lora_a = nn.Linear(d, r, bias=False)
        self.lora_b = nn.Linear(r, d, bias=False)

    def forward(self, x):
        return self.base(x.to(self.base.weight.dtype)).to(x.dtype) + self.lora_b(self.lora_a(x))


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = Adapter(d, 4)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Linear(d, 2 * d)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)[..., : x.shape[-1]]


class LoraNet(nn.Module):
    def __init__(self, d=10, n_layers=2):
        super().__init__()
        self.inp = nn.Linear(6, d)
        self.layers = nn.ModuleList([Layer(d) for _ in range(n_layers)])
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)
''',
        ctor="LoraNet()",
        input="torch.randn(2, 6)",
        fsdp1="""
            for name, p in model.named_parameters():
                if "base" in name:
                    p.requires_grad = False
            model = FSDP(
                model,
                auto_wrap_policy=functools.partial(lambda_auto_wrap_policy,
                                                   lambda_fn=lambda m: isinstance(m, Layer)),
                device_id=torch.device("cpu"){kw},
            )
        """,
        fsdp2="""
            for layer in model.layers:
                layer.attn.base.to(torch.bfloat16).requires_grad_(False)
                fully_shard(layer{kw})
            fully_shard(model{kw})
        """,
    ),
    # outside the matrix: one sub-module registered under two names, ignored modules/params
    "shared": dict(
        src='''
class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.inner = nn.Sequential(nn.Linear(7, 7), nn.LayerNorm(7))
        self.b = self.a
        self.c = nn.Linear(7, 3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Shared(), Shared()])
        self.head = nn.Linear(3, 2)
        self.gain = nn.Parameter(torch.ones(3))
''',
        ctor="Net()",
        fsdp1="""
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{Shared}}), ignored_modules=[model.head],
                         device_id=torch.device("cpu"){kw})
        """,
        fsdp2="""
            for blk in model.blocks:
                fully_shard(blk{kw})
            fully_shard(model, ignored_params={{model.gain}}{kw})
        """,
    ),
    # fine-tuning the top half: nothing before the frozen blocks is trainable, so autograd never
    # reaches them in backward (one all-gather each; FSDP2 prefetches the last one once more)
    "halffrozen": dict(
        src='''
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Stack(nn.Module):
    def __init__(self, d=16, n_layers=6):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_layers)])
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)
''',
        ctor="Stack()",
        input="torch.randn(2, 8)",
        fsdp1="""
            model.inp.requires_grad_(False)
            for block in model.blocks[:3]:
                block.requires_grad_(False)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{Block}}), device_id=torch.device("cpu"){kw})
        """,
        fsdp2="""
            model.inp.requires_grad_(False)
            for block in model.blocks[:3]:
                block.requires_grad_(False)
            for block in model.blocks:
                fully_shard(block{kw})
            fully_shard(model{kw})
        """,
    ),
    # an FSDP2 group whose modules run apart (an embedding and the head that reads its weight):
    # gathered for each of their forwards, and for each in backward
    "grouped": dict(
        src='''
class Head(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self._embedding = (embedding,)

    def forward(self, h):
        return torch.nn.functional.linear(h, self._embedding[0].weight)


class LM(nn.Module):
    def __init__(self, vocab=40, d=12, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(n_layers)])
        self.head = Head(self.embed)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)
''',
        ctor="LM()",
        input="torch.randint(0, 40, (2, 5))",
        fsdp2="""
            fully_shard([model.embed, model.head]{kw})
            for layer in model.layers:
                fully_shard(layer{kw})
            fully_shard(model{kw})
        """,
    ),
}
MATRIX_MODELS = ["article", "tied", "uneven", "mixed"]


def _kw(api: str, uop, bf16: bool, extra: str = "") -> str:
    parts = []
    if api == "fsdp1":
        parts.append(f"use_orig_params={uop}")
        if bf16:
            parts.append("mixed_precision=MixedPrecision(param_dtype=torch.bfloat16)")
    elif bf16:
        parts.append("mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
    if extra:
        parts.append(extra)
    return "".join(", " + p for p in parts)


def _wrap_code(model: str, api: str, uop, bf16: bool, extra: str = "", wrap: str = "") -> str:
    template = textwrap.dedent(wrap or MODELS[model][api])
    return template.format(kw=_kw(api, uop, bf16, extra))


def _file_text(model: str, wrap_code: str) -> str:
    m = MODELS[model]
    return f"{HEADER}\n{m['src']}\n\nmodel = {m['ctor']}\n{wrap_code}"


# ----------------------------------------------------------------------------- fsdp-lint side
_TMP = None
_files: Dict[tuple, str] = {}
_lint_cache: Dict[tuple, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _session(tmp_path_factory):
    """A directory for the case files; the source facts of a file are read once for all world sizes
    (the file does not depend on the world size; parsing is most of analyse's time)."""
    global _TMP
    import fsdp_lint.entry.source as source

    _TMP = tmp_path_factory.mktemp("layout_vs_torch")
    facts_cache: Dict[str, object] = {}
    real_read_source = source.read_source

    def read_source(path):
        if path not in facts_cache:
            facts_cache[path] = real_read_source(path)
        return facts_cache[path]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny kernels; two threads on a shared 2-core machine are 3-5x slower
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(source, "read_source", read_source)
            yield
    finally:
        torch.set_num_threads(threads)
    _files.clear()
    _lint_cache.clear()
    _oracle_cache.clear()


def lint(model: str, wrap_code: str, ws: int):
    """``analyse`` of the case file (model + wrap code) at world size `ws`."""
    if (model, wrap_code) not in _files:
        path = _TMP / f"case_{len(_files)}_{model}.py"
        path.write_text(_file_text(model, wrap_code))
        _files[(model, wrap_code)] = str(path)
    key = (model, wrap_code, ws)
    if key not in _lint_cache:
        res = analyse(_files[(model, wrap_code)], Settings(world_size=ws))
        assert res.skipped is None, res.skipped
        _lint_cache[key] = res
    return _lint_cache[key]


# ----------------------------------------------------------------------------- torch side
_oracle_cache: Dict[tuple, object] = {}


@functools.lru_cache(maxsize=None)
def _namespace(model: str) -> dict:
    """The model file's imports and classes (shared by all torch runs of that model: each run
    builds a new instance)."""
    ns: dict = {"__name__": "layout_case"}
    exec(compile(HEADER + MODELS[model]["src"], f"<{model}>", "exec"), ns)
    return ns


@functools.lru_cache(maxsize=None)
def _compiled(code: str):
    return compile(code, "<wrap>", "exec")


def _model_fn(model: str, ns: dict):
    return lambda: eval(MODELS[model]["ctor"], ns)


def torch_fsdp1(model: str, wrap_code: str, ws: int, rank: int) -> List[dict]:
    key = ("fsdp1", model, wrap_code, ws, rank)
    if key not in _oracle_cache:
        ns = _namespace(model)

        def apply(m, FSDP):
            g = dict(ns, model=m)
            exec(_compiled(wrap_code), g)
            return g["model"]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ws=1: "switching to use NO_SHARD"
            _oracle_cache[key] = fsdp1_units(_model_fn(model, ns), world_size=ws, rank=rank, apply=apply)
    return _oracle_cache[key]


def torch_fsdp2(model: str, wrap_code: str, ws: int, rank: int) -> List[dict]:
    key = ("fsdp2", model, wrap_code, ws, rank)
    if key not in _oracle_cache:
        ns = _namespace(model)
        real_fully_shard = ns["fully_shard"]

        def apply(m, mesh):
            g = dict(ns, model=m, fully_shard=functools.partial(real_fully_shard, mesh=mesh))
            exec(_compiled(wrap_code), g)

        _oracle_cache[key] = fsdp2_groups(_model_fn(model, ns), world_size=ws, rank=rank, apply=apply)
    return _oracle_cache[key]


# ----------------------------------------------------------------------------- FSDP1 matrix
def _fsdp1_cases():
    for model in MATRIX_MODELS:
        for ws in WORLD_SIZES:
            for uop in (True, False):
                if model == "mixed" and not uop:
                    continue  # torch raises: see test_fsdp1_mixed_requires_grad_without_orig_params
                for bf16 in (False, True):
                    yield pytest.param(model, ws, uop, bf16,
                                       id=f"{model}-ws{ws}-{'orig' if uop else 'flat'}-{'bf16' if bf16 else 'fp32'}")


FSDP1_CASES = list(_fsdp1_cases())


def _fsdp1_pair(model, ws, uop, bf16):
    code = _wrap_code(model, "fsdp1", uop, bf16)
    res = lint(model, code, ws)
    units = [u for u in res.layout.units if u.unit.params]
    return res, units, code


@pytest.mark.parametrize("model,ws,uop,bf16", FSDP1_CASES)
def test_fsdp1_units_and_params(model, ws, uop, bf16):
    res, units, code = _fsdp1_pair(model, ws, uop, bf16)
    want = torch_fsdp1(model, code, ws, 0)
    # units that own a FlatParameter, in application order (the root last)
    assert [u.unit.module for u in units] == [o["module"] for o in want]
    for u, o in zip(units, want):
        assert u.unit.params == o["params"], u.unit.module
        assert [p.fqn for p in u.params] == o["params"]
        assert u.numel == o["numel"]
        assert u.dtypes == [o["dtype"]]
        assert (u.trainable_numel > 0) == o["requires_grad"]
        assert u.param_dtype == ("bfloat16" if bf16 else o["dtype"])
    # every parameter is in exactly one unit, so nothing is left over
    assert res.plan.leftover_params == []
    assert res.plan.root_wrapped


@pytest.mark.parametrize("model,ws,uop,bf16", FSDP1_CASES)
def test_fsdp1_flat_param_sizes(model, ws, uop, bf16):
    res, units, code = _fsdp1_pair(model, ws, uop, bf16)
    want = torch_fsdp1(model, code, ws, 0)
    for u, o in zip(units, want):
        assert (u.padded_numel, u.shard_numel) == (o["padded_numel"], o["shard_numel"]), u.unit.module
        # the unsharded FlatParameter element by element: params and the padding between them
        ours: List[list] = []
        end = 0
        for p in u.params:
            if p.padding_before:
                ours.append([None, p.padding_before])
            assert p.offset == end + p.padding_before
            ours.append([p.fqn, p.numel])
            end = p.offset + p.numel
        if uop and u.padded_numel > end:  # world-size padding is part of the FlatParameter
            ours.append([None, u.padded_numel - end])
        assert ours == o["layout"], u.unit.module
        if not uop:
            assert all(p.padding_before == 0 for p in u.params)
            assert u.shard_numel == (math.ceil(u.numel / ws) if ws > 1 else u.numel)


@pytest.mark.parametrize("model,ws,uop,bf16", FSDP1_CASES)
def test_fsdp1_rank_spans(model, ws, uop, bf16):
    res, units, code = _fsdp1_pair(model, ws, uop, bf16)
    for rank in sorted({0, ws - 1}):
        want = torch_fsdp1(model, code, ws, rank)
        for u, o in zip(units, want):
            spans = [[s.fqn, s.start, s.end] for s in u.rank_spans(rank)]
            assert spans == o["spans"], (u.unit.module, rank)
            assert u.shard_numel == o["shard_numel"]


def test_fsdp1_world_size_1_is_no_shard_and_still_aligned():
    code = _wrap_code("uneven", "fsdp1", True, False)
    res = lint("uneven", code, 1)
    want = torch_fsdp1("uneven", code, 1, 0)
    assert {o["sharding_strategy"] for o in want} == {"NO_SHARD"}
    units = [u for u in res.layout.units if u.unit.params]
    for u, o in zip(units, want):
        assert None in [fqn for fqn, _ in o["layout"]]  # torch aligned the params
        assert any(p.padding_before for p in u.params)
        assert u.padded_numel == u.shard_numel == o["padded_numel"] > u.numel
        assert u.all_gathers_per_step == 0 and u.reduce_scatters_per_step == 0


def test_fsdp1_without_orig_params_has_no_alignment():
    code = _wrap_code("uneven", "fsdp1", False, True)
    res = lint("uneven", code, 3)
    units = [u for u in res.layout.units if u.unit.params]
    want = torch_fsdp1("uneven", code, 3, 2)
    for u, o in zip(units, want):
        assert None not in [fqn for fqn, _ in o["layout"]]
        assert [p.padding_before for p in u.params] == [0] * len(u.params)
        assert u.shard_numel == math.ceil(u.numel / 3) == o["shard_numel"]
        # the last rank's shard is zero-padded at its end
        assert u.padded_numel - u.numel == o["shard_padding"]


def test_fsdp1_alignment_follows_mixed_precision_param_dtype():
    """16 bytes = 4 fp32 or 8 bf16 elements: the bf16 plan pads more between the params."""
    for bf16, step in ((False, 4), (True, 8)):
        code = _wrap_code("uneven", "fsdp1", True, bf16)
        res = lint("uneven", code, 2)
        want = torch_fsdp1("uneven", code, 2, 0)
        for u, o in zip([u for u in res.layout.units if u.unit.params], want):
            assert all(p.offset % step == 0 for p in u.params)
            assert u.padded_numel == o["padded_numel"]
    assert lint("uneven", _wrap_code("uneven", "fsdp1", True, True), 2).layout.units[0].padded_numel > \
        lint("uneven", _wrap_code("uneven", "fsdp1", True, False), 2).layout.units[0].padded_numel


def test_fsdp1_mixed_requires_grad_without_orig_params():
    """torch refuses a FlatParameter mixing frozen and trainable params; the layout shows the mix."""
    code = _wrap_code("mixed", "fsdp1", False, False)
    e = raises(lambda: torch_fsdp1("mixed", code, 2, 0))
    assert isinstance(e, ValueError) and "uniform `requires_grad`" in str(e)
    res = lint("mixed", code, 2)
    blocks = [u for u in res.layout.units if u.unit.module.startswith("layers.")]
    assert blocks and all(0 < u.trainable_numel < u.numel for u in blocks)


def test_fsdp1_tied_split_across_units():
    """embed and lm_head in two units: the later unit leaves the shared weight out."""
    wrap = """
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({{nn.Embedding, nn.Linear}}),
                     device_id=torch.device("cpu"){kw})
    """
    for uop in (True, False):
        code = _wrap_code("tied", "fsdp1", uop, False, wrap=wrap)
        res = lint("tied", code, 4)
        want = torch_fsdp1("tied", code, 4, 0)
        units = [u for u in res.layout.units if u.unit.params]
        assert [u.unit.module for u in units] == [o["module"] for o in want]
        for u, o in zip(units, want):
            # torch names a tied param after the unit's own module: compare through the aliases
            assert len(u.unit.params) == len(o["params"])
            assert all(t in res.tree.params[f].all_fqns for f, t in zip(u.unit.params, o["params"]))
            assert (u.numel, u.padded_numel, u.shard_numel) == (o["numel"], o["padded_numel"], o["shard_numel"])
        split = [u.module for u in res.plan.units_for_param("embed.weight")]
        if uop:
            assert split == ["embed"]  # lm_head's unit kept nothing: no FlatParameter
        else:
            assert split == ["embed", "lm_head"]  # two copies: the tie is silently broken


@pytest.mark.parametrize("api,uop", [("fsdp1", True), ("fsdp1", False), ("fsdp2", None)])
def test_shared_submodule_and_ignored_states(api, uop):
    """A sub-module registered twice is owned once, under its first name; ignored modules/params
    belong to no unit."""
    code = _wrap_code("shared", api, uop, False)
    from torch.distributed.fsdp import fully_shard

    if api == "fsdp2" and "ignored_params" not in inspect.signature(fully_shard).parameters:
        # torch 2.6 has no ignored_params: torch's TypeError, and fsdp-lint's replay fails on it as the run would
        e = raises(lambda: torch_fsdp2("shared", code, 3, 0))
        assert isinstance(e, TypeError) and "ignored_params" in str(e)
        from fsdp_lint.engine import LintError

        with pytest.raises(LintError) as info:
            lint("shared", code, 3)
        assert f"TypeError: {e}" in str(info.value)
        return
    res = lint("shared", code, 3)
    if api == "fsdp1":
        want = [(o["module"], o["params"], o["padded_numel"]) for o in torch_fsdp1("shared", code, 3, 0)]
        assert [(u.unit.module, u.unit.params, u.padded_numel) for u in res.layout.units] == want
        assert res.plan.ignored_params == ["head.weight", "head.bias"]
    else:
        want = [(g["modules"], [p["fqn"] for p in g["params"]], sum(math.prod(p["padded_local_shape"]) for p in
                                                                    g["params"])) for g in torch_fsdp2("shared", code, 3, 0)]
        assert [(u.unit.modules, u.unit.params, u.shard_numel) for u in res.layout.units] == want
        assert res.plan.ignored_params == ["gain"]
    assert res.plan.leftover_params == []


# ----------------------------------------------------------------------------- FSDP2 matrix
def _fsdp2_cases():
    for model in MATRIX_MODELS:
        for ws in WORLD_SIZES:
            for bf16 in (False, True):
                yield pytest.param(model, ws, bf16, id=f"{model}-ws{ws}-{'bf16' if bf16 else 'fp32'}")


@pytest.mark.parametrize("model,ws,bf16", list(_fsdp2_cases()))
def test_fsdp2_groups_and_local_shapes(model, ws, bf16):
    code = _wrap_code(model, "fsdp2", None, bf16)
    res = lint(model, code, ws)
    first = torch_fsdp2(model, code, ws, 0)
    last = torch_fsdp2(model, code, ws, ws - 1)
    units = res.layout.units
    assert [u.unit.modules for u in units] == [g["modules"] for g in first]
    assert res.plan.leftover_params == [] and res.plan.root_wrapped
    for u, g0, gl in zip(units, first, last):
        # FSDP2's parameter order: post-order over the managed modules
        assert u.unit.params == [p["fqn"] for p in g0["params"]], u.unit.module
        for p, t0, tl in zip(u.params, g0["params"], gl["params"]):
            assert p.fqn == t0["fqn"] == tl["fqn"]
            assert list(p.shape) == t0["shape"]
            assert (p.dtype, p.requires_grad) == (t0["dtype"], t0["requires_grad"]), p.fqn
            assert list(p.local_shape_first) == t0["local_shape"], p.fqn
            assert list(p.local_shape_last) == tl["local_shape"], p.fqn
            assert list(p.local_shape(ws - 1, ws)) == tl["local_shape"], p.fqn
            assert p.padded_numel == math.prod(t0["padded_local_shape"]) * ws, p.fqn
        padded_shard = sum(math.prod(t["padded_local_shape"]) for t in g0["params"])
        assert (u.shard_numel, u.padded_numel) == (padded_shard, padded_shard * ws), u.unit.module
        assert u.numel == sum(math.prod(t["shape"]) for t in g0["params"])
        if u.params:
            assert u.param_dtype == ("bfloat16" if bf16 else u.params[0].dtype)


def test_fsdp2_post_order_puts_children_before_own_params():
    """Odd registers ``scale`` before its children; FSDP2 lists it after them (FSDP1 first)."""
    code = _wrap_code("uneven", "fsdp2", None, False)
    res = lint("uneven", code, 4)
    block = res.plan.units[1]
    assert block.module == "blocks.0"
    assert block.params == ["blocks.0.proj.weight", "blocks.0.proj.bias", "blocks.0.scale", "blocks.0.tiny"]
    assert block.params == [p["fqn"] for p in torch_fsdp2("uneven", code, 4, 0)[1]["params"]]
    code1 = _wrap_code("uneven", "fsdp1", True, False)
    assert lint("uneven", code1, 4).plan.units[0].params[0] == "blocks.0.scale" == \
        torch_fsdp1("uneven", code1, 4, 0)[0]["params"][0]


def test_fsdp2_list_group_and_tied_split():
    """``fully_shard([a, b])`` is one group over both; a tied weight split across groups appears
    in both (torch rejects it at the first forward, FSD401 reports it)."""
    wrap = """
        fully_shard([model.layers[0], model.layers[1]]{kw})
        fully_shard(model.lm_head{kw})
        fully_shard(model{kw})
    """
    code = _wrap_code("tied", "fsdp2", None, False, wrap=wrap)
    res = lint("tied", code, 3)
    want = torch_fsdp2("tied", code, 3, 0)
    assert [u.modules for u in res.plan.units] == [g["modules"] for g in want]
    for u, g in zip(res.layout.units, want):
        # torch names the split tied param after the module that holds it: compare by alias
        for fqn, t in zip(u.unit.params, g["params"]):
            assert t["fqn"] in res.tree.params[fqn].all_fqns
        assert len(u.unit.params) == len(g["params"])
        assert [list(p.local_shape_first) for p in u.params] == [t["local_shape"] for t in g["params"]]
    assert res.plan.units_for_param("embed.weight") == [res.plan.units[1], res.plan.units[2]]


# ----------------------------------------------------------------------------- collectives
_COLLECTIVE_ARG = {
    "all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor", "all_gather_single": "output_tensor",
    "reduce_scatter_tensor": "input", "reduce_scatter_single": "input", "all_reduce": "tensor",
}


@contextlib.contextmanager
def _count_collectives():
    """Record (kind, bytes of the full unsharded buffer) for every collective torch issues."""
    log: List[Tuple[str, int]] = []
    saved = {}
    for name, arg in _COLLECTIVE_ARG.items():
        orig = getattr(dist, name, None)
        if orig is None:            # all_gather_single / reduce_scatter_single: absent on torch 2.11 and earlier
            continue
        saved[name] = orig
        sig = inspect.signature(orig)
        kind = "all_gather" if name.startswith("all_gather") else \
            "reduce_scatter" if name.startswith("reduce_scatter") else "all_reduce"

        def wrapper(*a, _orig=orig, _sig=sig, _arg=arg, _kind=kind, **k):
            t = _sig.bind(*a, **k).arguments[_arg]
            ts = t if isinstance(t, (list, tuple)) else [t]
            log.append((_kind, sum(x.numel() * x.element_size() for x in ts)))
            return _orig(*a, **k)

        setattr(dist, name, wrapper)
    try:
        yield log
    finally:
        for name, orig in saved.items():
            setattr(dist, name, orig)


def _torch_step_collectives(model: str, api: str, wrap_code: str, ws: int) -> collections.Counter:
    """One real forward + backward under the fake process group; collectives per kind and bytes
    per rank ((ws - 1) / ws of the unsharded buffer)."""
    ns = _namespace(model)
    with fake_pg(ws), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = eval(MODELS[model]["ctor"], ns)
        g = dict(ns, model=m)
        if api == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh

            g["fully_shard"] = functools.partial(ns["fully_shard"], mesh=init_device_mesh("cpu", (ws,)))
        exec(_compiled(wrap_code), g)
        m = g["model"]
        x = eval(MODELS[model]["input"], ns)
        with _count_collectives() as log, cpu_stream_events() as added:
            out = m(x)
            try:
                out.float().sum().backward()
            except RuntimeError as exc:
                if added and "modified by an inplace operation" in str(exc):
                    pytest.skip(f"torch {torch.__version__}'s FSDP2 cannot run a training step on CPU (no CPU stream "
                                f"events; with no-op ones its backward fails autograd's in-place check on a "
                                f"parameter it re-gathered): no oracle for one step's collectives on this torch")
                raise
    return collections.Counter((kind, nbytes * (ws - 1) // ws if kind != "all_reduce" else 0)
                               for kind, nbytes in log)


def _layout_collectives(layout) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for u in layout.units:
        if u.all_gathers_per_step:
            c[("all_gather", u.all_gather_bytes)] += u.all_gathers_per_step
        if u.reduce_scatters_per_step:
            c[("reduce_scatter", u.reduce_scatter_bytes)] += u.reduce_scatters_per_step
        if u.all_reduces_per_step:
            c[("all_reduce", 0)] += u.all_reduces_per_step
    return c


COLLECTIVE_CASES = [
    # FSDP1: the root never reshards after forward, other FULL_SHARD units are gathered twice
    pytest.param("article", "fsdp1", 4, True, True, "", id="fsdp1-article-bf16"),
    pytest.param("tied", "fsdp1", 3, True, False, "", id="fsdp1-full-shard"),
    pytest.param("tied", "fsdp1", 3, False, True, "", id="fsdp1-flat-bf16"),
    pytest.param("tied", "fsdp1", 2, True, False, "sharding_strategy=ShardingStrategy.SHARD_GRAD_OP",
                 id="fsdp1-shard-grad-op"),
    pytest.param("tied", "fsdp1", 2, True, False, "sharding_strategy=ShardingStrategy.NO_SHARD", id="fsdp1-no-shard"),
    pytest.param("tied", "fsdp1", 1, True, False, "", id="fsdp1-ws1"),
    # frozen params in a trainable unit: the whole FlatParameter gradient is reduce-scattered
    pytest.param("mixed", "fsdp1", 2, True, True, "", id="fsdp1-frozen-bf16"),
    # FSDP2: the root does not reshard unless reshard_after_forward is given explicitly
    pytest.param("article", "fsdp2", 4, None, True, "", id="fsdp2-article-bf16"),
    pytest.param("tied", "fsdp2", 3, None, False, "", id="fsdp2-default"),
    pytest.param("tied", "fsdp2", 3, None, True, "reshard_after_forward=True", id="fsdp2-explicit-true"),
    pytest.param("tied", "fsdp2", 4, None, False, "reshard_after_forward=False", id="fsdp2-explicit-false"),
    pytest.param("tied", "fsdp2", 1, None, False, "", id="fsdp2-ws1"),
    # a frozen bf16 sub-module in fp32 groups: mixed-dtype all-gathers, frozen params not reduced
    pytest.param("mixed", "fsdp2", 3, None, False, "", id="fsdp2-frozen-bf16-in-fp32"),
    pytest.param("mixed", "fsdp2", 2, None, True, "", id="fsdp2-frozen-bf16-mp"),
    # a frozen first half: not gathered in backward (FSDP2: the last frozen block prefetched once)
    pytest.param("halffrozen", "fsdp2", 4, None, False, "", id="fsdp2-half-frozen"),
    pytest.param("halffrozen", "fsdp2", 2, None, True, "", id="fsdp2-half-frozen-bf16"),
    pytest.param("halffrozen", "fsdp1", 4, True, False, "", id="fsdp1-half-frozen"),
    pytest.param("halffrozen", "fsdp1", 2, True, True, "", id="fsdp1-half-frozen-bf16"),
    # an FSDP2 group gathered for each of its modules' forwards
    pytest.param("grouped", "fsdp2", 4, None, False, "", id="fsdp2-group-modules-apart"),
]


def _dtype_refusals(res, ws) -> list:
    """fsdp-lint's FSD203 findings on the case: a unit or group whose dtypes torch refuses."""
    from fsdp_lint.engine import check_rules

    return [f for f in check_rules(res, Settings(world_size=ws)) if f.code == "FSD203"]


def _torch_step_or_refusal(res, model, api, code, ws):
    """torch's collectives of one step; or None where torch refuses the plan at the first forward
    (torch 2.6 and 2.7 assert one original dtype over every parameter of an FSDP2 group, frozen ones too;
    later torch over the trainable ones), and then fsdp-lint reports that refusal, with torch's dtypes."""
    import re

    try:
        want = _torch_step_collectives(model, api, code, ws)
    except AssertionError as exc:       # torch's own assertion, not the test's
        if "FSDP expects uniform original parameter dtype" not in str(exc):
            raise
        refusals = _dtype_refusals(res, ws)
        assert refusals, f"torch raises `{exc}` at the first forward; fsdp-lint reports nothing"
        theirs = set(re.findall(r"torch\.(\w+)", str(exc).split(" but got ", 1)[1]))
        for f in refusals:
            assert "FSDP expects uniform original parameter dtype" in f.detail
            assert set(f.details["dtypes"]) == theirs, (f.details["dtypes"], theirs)
        return None
    assert _dtype_refusals(res, ws) == []       # torch ran the step: fsdp-lint must not say it fails
    return want


@pytest.mark.parametrize("model,api,ws,uop,bf16,extra", COLLECTIVE_CASES)
def test_collectives_per_step_match_torch(model, api, ws, uop, bf16, extra):
    code = _wrap_code(model, api, uop, bf16, extra)
    res = lint(model, code, ws)
    want = _torch_step_or_refusal(res, model, api, code, ws)
    if want is not None:
        assert _layout_collectives(res.layout) == want


def test_fsdp2_reshard_after_forward_per_call():
    """Blocks with reshard_after_forward=False are gathered once; the root given True explicitly
    reshards on torch 2.9 and later (their ``FSDPState._lazy_init`` only clears the root's post-forward
    resharding when ``reshard_after_forward`` was left at its default), not on 2.6 (it always clears
    it): the plan follows the installed torch, whose step is the oracle."""
    wrap = """
        for layer in model.layers:
            fully_shard(layer, reshard_after_forward=False{kw})
        fully_shard(model, reshard_after_forward=True{kw})
    """
    code = _wrap_code("tied", "fsdp2", None, False, wrap=wrap)
    res = lint("tied", code, 2)
    want = _torch_step_collectives("tied", "fsdp2", code, 2)
    assert _layout_collectives(res.layout) == want
    assert [u.all_gathers_per_step for u in res.layout.units][:2] == [1, 1]
    root = res.layout.units[2]      # once or twice, as torch's step gathered it
    assert want[("all_gather", root.all_gather_bytes)] == root.all_gathers_per_step


def test_fsdp1_root_is_gathered_once_per_step():
    res = lint("tied", _wrap_code("tied", "fsdp1", True, False), 4)
    assert [u.all_gathers_per_step for u in res.layout.units] == [2, 2, 1]
    assert res.layout.units[-1].unit.is_root


# ----------------------------------------------------------------------------- the article's numbers
ARTICLE_BLOCK_NUMEL = 3_152_384


def test_article_block_all_gather_bytes_on_4_ranks_bf16():
    """(3/4) x 3,152,384 x 2 = 4,728,576 bytes per rank for one block all-gather in bf16."""
    for api, uop in (("fsdp1", True), ("fsdp1", False), ("fsdp2", None)):
        res = lint("article", _wrap_code("article", api, uop, True), 4)
        blocks = [u for u in res.layout.units if u.unit.module.startswith("layers.")]
        assert len(blocks) == 2
        for u in blocks:
            assert u.numel == u.padded_numel == ARTICLE_BLOCK_NUMEL
            assert u.all_gather_bytes == 3 * ARTICLE_BLOCK_NUMEL * torch.bfloat16.itemsize // 4 == 4_728_576


def test_article_rank0_fsdp1_shard():
    code = _wrap_code("article", "fsdp1", True, False)
    res = lint("article", code, 4)
    block = res.layout.units[0]
    assert block.shard_numel == 788_096
    spans = [(s.fqn, s.start, s.end) for s in block.rank_spans(0)]
    assert spans == [
        ("layers.0.norm1.weight", 0, 512),
        ("layers.0.norm1.bias", 0, 512),
        ("layers.0.self_attn.in_proj_weight", 0, 3 * 512 * 512),
        ("layers.0.self_attn.in_proj_bias", 0, 640),
    ]
    assert [list(s) for s in spans] == torch_fsdp1("article", code, 4, 0)[0]["spans"]


@pytest.mark.parametrize("api,uop", [("fsdp2", None), ("fsdp1", False)])
def test_units_without_a_root_wrap_run_as_roots(api, uop):
    """With no root wrap every top-level unit is a root at lazy init and is not resharded after
    forward: one all-gather per step, not two."""
    if api == "fsdp2":
        wrap = """
            for layer in model.layers:
                fully_shard(layer{kw})
        """
    else:
        wrap = """
            for i, layer in enumerate(model.layers):
                model.layers[i] = FSDP(layer, device_id=torch.device("cpu"){kw})
        """
    code = _wrap_code("tied", api, uop, False, wrap=wrap)
    res = lint("tied", code, 2)
    assert not res.plan.root_wrapped
    assert [u.all_gathers_per_step for u in res.layout.units] == [1] * len(res.layout.units)
    assert _layout_collectives(res.layout) == _torch_step_collectives("tied", api, code, 2)


# ----------------------------------------------------------------------------- options of this torch
_OPTION_MODEL = '''\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(2))
        self.gain = nn.Parameter(torch.ones(32))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * self.gain
'''

_OPTION_TRAIN = '''\
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

from net import Net


def main() -> None:
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    model = Net()
{wrap}
    torch.optim.AdamW(model.parameters())


if __name__ == "__main__":
    main()
'''

_OPTION_WRAPS = {
    # an option torch 2.6 does not have (2.9+ do)
    "ignored_params": "    fully_shard(model.layers[0], mesh=mesh)\n"
                      "    fully_shard(model, mesh=mesh, ignored_params={model.gain})",
    "fsdp2-unknown": "    fully_shard(model, mesh=mesh, prefetch_depth=2)",
    "fsdp1-unknown": "    model = FSDP(model, device_id=torch.device('cpu'), prefetch_depth=2)",
}


@pytest.mark.parametrize("case", list(_OPTION_WRAPS))
def test_wrap_options_are_bound_as_the_installed_torch_binds_them(cli, tmp_path, case):
    """A wrap option the installed torch does not have fails as the real call does, with torch's
    TypeError and the line (exit 2); one it has is recorded."""
    wrap = _OPTION_WRAPS[case]
    (tmp_path / "net.py").write_text(_OPTION_MODEL)
    (tmp_path / "train.py").write_text(_OPTION_TRAIN.format(wrap=wrap))
    sys.path.insert(0, str(tmp_path))
    try:
        from net import Net

        def real():
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: F401
            from torch.distributed.fsdp import fully_shard  # noqa: F401

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mesh = init_device_mesh("cpu", (4,))  # noqa: F841
                model = Net()  # noqa: F841
                exec(compile(textwrap.dedent(wrap), "<wrap>", "exec"))

        with fake_pg(4, 0):
            error = raises(real)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("net", None)
    res = cli("train.py", "--world-size", "4", "--no-cache", "--format", "json", cwd=str(tmp_path))
    if error is None:
        assert res.code in (0, 1), res.err
    else:
        assert isinstance(error, TypeError)
        assert res.code == 2
        assert f"train.py:{16 + wrap.count(chr(10))}: " in res.err
        assert f"TypeError: {error}" in res.err
