"""Round 16 of the real-launch survey: what the simulated node lacks, skipped only where it decides nothing of the
plan -- a frozen helper model (a VAE, a teacher) loaded after the trained model was wrapped, from a folder of the
node's. The oracle is real FSDP1 under the fake process group."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402

DIFFUSION = {
    "diffusion/__init__.py": "",
    "diffusion/nets.py": '''
        from __future__ import annotations

        import torch.nn as nn


        class DiTBlock(nn.Module):
            def __init__(self, width: int):
                super().__init__()
                self.attn = nn.Linear(width, 3 * width)
                self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

            def forward(self, x):
                return x + self.mlp(x)


        class DiT(nn.Module):
            def __init__(self, width: int = 64, depth: int = 4):
                super().__init__()
                self.embed = nn.Linear(16, width)
                self.blocks = nn.ModuleList(DiTBlock(width) for _ in range(depth))

            def forward(self, x):
                x = self.embed(x)
                for b in self.blocks:
                    x = b(x)
                return x


        def build(depth: int = 4) -> DiT:
            return DiT(depth=depth)
    ''',
    "train.py": '''
        from __future__ import annotations

        import argparse

        import torch
        import torch.distributed as dist
        from diffusers import AutoencoderTiny
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from diffusion.nets import DiTBlock, build

        parser = argparse.ArgumentParser()
        parser.add_argument("--depth", type=int, default=4)
        parser.add_argument("--tiny_vae", default="output/pretrained_models/tinyvae")
        args = parser.parse_args()

        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        model = build(args.depth)
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({DiTBlock}),
                     sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, device_id=torch.cuda.current_device())
        # the frozen decoder used for previews: a folder the node has
        vae = AutoencoderTiny.from_pretrained(args.tiny_vae, torch_dtype=torch.float16)
        vae.requires_grad_(False)
        vae = vae.eval().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for step in range(10):
            pass
    ''',
}


def test_a_frozen_helper_loaded_after_the_wrap_from_a_folder_of_the_node(cli, tmp_path, monkeypatch):
    # the VAE's folder is not here: its load and what follows from it are skipped (noted, with the folder named as
    # a path of the node's, not a hub model), and the plan is the trained model's, as real FSDP1 builds it
    from oracle import fsdp1_units
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    write_tree(tmp_path, DIFFUSION)
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "--depth", "3", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    plan = f["plan"]
    assert plan["api"] == "fsdp1" and plan["origin"] != "suggested" and plan["sharding_strategy"] == "SHARD_GRAD_OP"
    monkeypatch.syspath_prepend(str(tmp_path))
    from diffusion.nets import DiTBlock, build

    real = fsdp1_units(lambda: build(3), world_size=8, auto_wrap_policy=ModuleWrapPolicy({DiTBlock}),
                       sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert [(u["module"], u["numel"]) for u in plan["units"] if u["numel"]] == [(r["module"], r["numel"]) for r in real]
    skipped = " ".join(f["notes"]) + json.dumps(f.get("skipped_statements", []))
    assert "no model folder 'output/pretrained_models/tinyvae' here" in skipped and "hf download" not in skipped


def test_freezing_the_wrapped_model_from_a_missing_folder_still_ends_the_lint(cli, tmp_path):
    # the control: what is frozen is what the wrap is given (its frozen part changes every unit's trainable share),
    # so the folder it needs ends the lint, named
    tree = dict(DIFFUSION)
    tree["train.py"] = tree["train.py"].replace(
        "        model = build(args.depth)\n",
        "        model = build(args.depth)\n"
        "        frozen = AutoencoderTiny.from_pretrained(args.tiny_vae)\n"
        "        model.embed.requires_grad_(frozen is None)\n")
    write_tree(tmp_path, tree)
    res = cli("train.py", "-n", "8", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    assert "no model folder 'output/pretrained_models/tinyvae' here" in res.err
