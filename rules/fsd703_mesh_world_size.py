"""FSD703 mesh-world-size-mismatch."""
from fsdp_lint.check.rule import Example, Rule, fitting
from fsdp_lint.rules._mesh_examples import MODEL


class MeshWorldSizeMismatch(Rule):
    """The mesh the file builds does not cover the ranks it is launched on.

    ## What it does
    Compares the device mesh the wrap calls shard over (its size: the product of its shape) with
    the world size given by `--world-size` or `world-size` in `[tool.fsdp-lint]` (the launch). The
    plan is always the one for the mesh the file builds; this finding says that the launch
    disagrees, and what torch does then.

    ## Why is this bad?
    A mesh with a literal shape (`init_device_mesh("cuda", (8,))`) does not grow with the job.
    Launched on 128 ranks, ranks 8-127 are in no mesh coordinate and `fully_shard` fails on them
    (`IndexError: list index out of range`); a mesh larger than the world fails in
    `init_device_mesh` itself (`RuntimeError: Mesh should not be bigger than default world
    size ...`). Either way the job dies after it was scheduled.

    ## Example
    ```python
    mesh = init_device_mesh("cuda", (8,))   # launched with torchrun --nnodes 16 --nproc-per-node 8
    ```

    ## Fix
    Derive the mesh from the launch:
    ```python
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    ```
    """

    code = "FSD703"
    name = "mesh-world-size-mismatch"
    severity = "error"
    summary = "the device mesh the file builds is not the size of the world it is launched on"

    VALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (dist.get_world_size(),))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
''', world_size=128, options={"world_size_source": "--world-size"}),
    ]
    INVALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (8,))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
''', world_size=128, options={"world_size_source": "--world-size"}, note="a literal mesh of 8 on 128 ranks"),
    ]

    def check(self, ctx):
        for prob in ctx.plan.mesh_problems:
            if prob.kind != "world-size":
                continue
            msg = fitting(f"{prob.detail}: torch raises", f"{prob.summary or prob.detail}: torch raises")
            detail = f"torch raises `{prob.message}`"
            if prob.detail not in msg:      # the mesh's dimensions, by name, are in the detail
                detail = f"{prob.detail}; {detail}"
            fix = ("build the mesh from the launch: `init_device_mesh(\"cuda\", (dist.get_world_size() // tp, tp), "
                   "...)`, or lint with the world size the job really uses")
            yield self.finding(ctx, msg, line=prob.line or 1, col=prob.col, path=prob.path or ctx.path, fix=fix,
                               detail=detail)
