"""``--suggest``'s activation checkpointing in the words of each framework. Lightning's
``FSDPStrategy(activation_checkpointing_policy={Block})`` (2.6: a set becomes a ``ModuleWrapPolicy``
handed to torch's ``apply_activation_checkpointing``), accelerate's ``fsdp_activation_checkpointing``
/ ``FullyShardedDataParallelPlugin(activation_checkpointing=True)`` (1.15: a bool, every
``transformer_cls_names_to_wrap`` class) and the HF Trainer's ``activation_checkpointing=True`` (5.24:
``activation_checkpointing_enable()``, every decoder layer) checkpoint every block of a class.
Lightning's and accelerate's have no setting for checkpointing some blocks (Lightning's also takes a
custom auto-wrap policy callable, code of the user's own that fsdp-lint does not write): they are not offered
the selective (every second block) candidate. transformers 5.24's Trainer has one (``every_n_layers``):
it is offered it in the Trainer's words. Each change is a setting the installed framework takes and
that checkpoints the candidate's blocks, applied by the framework's own code."""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from conftest import REPO
from test_suggest_applied import _every_candidate

F = os.path.join(REPO, "fixtures", "frameworks")
CFG = os.path.join(F, "configs")


def _ac(cands):
    """The full candidate's change; none selective (the framework cannot write it)."""
    assert not [c for c in cands if "ac-selective" in c["kinds"]], [c["change"] for c in cands if "ac-selective" in
                                                                    c["kinds"]]
    (full,) = [c for c in cands if c["kinds"] == ["ac-full"]]
    return full["change"]


def test_lightning_fsdp_strategy(tmp_path):
    pytest.importorskip("lightning")
    from lightning.fabric.strategies import FSDPStrategy
    from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    here = os.path.join(F, "lightning_gpt")
    src = open(os.path.join(here, "fabric_train.py")).read()
    assert "        activation_checkpointing_policy={Block},\n" in src
    (tmp_path / "fabric_train.py").write_text(src.replace("        activation_checkpointing_policy={Block},\n", ""))
    (tmp_path / "model.py").write_text(open(os.path.join(here, "model.py")).read())
    res, settings, cands = _every_candidate(("lightning-no-ac", str(tmp_path)), str(tmp_path / "fabric_train.py"), [],
                                            world_size=4, input_shape="8,128", input_dtype="long")
    assert res.plan.framework == "lightning" and res.plan.api == "fsdp1"
    change = _ac(cands)
    (call,) = re.findall(r"`(FSDPStrategy\(.*?\))`", change)
    sys.path.insert(0, str(tmp_path))
    try:
        from model import GPT, Block, GPTConfig
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    strategy = eval(call, {"FSDPStrategy": FSDPStrategy, "Block": Block})     # noqa: S307 - fsdp-lint's text
    model = GPT(GPTConfig(n_layer=4))
    # what Fabric's FSDPStrategy.setup_module does after wrapping, with the strategy's own kwargs
    _setup_activation_checkpointing(model, strategy._activation_checkpointing_kwargs)
    wrapped = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
    assert len(wrapped) == 4 and all(isinstance(m._checkpoint_wrapped_module, Block) for m in wrapped)


def test_accelerate_config_file(tmp_path):
    """accelerate from its config file, the script without its own ``gradient_checkpointing_enable()``."""
    import shutil

    pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser

    shutil.copytree(os.path.join(F, "accelerate_sft"), tmp_path / "accelerate_sft")
    script = tmp_path / "accelerate_sft" / "train.py"
    src = script.read_text()
    assert "    model.gradient_checkpointing_enable()\n" in src
    script.write_text(src.replace("    model.gradient_checkpointing_enable()\n", ""))
    res, settings, cands = _every_candidate(
        ("accelerate-yaml", str(tmp_path)), str(script), [], world_size=8, input_shape="2,64",
        accelerate_config=os.path.join(F, "accelerate_sft", "configs", "fsdp1.yaml"),
        hf_config=os.path.join(CFG, "tiny-llama"))
    assert res.plan.framework == "accelerate"
    change = _ac(cands)
    (keys,) = re.findall(r"`fsdp_config: \{(.*?)\}`", change)
    assert keys == "fsdp_activation_checkpointing: true"
    key, value = keys.split(": ")
    # accelerate launch reads fsdp_config's keys as its own options, then the plugin reads them from the env
    args = launch_command_parser().parse_args([f"--{key}", value, "train.py"])
    assert getattr(args, key) == "true"
    os.environ["FSDP_ACTIVATION_CHECKPOINTING"] = value
    try:
        plugin = accelerate.FullyShardedDataParallelPlugin(fsdp_version=1)
    finally:
        del os.environ["FSDP_ACTIVATION_CHECKPOINTING"]
    assert plugin.activation_checkpointing is True


def test_accelerate_plugin_in_code():
    pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")

    res, settings, cands = _every_candidate("accelerate-plugin-ac", os.path.join(F, "accelerate_plugin", "train_gpt2.py"),
                                            [], world_size=4, input_shape="8,128")
    change = _ac(cands)
    assert change == "`FullyShardedDataParallelPlugin(activation_checkpointing=True)`"
    assert accelerate.FullyShardedDataParallelPlugin(fsdp_version=1, activation_checkpointing=True).activation_checkpointing


def _training_arguments(text):
    """The keyword arguments of the ``TrainingArguments(...)`` a change names, as Python."""
    (args,) = re.findall(r"`TrainingArguments\((.*?)\)`", text)
    return eval(f"dict({args})")        # noqa: S307 - fsdp-lint's own output, literals only


def test_hf_trainer(tmp_path):
    """transformers 5.24's Trainer checkpoints every n-th decoder layer
    (``activation_checkpointing_kwargs={"every_n_layers": n}``): the selective candidate is written so,
    and the real Trainer, one step on CPU with the change's arguments, checkpoints exactly the layers
    the candidate's plan checkpoints (every one for the full candidate)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    res, settings, cands = _every_candidate("hf-trainer-ac", os.path.join(F, "hf_trainer", "train_clm.py"), [],
                                            world_size=4, input_shape="2,64", hf_config=os.path.join(CFG, "tiny-llama"))
    assert res.plan.framework == "transformers"
    (full,) = [c for c in cands if c["kinds"] == ["ac-full"]]
    (selective,) = [c for c in cands if c["kinds"] == ["ac-selective"]]
    assert "`fsdp_config={\"activation_checkpointing\": True}`" in full["change"]     # TrainingArguments in Python
    config = transformers.AutoConfig.from_pretrained(os.path.join(CFG, "tiny-llama"))
    assert config.num_hidden_layers > 2
    ids = torch.randint(0, config.vocab_size, (16,))
    for c in (full, selective):
        kwargs = _training_arguments(c["change"])
        assert kwargs["activation_checkpointing"] is True
        model = transformers.AutoModelForCausalLM.from_config(config)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=1,
                                              report_to="none", use_cpu=True, save_strategy="no", **kwargs)
        transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": ids, "labels": ids}]).train()
        on = [f"model.layers.{i}" for i, layer in enumerate(model.model.layers) if layer.gradient_checkpointing]
        assert on == c["plan"]["checkpointed"], (c["kinds"], on)
    assert len(selective["plan"]["checkpointed"]) == (config.num_hidden_layers + 1) // 2
