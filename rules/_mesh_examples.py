"""A small model shared by the mesh rules' VALID/INVALID examples (FSD701-FSD704)."""

MODEL = '''
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self, dim=256, hidden=1024):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, dim=256, layers=4):
        super().__init__()
        self.layers = nn.ModuleList([MLP(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

TP_PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}
'''
