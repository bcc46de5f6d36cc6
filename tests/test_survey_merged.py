"""The real-launch survey on the merged main (benchmarks/realworld.md, "Round 3, merged main"): the classes
behind axolotl's ``no model found`` (#29), each in the simulated node or the replay, not in axolotl's text.

Fixture (fixtures/repos/chat_cli, in the idiom of YAML-driven chat fine-tuning CLIs): ``do_train`` loads the
data, then imports its trainer under another name inside the function (``from chattune.train import train
as train_fn``); the data loader probes whether a path names a hub data set with
``snapshot_download(repo_type="dataset", ignore_patterns=["*"])``, tokenizes ShareGPT-style conversations
(``from``/``value``, the field named by the config) in a batched, multi-process ``map`` inside a ``Dataset``
subclass, and caches the result with ``save_to_disk``; the trainer takes its device as ``torch.device(local_rank)``.
Oracles: real FSDP1 under the fake process group for the plan; the ``datasets`` library and the fixture's
own tokenizer for the rows."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

datasets = pytest.importorskip("datasets")
pytest.importorskip("yaml")

CHAT = os.path.join(REPO, "fixtures", "repos", "chat_cli")
TRAIN = os.path.join(CHAT, "src", "chattune", "cli", "train.py")
TINY_LLAMA = os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama-local")


@pytest.fixture
def chat_config(monkeypatch, tmp_path):
    """The example config, with its prepared-data cache under `tmp_path` (the replay must leave it empty)."""
    import yaml

    monkeypatch.chdir(CHAT)
    monkeypatch.syspath_prepend(os.path.join(CHAT, "src"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))       # acme/sharegpt-chats is in no cache
    with open(os.path.join(CHAT, "examples", "llama-fsdp.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["base_model"] = TINY_LLAMA
    cfg["dataset_prepared_path"] = str(tmp_path / "prepared")
    path = tmp_path / "llama-fsdp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    yield str(path), tmp_path / "prepared"
    for name in [n for n in sys.modules if n == "chattune" or n.startswith("chattune.")]:
        sys.modules.pop(name, None)


def test_a_cli_that_imports_its_trainer_under_another_name_plans_as_torch_wraps(chat_config):
    # before: `train_fn(...)` (a call of `chattune.train.train` under a new name) did not count as a call of
    # the function that wraps, so the setup ended after `load_datasets` and no model was found; then the
    # offline hub probe, the unasked conversation column (read in a worker process) and `torch.device(0)`
    # on a CPU build each failed and were skipped
    config, prepared = chat_config
    res, real = assert_plan_matches_torch(TRAIN, 4, argv=[config])
    assert [u.modules for u in res.plan.units] == [[f"model.layers.{i}"] for i in range(4)] + [[""]]
    assert {str(r["param_dtype"]) for r in real} == {"bfloat16"}      # the config's bf16, as torch built it
    # only the data set's own download is left out (offline), as on a node without the hub
    assert [(os.path.basename(s.path), s.exc_type) for s in res.skipped_statements] == \
        [("data.py", "ConnectionError")], [str(s) for s in res.skipped_statements]
    assert any("acme/sharegpt-chats" in n and "snapshot_download" in n for n in res.notes), res.notes
    # the placeholder rows are never left where the real job would load them as its prepared data
    assert any("save_to_disk" in n and "nothing written" in n for n in res.notes), res.notes
    assert not any(prepared.rglob("*.arrow")) and not any(prepared.rglob("*.json"))


def test_a_call_through_an_import_alias_counts_as_a_call_of_the_imported_function():
    from fsdp_lint.entry.source import parse_source, relevant_lines_with

    text = ("def do_train(cfg):\n"
            "    meta = load_datasets(cfg)\n"
            "    from pkg.train import train as train_fn\n"
            "    train_fn(cfg, meta)\n"
            "    helper.train_fn(cfg)\n")
    facts = parse_source("cli.py", text)
    assert relevant_lines_with(facts, {"train"}) >= {4}
    assert 5 not in relevant_lines_with(facts, {"train"})     # an attribute of that name is another function
    assert 4 not in relevant_lines_with(facts, {"load_datasets"})


def test_a_batched_map_that_reads_a_column_named_by_the_config_gets_it(chat_config):
    """The key a batched tokenizer reads (``batch.get(self.field_messages)``) is learnt from its failure on
    the stand-in's batch; the next stand-in holds a conversation there, in the keys the config maps
    (ShareGPT's ``from``/``value``), which the fixture's tokenizer turns into rows as it does real data."""
    from transformers import AutoTokenizer

    from fsdp_lint.replay import asked_keys
    from fsdp_lint.replay.data_standins import standin_for

    from chattune.data import ChatTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_LLAMA)
    ds_cfg = {"field_messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"}}
    strategy = ChatTokenizer(tok, ds_cfg, 64)
    asked_keys.forget()
    try:
        stood_in = standin_for(datasets.load_dataset, ("acme/sharegpt-chats",), {"split": "train"})
        with pytest.raises(ValueError) as first:
            strategy(stood_in[:4])
        assert asked_keys.learn([first.value])
        stood_in = standin_for(datasets.load_dataset, ("acme/sharegpt-chats",), {"split": "train"})
        real = datasets.Dataset.from_dict({"conversations": [[{"from": "human", "value": "What is FSDP?"},
                                                              {"from": "gpt", "value": "Sharded data parallel."}]] * 4})
        ours = stood_in.map(strategy, batched=True, remove_columns=stood_in.column_names)
        theirs = real.map(strategy, batched=True, remove_columns=real.column_names)
        assert ours.column_names == theirs.column_names
        assert all(len(ids) > 0 for ids in ours["input_ids"])
    finally:
        asked_keys.forget()
