"""FSD704 invalid-reshard-after-forward."""
from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._mesh_examples import MODEL


class InvalidReshardAfterForward(Rule):
    """`reshard_after_forward=<int>` that torch rejects.

    ## What it does
    Flags `fully_shard(..., reshard_after_forward=k)` with an int `k` that is not a factor of the
    shard group's size, and an int `k` on a group holding tensor-parallel (DTensor) parameters.

    ## Why is this bad?
    An int reshards the parameters after forward to groups of `k` ranks (less memory than keeping
    them unsharded, smaller backward all-gathers than resharding to the whole group). torch raises
    `ValueError: If passing reshard_after_forward as an int, it should be a factor of ...` in
    `fully_shard` for a `k` that does not divide the shard group, and `NotImplementedError:
    Resharding to smaller mesh is not supported for DTensor parameters yet` at the end of the first
    forward for DTensor parameters.

    ## Example
    ```python
    fully_shard(block, mesh=world_mesh["dp"], reshard_after_forward=2)   # block is tensor-parallel
    ```

    ## Fix
    Use a factor of the shard group's size, or `True`/`False` for tensor-parallel blocks.
    """

    code = "FSD704"
    name = "invalid-reshard-after-forward"
    severity = "error"
    summary = "reshard_after_forward=<int> that is not a factor of the shard group, or on DTensor params (torch raises)"
    applies_to = ("fsdp2",)

    VALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (8,), mesh_dim_names=("dp",))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh, reshard_after_forward=4)
fully_shard(model, mesh=mesh)
''', world_size=8),
    ]
    INVALID = [
        Example(MODEL + '''
mesh = init_device_mesh("cuda", (8,), mesh_dim_names=("dp",))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh, reshard_after_forward=3)
fully_shard(model, mesh=mesh)
''', world_size=8, note="3 does not divide 8"),
        Example(MODEL + '''
world_mesh = init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
model = Net()
for block in model.layers:
    parallelize_module(block, world_mesh["tp"], TP_PLAN)
    fully_shard(block, mesh=world_mesh["dp"], reshard_after_forward=2)
fully_shard(model, mesh=world_mesh["dp"])
''', world_size=8, note="int resharding of tensor-parallel blocks"),
    ]

    def check(self, ctx):
        seen = set()
        for prob in ctx.plan.mesh_problems:
            if prob.kind not in ("reshard-int", "reshard-int-dtensor") or (prob.path, prob.line) in seen:
                continue
            seen.add((prob.path, prob.line))
            if prob.kind == "reshard-int":
                msg = "torch rejects this reshard_after_forward in fully_shard"
                detail = f"torch raises `{prob.message}`"
                fix = "pass a factor of the shard group's size (or True/False)"
            else:
                msg = ("reshard_after_forward=<int> on tensor-parallel (DTensor) parameters: torch raises at the end "
                       "of the first forward")
                detail = f"torch raises `{prob.message}`"
                fix = "use reshard_after_forward=True (or False) for tensor-parallel blocks"
            yield self.finding(ctx, msg, line=prob.line, col=prob.col, path=prob.path, fix=fix, detail=detail)
