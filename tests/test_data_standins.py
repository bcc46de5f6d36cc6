"""Data sets that cannot be loaded here stand in as real, tiny ``datasets`` objects, so that the library's
own functions work on them as on the node (`fsdp_lint.replay.data_standins`); and values read from tensors
that have no data here answer zero, with a note naming the line (`fsdp_lint.replay.data_values`).

Oracles: the ``datasets`` library's own functions and types; torch under ``FakeTensorMode`` for --simulate."""
from __future__ import annotations

import contextlib
import os

import pytest

from conftest import REPO
from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file

datasets = pytest.importorskip("datasets")

CHAT = os.path.join(REPO, "fixtures", "repos", "chat_sft")
CHAT_TRAIN = os.path.join(CHAT, "src", "chat_sft", "train.py")
TINY_LLAMA = os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama-local")


@contextlib.contextmanager
def columns_on_demand():
    """The patches a replay installs on ``datasets.Dataset``, undone afterwards."""
    from fsdp_lint.replay import data_standins

    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, obj.__dict__[name]))
        setattr(obj, name, value)

    data_standins.install_columns_on_demand(patch, datasets)
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)


def standin(*args, **kwargs):
    from fsdp_lint.replay.data_standins import standin_for

    return standin_for(datasets.load_dataset, args, kwargs)


def test_a_split_is_a_dataset_and_no_split_a_dataset_dict_with_the_splits_asked_for():
    ds = standin("org/corpus", split="train")
    assert isinstance(ds, datasets.Dataset) and len(ds) > 0 and ds.column_names == ["text"]
    splits = standin("json", data_files={"train": "a.jsonl", "validation": "b.jsonl"})
    assert isinstance(splits, datasets.DatasetDict) and sorted(splits) == ["train", "validation"]
    splits = standin("org/corpus")
    assert "test" in splits and isinstance(splits["test"], datasets.Dataset)     # `if "test" in raw:`
    assert isinstance(standin("org/corpus", split="train", streaming=True), datasets.IterableDataset)
    assert isinstance(standin("org/corpus", streaming=True), datasets.IterableDatasetDict)
    features = datasets.Features({"prompt": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    ds = standin("org/corpus", split="train", features=features)
    assert ds.features == features


def test_a_mixture_builds_with_the_librarys_own_functions():
    with columns_on_demand():
        parts = []
        for name in ("org/chat", "org/dialogues"):
            ds = standin(name, split="train").select_columns(["messages"]).shuffle(seed=0)
            parts.append(ds.select(range(int(0.5 * len(ds)))))
        mixed = datasets.concatenate_datasets(parts)
        split = mixed.train_test_split(test_size=0.1, seed=0)
        assert set(split) == {"train", "test"} and len(split["train"]) + len(split["test"]) == len(mixed)
        encoded = datasets.DatasetDict(split).map(lambda ex: {"input_ids": [1, 2, 3], "n": len(ex["prompt"])},
                                                 remove_columns=["messages"])
        kept = encoded.filter(lambda ex: len(ex["input_ids"]) > 0)
        assert kept["train"].column_names == ["prompt", "input_ids", "n"] and len(kept["train"]) > 0
        # past its rows, select takes them modulo its length (`select(range(args.max_samples))`)
        assert len(standin("org/chat", split="train").select(range(10_000))) == 10_000
        renamed = standin("org/chat", split="train").rename_column("question", "prompt")
        assert "prompt" in renamed.column_names
    # outside a replay, datasets are the library's own again
    with pytest.raises(KeyError):
        datasets.Dataset.from_dict({"text": ["a"]}).map(lambda ex: {"n": len(ex["prompt"])})


def test_the_recipes_mixture_runs_where_only_the_downloads_fail(monkeypatch):
    # before: the offline stand-in was no Dataset, `concatenate_datasets` raised and the mixture was skipped
    monkeypatch.chdir(CHAT)
    argv = ["--model_name_or_path", TINY_LLAMA, "--output_dir", "out", "--fsdp", "full_shard auto_wrap",
            "--fsdp_config", os.path.join(CHAT, "configs", "fsdp.json"), "--report_to", "none"]
    res = lint_file(CHAT_TRAIN, Settings(world_size=4), argv=argv)
    assert res.plan.framework == "transformers"
    skipped = {(os.path.basename(s.path), s.error.split(":")[0]) for s in res.skipped_statements}
    assert skipped == {("mixture.py", "ConnectionError")}, res.skipped_statements


def test_trunc_normal_initialised_models_simulate(cli, tmp_path):
    # ViT/DeiT/Swin-style init: nn.init.trunc_normal_ redraws until `mask.any()` is False, which a fake
    # tensor cannot answer (DataDependentOutputException before); torch's memory tracker measures the run
    from test_simulate import _simulate

    (tmp_path / "vit.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x).relu()


class TinyViT(nn.Module):
    def __init__(self, dim=32, depth=2):
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, 4, dim))
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 10)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)

    def forward(self, x):
        x = x + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean()


model = TinyViT()
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
''')
    f, sim = _simulate(cli, str(tmp_path / "vit.py"), "--world-size", "2", "--input-shape", "2,4,32")
    assert sim["peak_bytes"] > 0 and sim["peak_at"]["step"] in (1, 2)


def test_values_read_from_meta_tensors_answer_zero_with_a_note_naming_the_line(tmp_path, cli):
    # before: "Tensor.item() cannot be called on meta tensors", exit 2
    (tmp_path / "model.py").write_text('''
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.scale = float(self.fc.weight.abs().max().item())
''')
    (tmp_path / "train.py").write_text('''
import torch
from torch.distributed.fsdp import fully_shard

from model import Net

model = Net()
init_norms = [p.norm().item() for p in model.parameters()]
if (model.fc.weight > 10).any():
    raise SystemExit("the checkpoint diverged")
fully_shard(model.fc)
fully_shard(model, reshard_after_forward=bool(model.out.bias.sum() == 0) and init_norms[0] == 0.0)
''')
    res = cli("train.py", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    import json

    f = json.loads(res.out)["files"][0]
    assert [u["modules"] for u in f["plan"]["units"]] == [["fc"], [""]]
    # bool() answers False, whatever the tensor was computed with (`sum() == 0` too), as the README says
    assert f["plan"]["units"][1]["reshard_after_forward"] is False
    lines = {":".join(n.split(":")[:2]) for n in f["notes"] if "no data here" in n}
    assert {"model.py:10", "train.py:8", "train.py:12"} <= lines, f["notes"]


def test_a_chat_column_asked_for_holds_messages_as_trl_reads_real_chat_data(tmp_path):
    """``select_columns(["messages"])`` on a stood-in hub chat corpus: the rows are a user/assistant
    exchange, which TRL's SFTTrainer prepares as it prepares a real chat data set (same columns out).
    Before, the column held a string: TRL took it for plain text and its preparation dropped every column."""
    trl = pytest.importorskip("trl")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl.data_utils import is_conversational

    tok = AutoTokenizer.from_pretrained(TINY_LLAMA)
    tok.pad_token = tok.eos_token
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY_LLAMA))
    real = datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "What is FSDP?"},
                                                     {"role": "assistant", "content": "Sharded data parallel."}]] * 4})

    def prepared(ds):
        config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False)
        return trl.SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tok).train_dataset

    with columns_on_demand():
        stood_in = standin("org/ultrachat", split="train_sft").select_columns(["messages"])
        for name in ("chosen", "rejected"):
            assert is_conversational({"prompt": [{"role": "user", "content": "q"}],
                                      name: standin("org/prefs", split="train")[name][0]})
        assert is_conversational(stood_in[0]) and is_conversational(real[0])
        ours = prepared(stood_in)
    assert ours.column_names == prepared(real).column_names
    assert "input_ids" in ours.column_names and len(ours) > 0


PACKED = os.path.join(REPO, "fixtures", "repos", "packed_stories", "examples", "native")


def test_a_map_functions_fingerprint_never_pickles_the_replay(cli):
    """``datasets`` fingerprints every ``Dataset.map`` function by pickling it (dill) with the globals it
    reads, the replay's helpers among them: they pickle as their names, so the meta model behind the
    replay is never turned into float32 arrays by datasets' tensor pickler (accelerate's nd_parallel
    example: 32 GB for an 8B model, and the child was killed for memory)."""
    res = cli("train.py", "--world-size", "8", "--", "--width", "512", cwd=PACKED)
    assert res.code == 0, res.err
    assert ".numpy()" not in res.out, res.out
    assert "fsdp2 (built by accelerate)" in res.out and "5 units" in res.out


def test_the_packed_stories_plan_is_what_accelerate_builds(monkeypatch):
    from test_frameworks import assert_framework_plan_matches

    monkeypatch.chdir(PACKED)
    monkeypatch.syspath_prepend(PACKED)
    res = assert_framework_plan_matches(os.path.join(PACKED, "train.py"), Settings(world_size=8), ["--width", "512"])
    assert [u.modules for u in res.plan.units] == [[f"layers.{i}"] for i in range(4)] + [[""]]
