"""Round 7 of the real-launch survey (benchmarks/realworld.md, "Round 7"): setup code that a simulated node
answered differently from a real one, on repositories new to the project.

Oracles: real torch (FSDP1 under the fake process group, via the replay with the real APIs) and real
transformers (the tokenizer's length, the resized embeddings)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

LATENT = os.path.join(REPO, "fixtures", "repos", "latent_tokens")
CONFIGS = os.path.join(REPO, "fixtures", "frameworks", "configs")


@pytest.fixture
def in_latent(monkeypatch):
    monkeypatch.chdir(LATENT)
    monkeypatch.syspath_prepend(LATENT)
    yield
    for name in [n for n in sys.modules if n == "latent" or n.startswith("latent.")]:
        sys.modules.pop(name, None)


def _gpt2_with_tokenizer(folder) -> str:
    """A local GPT-2 folder: the tiny config and a byte-level tokenizer of the config's vocabulary size."""
    os.makedirs(folder)
    shutil.copy(os.path.join(CONFIGS, "tiny-gpt2", "config.json"), folder)
    size = json.load(open(os.path.join(CONFIGS, "tiny-gpt2", "config.json")))["vocab_size"]
    vocab = {f"t{i}": i for i in range(size - 1)}
    vocab["<|endoftext|>"] = size - 1
    with open(os.path.join(folder, "vocab.json"), "w") as fh:
        json.dump(vocab, fh)
    with open(os.path.join(folder, "merges.txt"), "w") as fh:
        fh.write("#version: 0.2\n")
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, fh)
    return str(folder)


def test_a_tokenizer_that_is_not_here_and_decides_the_wrapped_model_is_refused(cli):
    # the latent markers' ids come from the tokenizer and go into the wrapper the wrap is given: with the
    # tokenizer skipped, the replay planned the bare LM (the wrapper's statement failed on the unbound id)
    # and a vocabulary a node never trains
    res = cli("run.py", "--hf-config", os.path.join(CONFIGS, "tiny-llama"), "--world-size", "4", "--",
              "args/latent.yaml", cwd=LATENT)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert line.startswith("fsdp-lint: error: run.py:31: "), line
    assert "no tokenizer for 'org/latent-llama' here, and fsdp-lint never downloads" in line
    assert line.endswith("what it computes decides the wrap's arguments, so it is not skipped"), line
    assert "Traceback" not in res.err


def test_an_empty_tokenizer_built_from_a_config_alone_is_no_tokenizer(cli):
    # transformers 5 builds GPT-2's tokenizer class with no vocabulary when no tokenizer file is found
    # (`len()` 1): a helper's `resize_token_embeddings(len(tokenizer))` then shrank the embeddings to four
    # rows. The helper works on the model, so it is not skipped after the tokenizer is: the tokenizer is named
    res = cli("sft.py", "--hf-config", os.path.join(CONFIGS, "tiny-gpt2"), "--world-size", "4", "--",
              "--model", "org/latent-gpt2", cwd=LATENT)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "sft.py:28: setup code failed on the meta device: TokenizerMissing: no tokenizer for 'org/latent-gpt2'" \
        in line, line
    assert "(no vocabulary file)" in line
    assert "what it would have set up was used later: sft.py:30: " in line, line


def test_with_the_tokenizer_here_the_resized_vocabulary_is_planned_as_torch_builds(in_latent, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from latent.vocab import LATENT_TOKENS

    folder = _gpt2_with_tokenizer(tmp_path / "gpt2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(LATENT_TOKENS)
    real = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    real.resize_token_embeddings(len(tokenizer))

    res, _ = assert_plan_matches_torch(os.path.join(LATENT, "sft.py"), 4, argv=["--model", folder])
    shapes = {name: tuple(p.shape) for name, p in res.tree.params.items()}
    assert shapes == {name: tuple(p.shape) for name, p in real.named_parameters()}
    assert shapes["transformer.wte.weight"][0] == len(tokenizer)
    assert [u.modules for u in res.plan.units] == [["transformer.h.0"], ["transformer.h.1"], [""]]


def test_with_the_tokenizer_here_the_latent_wrapper_is_the_model_torch_wraps(in_latent, tmp_path):
    config = tmp_path / "latent.yaml"
    config.write_text(f"model_id: {os.path.join(CONFIGS, 'tiny-llama-local')}\nlatent: true\nbf16: true\n")
    res, _ = assert_plan_matches_torch(os.path.join(LATENT, "run.py"), 4, argv=[str(config)])
    assert res.tree.root_class == "LatentLM"
    assert res.plan.units[-1].modules == [""] and len(res.plan.units) > 1
    assert not res.skipped_statements, res.skipped_statements

