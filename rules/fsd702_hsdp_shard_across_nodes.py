"""FSD702 hsdp-shard-across-nodes."""
from fsdp_lint.check.rule import Example, Rule

_MODEL = '''
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self, dim=512):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, dim=512, layers=4):
        super().__init__()
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


rank, world = dist.get_rank(), dist.get_world_size()
gpus_per_node = 8
nodes = [dist.new_group(list(range(n * gpus_per_node, (n + 1) * gpus_per_node))) for n in range(world // gpus_per_node)]
peers = [dist.new_group(list(range(i, world, gpus_per_node))) for i in range(gpus_per_node)]
model = Net()
'''


class HSDPShardAcrossNodes(Rule):
    """HSDP shards across nodes and replicates inside one.

    ## What it does
    For HSDP (FSDP2 on a 2-D mesh) and FSDP1 `HYBRID_SHARD`/`_HYBRID_SHARD_ZERO2` units, checks
    where the shard and the replicate groups fall on the nodes (`--gpus-per-node`, default 8;
    ranks `n * gpus_per_node ...` form node `n`). It warns when a shard group spans nodes while the
    replica groups lie inside one node, with the bytes per rank and step of the collectives that then
    cross the node boundary.

    ## Why is this bad?
    Hybrid sharding puts the heavy traffic -- an all-gather of every unit in forward and backward, a
    reduce-scatter of every gradient -- on the shard group, and only one all-reduce of the gradient
    shards on the replica group, precisely so that the heavy part runs over the fast links inside a
    node. Swapped (typically the `(shard, replicate)` process-group pair given in the wrong order, or a
    hand-made mesh), every all-gather and reduce-scatter crosses the slower inter-node network. It
    trains correctly, only slower.

    ## Example
    ```python
    FSDP(model, process_group=(peers[rank % 8], nodes[rank // 8]), sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    ```

    ## Fix
    Shard inside a node, replicate across nodes: `process_group=(nodes[rank // 8], peers[rank % 8])`;
    for FSDP2, `init_device_mesh("cuda", (num_nodes, gpus_per_node), mesh_dim_names=("replicate",
    "shard"))`.
    """

    code = "FSD702"
    name = "hsdp-shard-across-nodes"
    severity = "warning"
    summary = "HSDP/HYBRID_SHARD shards across nodes and replicates within one: its heavy collectives cross nodes"

    VALID = [
        Example(_MODEL + '''
model = FSDP(model, process_group=(nodes[rank // gpus_per_node], peers[rank % gpus_per_node]),
             sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=ModuleWrapPolicy({Block}))
''', world_size=16),
    ]
    INVALID = [
        Example(_MODEL + '''
model = FSDP(model, process_group=(peers[rank % gpus_per_node], nodes[rank // gpus_per_node]),
             sharding_strategy=ShardingStrategy.HYBRID_SHARD, auto_wrap_policy=ModuleWrapPolicy({Block}))
''', world_size=16, note="the (shard, replicate) pair swapped"),
    ]

    def check(self, ctx):
        from fsdp_lint.humanize import human_bytes

        gpn = ctx.settings.gpus_per_node
        groups = {}
        for ul in ctx.layout.units:
            m = ul.unit.mesh
            if m is None or m.replicate is None or m.replicate.size <= 1 or not ul.numel:
                continue
            shard_nodes = {r // gpn for r in m.shard.group_ranks()}
            replica_nodes = {r // gpn for r in m.replicate.group_ranks()}
            if len(shard_nodes) > 1 and (len(replica_nodes) == 1 or m.shard.size <= gpn):
                groups.setdefault((ul.unit.path, ul.unit.line, ul.unit.col), []).append((ul, shard_nodes, replica_nodes))
        for (path, line, col), items in groups.items():
            ul, shard_nodes, replica_nodes = items[0]
            m = ul.unit.mesh
            heavy = sum(u.all_gather_bytes_per_step + u.reduce_scatter_bytes_per_step for u, _, _ in items)
            light = sum(u.all_reduce_bytes_per_step for u, _, _ in items)
            shard_name = f"`{m.shard.name}` " if m.shard.name and m.shard.name != "shard" else ""
            where = ("inside one node" if len(replica_nodes) == 1 else f"across {len(replica_nodes)} nodes")
            msg = (f"{len(items)} hybrid-sharded unit(s) shard across {len(shard_nodes)} nodes and replicate {where}: "
                   f"{human_bytes(heavy)}/rank per step of all-gathers and reduce-scatters cross nodes")
            detail = (f"{len(items)} hybrid-sharded unit(s) shard over {shard_name}groups of {m.shard.size} ranks that span "
                   f"{len(shard_nodes)} nodes of {gpn} GPUs (rank 0's: {m.shard.group_ranks()[:8]}), and replicate "
                   f"{where} (groups of {m.replicate.size}): every all-gather and reduce-scatter crosses nodes, "
                   f"{human_bytes(heavy)} per rank per step, while the gradient all-reduce ({human_bytes(light)}) "
                   f"is the traffic that could")
            fix = ("shard inside a node and replicate across nodes: for FSDP1 pass `process_group=(intra_node_group, "
                   "inter_node_group)` in that order; for FSDP2 `init_device_mesh(\"cuda\", (num_nodes, gpus_per_node), "
                   "mesh_dim_names=(\"replicate\", \"shard\"))`")
            yield self.finding(ctx, msg, line=line, col=col, path=path, fix=fix, detail=detail,
                               bytes_across_nodes=heavy)
