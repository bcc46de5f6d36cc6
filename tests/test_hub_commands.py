"""The download commands fsdp-lint's hints give run as written with the installed huggingface_hub: the oracle is
the installed ``hf`` command's own parser (its download functions replaced by recorders, nothing is fetched)."""
from __future__ import annotations

import fnmatch
import shlex

import pytest

from fsdp_lint.replay import hub_commands
from fsdp_lint.replay.hub_commands import SETUP_FILES, download_command


@pytest.fixture
def hf_cli(monkeypatch):
    """Runs a command line with the installed ``hf`` CLI; returns what it would download."""
    click_testing = pytest.importorskip("click.testing")
    from huggingface_hub.cli import download as cli_download
    from huggingface_hub.cli.hf import app

    asked = []
    monkeypatch.setattr(cli_download, "snapshot_download", lambda *a, **k: asked.append(("snapshot", k)) or "/x")
    monkeypatch.setattr(cli_download, "hf_hub_download", lambda *a, **k: asked.append(("file", k)) or "/x/f")

    def run(command: str):
        words = shlex.split(command)
        assert words[:2] == ["hf", "download"], command       # the installed huggingface_hub has no huggingface-cli
        result = click_testing.CliRunner().invoke(app, words[1:])
        assert result.exit_code == 0, result.output
        return asked[-1]
    return run


def test_a_setup_files_command_fetches_configs_and_tokenizers_not_weights(hf_cli):
    kind, asked = hf_cli(download_command("org/model", include=SETUP_FILES, revision="abc123"))
    assert kind == "snapshot" and asked["repo_id"] == "org/model" and asked["revision"] == "abc123"
    patterns = asked["allow_patterns"]
    wanted = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "vocab.txt", "merges.txt", "qwen.tiktoken", "modeling_custom.py"]
    weights = ["model.safetensors", "model-00001-of-00004.safetensors", "pytorch_model.bin", "consolidated.00.pth"]
    assert all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in wanted)
    assert not any(fnmatch.fnmatch(f, p) for f in weights for p in patterns)


def test_named_files_and_data_sets(hf_cli):
    kind, asked = hf_cli(download_command("org/model", ["sub/config.json"]))
    assert (kind, asked["filename"], asked["repo_type"]) == ("file", "sub/config.json", "model")
    kind, asked = hf_cli(download_command("org/model", ["configuration_x.py", "modeling_x.py"]))
    assert asked["allow_patterns"] == ["configuration_x.py", "modeling_x.py"]
    kind, asked = hf_cli(download_command("org/data", repo_type="dataset"))
    assert (kind, asked["repo_id"], asked["repo_type"]) == ("snapshot", "org/data", "dataset")


def test_an_older_huggingface_hub_gets_its_own_command(monkeypatch):
    # before 0.34 there is no `hf`; before 1.0 `--include` (argparse, nargs="*") takes its patterns after one flag
    monkeypatch.setattr(hub_commands, "_installed_version", lambda: (0, 24))
    assert download_command("org/m", include=("*.json", "*.model")) == "huggingface-cli download org/m --include '*.json' '*.model'"
    monkeypatch.setattr(hub_commands, "_installed_version", lambda: (0, 36))
    assert download_command("org/m", ["config.json"]).startswith("hf download org/m config.json")


def test_the_missing_config_hint_is_one_command_for_config_and_tokenizer(cli, tmp_path, monkeypatch, hf_cli):
    # a model named by its hub id with an empty cache: the one command the line gives gets both what the model
    # needs (config.json) and what the next statement would (the tokenizer), without weights
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "train.py").write_text(
        "from __future__ import annotations\n\nimport torch\nfrom transformers import AutoModelForCausalLM\n"
        "from torch.distributed.fsdp import fully_shard\n\ntorch.distributed.init_process_group('nccl')\n"
        "model = AutoModelForCausalLM.from_pretrained('acme/tiny-lm')\nfully_shard(model)\n")
    res = cli("train.py", "-n", "2", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    command = line.split("`hf download", 1)[1].split("`", 1)[0]
    kind, asked = hf_cli("hf download" + command)
    assert asked["repo_id"] == "acme/tiny-lm"
    assert all(any(fnmatch.fnmatch(f, p) for p in asked["allow_patterns"]) for f in ("config.json", "tokenizer.json"))
