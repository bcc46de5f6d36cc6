"""``--fetch-configs``: a hub model's configs and tokenizer (never its weights) fetched by huggingface_hub itself
from a hub on loopback (`fake_hub`), then the file linted again; the plan is the one transformers builds from the
same config."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fake_hub import FakeHub  # noqa: E402

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
          "tie_word_embeddings": False}

TRAIN = '''\
from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

torch.distributed.init_process_group("nccl")
model = AutoModelForCausalLM.from_pretrained("acme/tiny-lm")
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
'''


@pytest.fixture
def hub(tmp_path, monkeypatch):
    hub = FakeHub({"acme/tiny-lm": {"config.json": json.dumps(CONFIG).encode(), "generation_config.json": b"{}",
                                    "model.safetensors": b"\0" * 4096, "README.md": b"# tiny"}})
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    (tmp_path / "train.py").write_text(TRAIN)
    yield hub
    hub.close()


def _parameters_transformers_builds() -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**CONFIG))
    return sum(p.numel() for p in model.parameters())


def test_the_config_is_fetched_and_the_file_linted_again(cli, tmp_path, hub):
    res = cli("train.py", "-n", "2", "--no-cache", "--fetch-configs", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["world_size"] == 2 and len(f["plan"]["units"]) == CONFIG["num_hidden_layers"] + 1
    assert f["model"]["numel"] == sum(u["numel"] for u in f["plan"]["units"]) == _parameters_transformers_builds()
    # the configs only, never the weights
    assert "acme/tiny-lm/config.json" in hub.downloaded
    assert not any(d.endswith((".safetensors", ".md")) for d in hub.downloaded)
    assert any("--fetch-configs fetched the configs and tokenizer of acme/tiny-lm" in n for n in f["notes"])
    # the next lint finds it in the cache: nothing fetched again
    before = list(hub.downloaded)
    assert cli("train.py", "-n", "2", "--no-cache", "--fetch-configs", cwd=str(tmp_path)).code in (0, 1)
    assert hub.downloaded == before


def test_without_the_option_nothing_is_fetched(cli, tmp_path, hub):
    res = cli("train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2 and "no config.json for the hub model 'acme/tiny-lm'" in res.err
    assert hub.downloaded == []


def test_offline_and_unknown_repositories_are_one_line(cli, tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = cli("train.py", "-n", "2", "--no-cache", "--fetch-configs", cwd=str(tmp_path))
    assert res.code == 2 and "--fetch-configs did not fetch it: HF_HUB_OFFLINE is set" in res.err
    assert hub.downloaded == [] and len(res.err.strip().splitlines()) == 1
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "train.py").write_text(TRAIN.replace("acme/tiny-lm", "acme/not-there"))
    res = cli("train.py", "-n", "2", "--no-cache", "--fetch-configs", cwd=str(tmp_path))
    assert res.code == 2 and "--fetch-configs did not fetch it: RepositoryNotFoundError" in res.err
    assert len(res.err.strip().splitlines()) == 1
    assert "rerun with --fetch-configs" not in res.err       # (it was: the hint is gone where it did not help)


def test_the_key_in_pyproject(cli, tmp_path, hub):
    (tmp_path / "pyproject.toml").write_text("[tool.fsdp-lint]\nfetch-configs = true\n")
    res = cli("train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert "acme/tiny-lm/config.json" in hub.downloaded


def test_a_weights_file_is_never_fetched():
    from fsdp_lint.hub_fetch import FetchRefused, fetch, requested

    asked = requested("x of y is not here: `hf download org/m consolidated.00.pth` puts it in the cache")
    assert asked["files"] == ["consolidated.00.pth"]
    with pytest.raises(FetchRefused, match="never fetches weights"):
        fetch(asked)
    asked = requested("`hf download org/data --repo-type dataset` puts it")
    with pytest.raises(FetchRefused, match="dataset repository"):
        fetch(asked)
