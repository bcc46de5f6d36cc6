"""FSD705 shard-group-of-one."""
from fsdp_lint.check.rule import Example, Rule, fitting
from fsdp_lint.rules._mesh_examples import MODEL


class ShardGroupOfOne(Rule):
    """Hybrid sharding over a shard dimension of one rank: nothing is sharded.

    ## What it does
    Finds units that FSDP shards over a group of one rank while it replicates them over several:
    `fully_shard(module, mesh=mesh)` given a 2-D mesh whose second dimension has size 1 (a
    `(data_parallel, tensor_parallel)` mesh with no tensor parallelism), or a hybrid-sharding mesh
    built as `(world, 1)`. It reports the units of each call, the parameters every rank then holds
    whole, and the dimension that was meant to shard.

    ## Why is this bad?
    `fully_shard` treats a 2-D mesh as HSDP: it replicates over dimension 0 and shards over
    dimension 1. With a shard dimension of 1 every rank keeps all parameters, gradients and optimizer
    state unsharded, as DDP would, while still paying FSDP's per-unit hooks and an all-reduce of every
    gradient: the memory the job was sized for is not saved, and a model that only fits sharded runs
    out of memory. It is easy to do when a framework hands the training code its whole mesh (Lightning's
    `ModelParallelStrategy` passes `(data_parallel, tensor_parallel)`) and the code forwards it to
    `fully_shard` unchanged.

    ## Example
    ```python
    mesh = init_device_mesh("cuda", (8, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    for block in model.layers:
        fully_shard(block, mesh=mesh)            # replicates over 8, shards over 1
    ```

    ## Fix
    Shard over the data-parallel dimension:
    ```python
    for block in model.layers:
        fully_shard(block, mesh=mesh["data_parallel"])
    ```
    """

    code = "FSD705"
    name = "shard-group-of-one"
    severity = "warning"
    summary = "hybrid sharding whose shard group has one rank: every rank keeps all parameters"

    VALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (4, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh["data_parallel"])
fully_shard(model, mesh=mesh["data_parallel"])
''', world_size=4, note="the data-parallel sub-mesh"),
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("replicate", "shard"))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
''', world_size=4, note="HSDP that shards over 2 ranks"),
    ]
    INVALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (4, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
''', world_size=4, note="the whole (data_parallel, tensor_parallel) mesh"),
    ]

    def check(self, ctx):
        calls = {}
        for ul in ctx.layout.units:
            m = ul.unit.mesh
            if m is None or m.replicate is None or m.replicate.size <= 1 or m.shard.size != 1 or not ul.numel:
                continue
            calls.setdefault((ul.unit.path, ul.unit.line, ul.unit.col), []).append(ul)
        for (path, line, col), units in calls.items():
            m = units[0].unit.mesh
            numel = sum(u.numel for u in units)
            shard = f"`{m.shard.name}`" if m.shard.name else "dimension 1"
            rep = f"`{m.replicate.name}`" if m.replicate.name else "dimension 0"
            msg = fitting(f"{len(units)} unit(s) are hybrid-sharded over a 2-D mesh whose shard dimension {shard} has "
                          f"1 rank: nothing is sharded",
                          f"{len(units)} unit(s) are hybrid-sharded over a 2-D mesh whose shard dimension (dimension 1) "
                          f"has 1 rank: nothing is sharded")
            named = "" if shard in msg else f"the shard dimension is {shard}; "
            detail = (f"{named}every rank keeps all {numel:,} of their parameters with their gradients "
                      f"and optimizer state, and all-reduces the gradients over {rep} ({m.replicate.size} ranks), as DDP "
                      f"would; `fully_shard` replicates over dimension 0 of a 2-D mesh and shards over dimension 1")
            if m.replicate.name:
                fix = f"shard over the data-parallel dimension: `fully_shard(..., mesh=mesh[\"{m.replicate.name}\"])`"
            else:
                fix = "give `fully_shard` a 1-D mesh of the ranks to shard over"
            yield self.finding(ctx, msg, line=line, col=col, path=path, fix=fix, detail=detail, units=len(units),
                               unsharded_numel=numel)
