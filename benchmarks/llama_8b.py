"""A Llama-3-8B-shaped decoder (32 layers, width 4096, GQA with 8 KV heads, SwiGLU 14336, vocabulary
128,256; ~8.0B parameters) trained with FSDP2, torchtitan style: one ``fully_shard`` per block, then
the root, bf16 compute. The architecture is ``llama_70b.py``'s, with 8B arguments.

This is the model file ``benchmarks/bench_simulate.py`` simulates (``fsdp-lint --simulate``): fake
tensors, no memory. Never run it for real on a laptop.

Run with: ``torchrun --nproc-per-node 8 benchmarks/llama_8b.py``
"""
import os

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from llama_70b import ModelArgs, Transformer

LLAMA_8B = ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336)


def main():
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))

    with torch.device("meta"):
        model = Transformer(LLAMA_8B)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    model.to_empty(device="cuda")

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, LLAMA_8B.vocab_size, (1, 2049), device="cuda")
    for _ in range(10):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
