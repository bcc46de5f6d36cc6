"""The multi-dimensional part of a plan: the mesh the file builds, each unit's shard and replicate
groups, the DTensor placements tensor/expert parallelism gave parameters before FSDP, the world size
actually used, and what fsdp-lint does not model (``plan.unsupported``).

Called by ``plan.build_plan`` once the units and their parameters are known; reads what the replay
recorded (``fsdp_lint.replay.parallel``) and writes plain data into the plan.
"""
from __future__ import annotations

from typing import Dict, Optional

from fsdp_lint.model.mesh import HYBRID, MeshDim, MeshInfo, MeshProblem, UnitMesh, Unsupported, world_dim

# torch 2.13's messages for a mesh that does not match the ranks the job runs on (the tests check them
# against torch): a mesh larger than the world fails in init_device_mesh; on a rank outside a smaller
# mesh, fully_shard fails
MESH_TOO_BIG = "RuntimeError: Mesh should not be bigger than default world size {world}, but found {mesh} ranks!"
MESH_TOO_SMALL = "IndexError: list index out of range"


def attach_parallel(plan, result, tree, options, fqn_of: Dict[int, str], param_fqn: Dict[int, str]) -> None:
    par = getattr(result, "parallel", None)
    _unit_groups(plan, par, options)
    if par is None:
        return
    roots = {u.mesh.mesh.root for u in plan.units if u.mesh is not None and u.mesh.mesh is not None}
    if roots:
        # the world is the root mesh the wrap calls shard over (the last call's, when there are several)
        last = max((u for u in plan.units if u.mesh is not None and u.mesh.mesh is not None), key=lambda u: u.seq)
        world = par.root_info.get(last.mesh.mesh.root)
        if world is not None and world.kind == "mesh":
            plan.mesh = world
            _check_world_size(plan, world, options)
            plan.world_size = world.size
            plan.world_size_source = "mesh"
            for u in plan.units:
                if u.mesh is None or u.mesh.source == "world":
                    u.mesh = UnitMesh(shard=world_dim(world.size), source="world")
                    u.shard_size = world.size
    for pid, sharding in par.param_sharding.items():
        fqn = param_fqn.get(pid)
        if fqn is not None:
            plan.param_sharding[fqn] = sharding
    for mid, style in par.tp_styles:
        fqn = fqn_of.get(mid)
        if fqn is None:
            continue
        style.module = fqn
        style.param_numels = [(f"{fqn}.{n}" if fqn else n, numel, dtype) for n, numel, dtype in style.param_numels]
        plan.tp_styles.append(style)
    plan.mesh_problems.extend(par.problems)
    for style in plan.tp_styles:
        if not style.known:
            par.unsupported.append(Unsupported(
                "tp-style", style.path, style.line,
                f"{style.style} (on {style.module or 'the root'}) is a ParallelStyle fsdp-lint does not know: the "
                f"placements it gives parameters are torch's, but its activation collectives are not counted"))
    if plan.mesh is not None:
        for d in plan.mesh.dims:
            # a pipeline dimension of size 1 is one stage holding the whole model (an engine's default)
            if d.name and d.name.lower() in ("pp", "pipeline", "pipe") and d.size > 1:
                par.unsupported.append(Unsupported(
                    "mesh", plan.mesh.path or "", plan.mesh.line,
                    f"pipeline parallelism (mesh dimension {d.name!r}): each stage holds a part of the model, "
                    f"the plan shows the model this rank builds"))
    seen = set()
    for item in par.unsupported:
        key = (item.what, item.path, item.line, item.detail)
        if key not in seen:
            seen.add(key)
            plan.unsupported.append(item)
    _normalise_reshard(plan)


def _unit_groups(plan, par, options) -> None:
    """Each unit's shard and replicate groups, from its wrap call's mesh or process groups."""
    file_meshes = par.wrap_meshes if par is not None else {}
    last_call = file_meshes[max(file_meshes)] if file_meshes else None
    for u in plan.units:
        # --wrap and suggested plans keep the groups of the file's own (last) wrap call
        um: Optional[UnitMesh] = file_meshes.get(u.seq) if u.origin in ("call", "policy") else last_call
        if um is not None and um.source == "node":
            um = _node_groups(plan, u, options)
        if um is None:
            um = UnitMesh(shard=world_dim(plan.world_size), source="world")
            hybrid = plan.api == "fsdp1" and plan.sharding_strategy in HYBRID
            if hybrid and par is None:
                um = _node_groups(plan, u, options)
        u.mesh = um
        u.shard_size = um.shard_size
        u.replicate_size = um.replicate_size


def _node_groups(plan, unit, options) -> UnitMesh:
    """FSDP1 HYBRID_SHARD without process groups: torch shards inside a node (the ranks of
    ``device_count()`` devices, here ``--gpus-per-node``) and replicates across nodes."""
    ws, gpn = plan.world_size, options.gpus_per_node
    if gpn >= ws:
        return UnitMesh(shard=MeshDim("node", ws, ((ws, 1),)), source="node")
    if ws % gpn:
        plan.unsupported.append(Unsupported(
            "process_group", unit.path, unit.line,
            f"{plan.sharding_strategy} without process groups on {ws} ranks with {gpn} GPUs per node: the world "
            f"size is not a multiple of the node size (set --gpus-per-node)"))
        return UnitMesh(shard=world_dim(ws), source="world")
    return UnitMesh(shard=MeshDim("node", gpn, ((gpn, 1),)),
                    replicate=MeshDim("nodes", ws // gpn, ((ws // gpn, gpn),)), source="node")


def _check_world_size(plan, world: MeshInfo, options) -> None:
    """The mesh the file builds against the ranks it is launched on (``--world-size``)."""
    if options.world_size_source not in ("--world-size", "config", "launch script") or world.size == options.world_size:
        return
    if world.size > options.world_size:
        message = MESH_TOO_BIG.format(world=options.world_size, mesh=world.size)
        detail = "init_device_mesh fails on every rank"
    else:
        message = MESH_TOO_SMALL
        detail = (f"ranks {world.size}..{options.world_size - 1} are in no mesh coordinate: fully_shard fails on "
                  f"them")
    plan.mesh_problems.append(MeshProblem(
        "world-size", world.path or "", world.line, 1, message,
        detail=f"the file builds a mesh {world.label()} of {world.size} ranks, launched on {options.world_size} "
               f"({options.world_size_source}): {detail}",
        summary=f"the file builds a mesh of {world.size} ranks, launched on {options.world_size} "
                f"({options.world_size_source}): {detail}"))


def _normalise_reshard(plan) -> None:
    """``reshard_after_forward=<int>`` as torch resolves it: 1 is ``False``, the shard size is ``True``."""
    for u in plan.units:
        raf = u.reshard_after_forward
        if isinstance(raf, bool) or not isinstance(raf, int):
            continue
        if raf == 1:
            u.reshard_after_forward = False
        elif raf == u.shard_size:
            u.reshard_after_forward = True
