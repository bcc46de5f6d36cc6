"""Activation checkpointing set through a framework enters the static estimate: Lightning's
``FSDPStrategy(activation_checkpointing_policy={Block})`` (applied after FSDP1 wraps the model) and
accelerate's ``FullyShardedDataParallelPlugin(activation_checkpointing=True)``
(``fsdp_activation_checkpointing`` in its YAML), with the real frameworks replayed. The oracle is
torch's tracker on the same plan applied by hand as the framework applies it (MemTracker for FSDP1,
FSDPMemTracker for FSDP2; fake process group, FakeTensorMode, two steps): within 25 %."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from conftest import REPO

FRAMEWORKS = os.path.join(REPO, "fixtures", "frameworks")


def _memory(cli, path, *args, cwd=REPO):
    res = cli(str(path), "--format", "json", *args, cwd=cwd)
    assert res.code in (0, 1), res.err
    (f,) = json.loads(res.out)["files"]
    return f


def test_lightning_activation_checkpointing_policy_within_a_quarter_of_memtracker(cli, tmp_path):
    pytest.importorskip("lightning")
    import oracle
    from test_simulate import _tracked_steps
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    here = os.path.join(FRAMEWORKS, "lightning_gpt")
    src = open(os.path.join(here, "fabric_train.py")).read()
    for old, new in (('        state_dict_type="full",\n', '        state_dict_type="full",\n        use_orig_params=False,\n'),
                     ('precision="bf16-mixed"', 'precision="32-true"')):
        assert old in src
        src = src.replace(old, new)
    (tmp_path / "fabric_train.py").write_text(src)
    (tmp_path / "model.py").write_text(open(os.path.join(here, "model.py")).read())
    f = _memory(cli, tmp_path / "fabric_train.py", "--world-size", "4", "--input-shape", "8,128", "--input-dtype",
                "long", cwd=str(tmp_path))
    mem = f["memory"]
    assert f["plan"]["framework"] == "lightning" and f["plan"]["api"] == "fsdp1"
    assert mem["checkpointed_regions"] == 4          # every Block, as Lightning wraps them
    sys.path.insert(0, str(tmp_path))
    try:
        from model import GPT, Block, GPTConfig
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    with oracle.fake_pg(4), FakeTensorMode(allow_non_fake_inputs=True):
        model = FSDP(GPT(GPTConfig(n_layer=4)), auto_wrap_policy=ModuleWrapPolicy({Block}),
                     device_id=torch.device("cpu"), use_orig_params=False)
        # Lightning: FSDPStrategy._setup_model wraps, then applies the checkpointing policy
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
            m, checkpoint_impl=CheckpointImpl.NO_REENTRANT), check_fn=lambda m: isinstance(m, Block))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        dev = _tracked_steps(model, optimizer, lambda: (torch.randint(0, 512, (8, 128)),),
                             lambda out: out.float().mean(), tracker)
    total = int(dev["Total"] if "Total" in dev else next(v for k, v in dev.items() if str(k) == "Total"))
    assert abs(mem["per_rank_bytes"] - total) <= 0.25 * total, (mem["per_rank_bytes"], total)


def test_accelerate_fsdp_activation_checkpointing_within_a_quarter_of_fsdpmemtracker(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from test_simulate import _hf_loss, _Kw, fsdp2_oracle
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
    from torch.distributed.fsdp import fully_shard

    config_dir = os.path.join(FRAMEWORKS, "configs", "tiny-gpt2")
    (tmp_path / "train.py").write_text(
        '"""GPT-2 with accelerate\'s FSDP2 plugin, every GPT2Block checkpointed."""\n'
        "import torch\n"
        "from accelerate import Accelerator, FullyShardedDataParallelPlugin\n"
        "from transformers import AutoConfig, AutoModelForCausalLM\n\n"
        f"CONFIG = {config_dir!r}\n\n\n"
        "def main():\n"
        "    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy=\"transformer_based_wrap\",\n"
        "                                            transformer_cls_names_to_wrap=[\"GPT2Block\"],\n"
        "                                            activation_checkpointing=True)\n"
        "    accelerator = Accelerator(fsdp_plugin=plugin)\n"
        "    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(CONFIG))\n"
        "    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)\n"
        "    model, optimizer = accelerator.prepare(model, optimizer)\n"
        "    for step in range(100):\n"
        "        ids = torch.randint(0, 512, (8, 128), device=accelerator.device)\n"
        "        accelerator.backward(model(input_ids=ids, labels=ids).loss)\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n\n\n"
        "if __name__ == \"__main__\":\n"
        "    main()\n")
    f = _memory(cli, tmp_path / "train.py", "--world-size", "4", "--input-shape", "8,128", "--input-dtype", "long",
                cwd=str(tmp_path))
    mem = f["memory"]
    assert f["plan"]["framework"] == "accelerate" and f["plan"]["api"] == "fsdp2"
    cfg = transformers.AutoConfig.from_pretrained(config_dir)
    assert mem["checkpointed_regions"] == cfg.n_layer

    def build():
        return transformers.AutoModelForCausalLM.from_config(cfg)

    def wrap(model, mesh):
        block = type(model.transformer.h[0])
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
            m, checkpoint_impl=CheckpointImpl.NO_REENTRANT), check_fn=lambda m: isinstance(m, block))
        for b in model.transformer.h:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)

    def inputs():
        ids = torch.randint(0, 512, (8, 128))
        return _Kw(input_ids=ids, labels=ids)

    snap = fsdp2_oracle(build, wrap, 4, inputs, _hf_loss)
    assert abs(mem["per_rank_bytes"] - snap["Total"]) <= 0.25 * snap["Total"], (mem["per_rank_bytes"], snap["Total"])
