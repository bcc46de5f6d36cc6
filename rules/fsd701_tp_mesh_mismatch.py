"""FSD701 tp-mesh-mismatch."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._mesh_examples import MODEL


class TPMeshMismatch(Rule):
    """FSDP2's mesh and the mesh of a tensor-parallel parameter do not fit together.

    ## What it does
    Checks every `fully_shard` call against the parameters it manages that are already DTensors
    (from `parallelize_module`, `distribute_tensor` or expert parallelism): FSDP2 concatenates its
    data-parallel mesh with the parameter's mesh into one mesh, so both must be slices of the same
    `init_device_mesh` mesh, named, and must not overlap. Also flags a `fully_shard` mesh that is not
    1-D (FSDP) or 2-D (HSDP). The message quotes the error torch raises for that layout (asked from
    the installed torch while the file was replayed).

    ## Why is this bad?
    torch raises in `fully_shard`, after the model was built and parallelized: with two meshes
    built by separate `init_device_mesh` calls, `RuntimeError: Cannot concatenate DeviceMeshes
    derived from different device meshs`; with FSDP on the whole world mesh while TP uses its `tp`
    dimension, `Cannot concatenate overlapping meshes`; with an unnamed mesh, a `TypeError`.

    ## Example
    ```python
    tp_mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("tp",))
    dp_mesh = init_device_mesh("cuda", (4,), mesh_dim_names=("dp",))
    parallelize_module(block, tp_mesh, plan)
    fully_shard(block, mesh=dp_mesh)
    ```

    ## Fix
    Build one mesh and slice it:
    ```python
    world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(block, world_mesh["tp"], plan)
    fully_shard(block, mesh=world_mesh["dp"])
    ```
    """

    code = "FSD701"
    name = "tp-mesh-mismatch"
    severity = "error"
    summary = "fully_shard's mesh and a tensor-parallel parameter's mesh cannot be combined (torch raises)"
    applies_to = ("fsdp2",)

    VALID = [
        Example(MODEL + '''
world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
model = Net()
for block in model.layers:
    parallelize_module(block, world_mesh["tp"], TP_PLAN)
    fully_shard(block, mesh=world_mesh["dp"])
fully_shard(model, mesh=world_mesh["dp"])
''', world_size=8),
    ]
    INVALID = [
        Example(MODEL + '''
tp_mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("tp",))
dp_mesh = init_device_mesh("cuda", (4,), mesh_dim_names=("dp",))
model = Net()
for block in model.layers:
    parallelize_module(block, tp_mesh, TP_PLAN)
    fully_shard(block, mesh=dp_mesh)
fully_shard(model, mesh=dp_mesh)
''', world_size=8, note="two init_device_mesh calls: different root meshes"),
        Example(MODEL + '''
world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
model = Net()
for block in model.layers:
    parallelize_module(block, world_mesh["tp"], TP_PLAN)
    fully_shard(block, mesh=world_mesh)
fully_shard(model, mesh=world_mesh)
''', world_size=8, note="FSDP over the whole (dp, tp) mesh: overlaps the tp dimension"),
        Example(MODEL + '''
world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
model = Net()
for block in model.layers:
    parallelize_module(block, world_mesh["tp"], TP_PLAN)
    fully_shard(block)
fully_shard(model)
''', world_size=8, note="no mesh: fully_shard builds a 1-D world mesh of its own"),
    ]

    def check(self, ctx):
        seen = set()
        for prob in ctx.plan.mesh_problems:
            if prob.kind not in ("tp-mesh", "mesh-ndim") or (prob.path, prob.line, prob.message) in seen:
                continue
            seen.add((prob.path, prob.line, prob.message))
            if prob.kind == "tp-mesh":
                msg = "fully_shard combines its mesh with tensor-parallel parameters on another mesh: torch raises"
                detail = f"{prob.detail}: torch raises `{prob.message}`"
                fix = ("slice both from one mesh: `world_mesh = init_device_mesh(\"cuda\", (dp, tp), "
                       "mesh_dim_names=(\"dp\", \"tp\"))`, then `parallelize_module(..., world_mesh[\"tp\"], ...)` "
                       "and `fully_shard(..., mesh=world_mesh[\"dp\"])`")
            else:
                msg = "fully_shard takes a 1-D (FSDP) or 2-D (HSDP) mesh: torch raises"
                detail = f"torch raises `{prob.message}`"
                fix = "pass the data-parallel dimensions only, e.g. `mesh=world_mesh[\"dp\"]`"
            yield self.finding(ctx, msg, line=prob.line, col=prob.col, path=prob.path, fix=fix, detail=detail)
