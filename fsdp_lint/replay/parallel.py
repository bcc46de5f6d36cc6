"""Multi-dimensional parallelism in a replay: device meshes, process groups, tensor/expert parallelism.

While the file's setup code runs, the meshes it builds are *real* ``DeviceMesh`` objects over torch's
fake process group (rank 0 of the world, no communication), so that slicing (``mesh["tp"]``),
flattening and torch's own ``parallelize_module``/``distribute_tensor``/``distribute_module`` work
unchanged on the meta-device model: the parameters they turn into DTensors carry the placements torch
chose. ``dist.new_group`` and friends create real (fake) groups too. What FSDP will see is captured when
the file calls ``fully_shard``/``FullyShardedDataParallel`` (:func:`on_wrap_call`): the mesh or process
groups of the call, the DTensor placements of the parameters, and the errors torch raises for a mesh
layout it rejects (asked from torch itself). Everything is turned into plain data (:mod:`fsdp_lint.model.mesh`)
before the fake process group is destroyed at the end of the replay.
"""
from __future__ import annotations


import contextlib
import os
from typing import Any, Dict, List, Optional, Tuple

from fsdp_lint.model import modwalk  # issue 10
from fsdp_lint.replay import backends
from fsdp_lint.replay.default_group import default_group_on_demand
from fsdp_lint.replay.mesh_aliases import patch_init_device_mesh
from fsdp_lint.replay.placements import (_concatenate_error, _describe_style, _group_ranks, _is_dtensor, _placement,
                                         _root_mesh, _torch_message, _validate_fsdp2_mesh, reshard_int_dtensor_error,
                                         spmd_error)
from fsdp_lint.model.mesh import (
    HYBRID,
    MeshDim,
    MeshInfo,
    MeshProblem,
    ParamSharding,
    TPStyle,
    UnitMesh,
    Unsupported,
    radix_of,
    row_major_dims,
)
# what torch raises at the first forward for reshard_after_forward=<int> on DTensor (TP/EP) parameters
# (FSDPParam.to_sharded_post_forward, torch 2.13; the tests check it against torch)


class ParallelState:
    """What a replay learns about meshes, groups and DTensor parameters (plain data + module refs)."""

    def __init__(self, rec):
        self.rec = rec
        self.world_size = rec.world_size
        self.owns_pg = False
        self.pg_size = 0
        self.roots: Dict[int, int] = {}                 # id(root mesh or FakeMesh) -> root index
        self.root_info: Dict[int, MeshInfo] = {}        # root index -> the root mesh, where it was built
        self._keep: List[Any] = []                      # root meshes (so that their ids stay unique)
        self.groups: Dict[int, List[int]] = {}          # id(process group) -> ranks (group-rank order)
        self.group_pos: Dict[int, Tuple[str, int]] = {}  # id(process group) -> where it was created
        self.wrap_meshes: Dict[int, Optional[UnitMesh]] = {}   # wrap call seq -> its data-parallel groups
        self.param_sharding: Dict[int, ParamSharding] = {}     # id(DTensor parameter) -> placements
        self.tp_styles: List[Tuple[int, TPStyle]] = []         # (id(module), the style applied to it)
        self.problems: List[MeshProblem] = []
        self.unsupported: List[Unsupported] = []
        self._checked: Dict[Tuple[int, int], Optional[str]] = {}
        self._claimed: set = set()                      # ids of params an earlier fully_shard manages
        self._wrapped_before: set = set()               # ids of the modules of earlier fully_shard calls
        self.real_init_mesh = None                      # torch's init_device_mesh (install() sets it)
        self._default_mesh = None
        self._described: Dict[int, Tuple[Any, MeshInfo]] = {}

    # -- meshes ---------------------------------------------------------------------------
    def root_index(self, mesh) -> int:
        root = _root_mesh(mesh)
        key = id(root)
        if key not in self.roots:
            self.roots[key] = len(self.roots)
            self._keep.append(root)
            pos = self.rec.position()
            info = self.describe_mesh(root, root_index=self.roots[key])
            info.path, info.line = pos.path, pos.line
            self.root_info[self.roots[key]] = info
        return self.roots[key]

    def describe_mesh(self, mesh, root_index: Optional[int] = None) -> MeshInfo:
        cached = self._described.get(id(mesh))
        if cached is not None and cached[0] is mesh:
            return cached[1]
        info = self._describe_mesh(mesh, root_index)
        self._described[id(mesh)] = (mesh, info)     # the mesh is kept: its id stays its own
        return info

    def _describe_mesh(self, mesh, root_index: Optional[int] = None) -> MeshInfo:
        from fsdp_lint.replay.recorders import FakeMesh

        if isinstance(mesh, FakeMesh):
            dims = row_major_dims(mesh.mesh_shape, mesh.mesh_dim_names)
        else:
            names = tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else (None,) * mesh.ndim
            ranks = mesh.mesh
            dims = []
            for k in range(mesh.ndim):
                index = [0] * mesh.ndim
                index[k] = slice(None)
                line = [int(r) for r in ranks[tuple(index)].tolist()]
                radix = radix_of(line)
                if radix is None:
                    self.unsupported.append(Unsupported(
                        "mesh", *self._where(), f"mesh dimension {names[k] or k} holds ranks {line}: a rank layout "
                                                f"fsdp-lint does not model"))
                    radix = ((len(line), 1),)
                dims.append(MeshDim(names[k], len(line), radix))
        root = self.root_index(mesh) if root_index is None else root_index
        # a stand-in (fsdp-lint filled a helper's `mesh` argument) is not a mesh the file builds
        info = MeshInfo(dims, root=root, kind="stand-in" if isinstance(mesh, FakeMesh) else "mesh")
        base = self.root_info.get(root)
        if base is not None:
            info.path, info.line = base.path, base.line
        return info

    def _where(self) -> Tuple[str, int]:
        pos = self.rec.position()
        return pos.path, pos.line

    def group_dim(self, pg, name: Optional[str] = None) -> Optional[MeshDim]:
        ranks = self.groups.get(id(pg))
        if ranks is None:
            ranks = _group_ranks(pg)
        if ranks is None:
            return None
        radix = radix_of(ranks)
        if radix is None:
            where = self.group_pos.get(id(pg)) or self._where()
            self.unsupported.append(Unsupported(
                "process_group", *where,
                f"a process group of ranks {ranks} used by the wrap at line {self._where()[1]}: a rank "
                f"layout fsdp-lint does not model"))
            radix = ((len(ranks), 1),)
        return MeshDim(name, len(ranks), radix)

    # -- the wrap calls ----------------------------------------------------------------------
    def on_wrap_call(self, call) -> None:
        try:
            if call.api == "fsdp2":
                self._fsdp2(call)
            else:
                self._fsdp1(call)
        except Exception as exc:  # never fail a replay over the description of a mesh
            self.unsupported.append(Unsupported(
                "mesh", call.pos.path, call.pos.line,
                f"could not read the mesh of this wrap call: {type(exc).__name__}: {exc}"))

    def _fsdp2(self, call) -> None:
        kw = call.kwargs
        mesh = kw.get("mesh")
        pos = call.pos
        # shard_placement_fn is evaluated per parameter (WrapCall.shard_dims); over DTensor (TP/EP)
        # parameters the combined placement is not modelled
        over_dtensors = kw.get("shard_placement_fn") is not None and any(
            type(p).__name__ == "DTensor" for m in call.modules for p in m.parameters())
        if kw.get("shard_placement_fn") is not None and over_dtensors:
            self.unsupported.append(Unsupported(
                "shard_placement_fn", pos.path, pos.line, "fully_shard(shard_placement_fn=...) is not modelled: the "
                                                          "shards of the parameters it places differently are not computed"))
        if kw.get("dp_mesh_dims") is not None:
            self._fsdp2_spmd(call)
            return
        if mesh is None:
            self.wrap_meshes[call.seq] = None
        else:
            info = self.describe_mesh(mesh)
            if info.ndim not in (1, 2):
                self.problems.append(MeshProblem(
                    "mesh-ndim", pos.path, pos.line, pos.col,
                    _torch_message(lambda: _validate_fsdp2_mesh(mesh),
                                   f"ValueError: fully_shard expects a 1D or 2D DeviceMesh but got {mesh}")))
                self.wrap_meshes[call.seq] = UnitMesh(shard=MeshDim(None, info.size, ((info.size, 1),)),
                                                      mesh=info, source="mesh")
            elif info.ndim == 1:
                self.wrap_meshes[call.seq] = UnitMesh(shard=info.dims[0], mesh=info, source="mesh")
            else:
                self.wrap_meshes[call.seq] = UnitMesh(shard=info.dims[1], replicate=info.dims[0], mesh=info,
                                                      source="mesh")
        if getattr(call, "placement_meshes", None):       # only then: the default mesh needs a process group
            dp_mesh = mesh if mesh is not None else self.default_mesh()
            self._check_placement_meshes(call, dp_mesh, self.describe_mesh(dp_mesh) if dp_mesh is not None else None)
        raf = kw.get("reshard_after_forward")
        unit_mesh = self.wrap_meshes[call.seq]
        shard_size = unit_mesh.shard_size if unit_mesh is not None else self.world_size
        if isinstance(raf, int) and not isinstance(raf, bool):
            if raf < 1 or raf > shard_size or shard_size % raf:
                self.problems.append(MeshProblem(
                    "reshard-int", pos.path, pos.line, pos.col,
                    "ValueError: If passing reshard_after_forward as an int, it should be a factor of "
                    f"{shard_size}, not {raf}"))
        dtensors = False
        # the subtrees of units wrapped before are theirs (and walked when they were wrapped)
        earlier = self._wrapped_before
        for m in call.modules:
            for name, p in modwalk.named_parameters(m, earlier):   # issue 10: no nested generators
                # the parameters this call manages: not those of a nested, earlier fully_shard
                if not _is_dtensor(p) or id(p) in self._claimed:
                    continue
                dtensors = True
                self.capture_param(p, pos)
                dp_mesh = mesh if mesh is not None else self.default_mesh()
                if dp_mesh is not None:
                    self._check_meshes(dp_mesh, p, pos, m, name)
        if dtensors and isinstance(raf, int) and not isinstance(raf, bool) and 1 < raf < shard_size:
            self.problems.append(MeshProblem("reshard-int-dtensor", pos.path, pos.line, pos.col,
                                             reshard_int_dtensor_error()))
        for m in call.modules:
            self._claimed.update(id(p) for p in modwalk.parameters(m, earlier))   # issue 10
        self._wrapped_before.update(id(m) for m in call.modules)

    @staticmethod
    def spmd_error(modules, kwargs):
        """What ``fully_shard(..., dp_mesh_dims=...)`` raises for this call (the recorder raises it)."""
        return spmd_error(modules, kwargs)

    def _fsdp2_spmd(self, call) -> None:
        """``fully_shard(model, mesh=<the full SPMD mesh>, dp_mesh_dims=DataParallelMeshDims(...))``
        (torchtitan's default path): the parameters are DTensors on the full mesh, ``Replicate()`` on the
        data-parallel dims (the recorder raised torch's error otherwise). torch shards each over the dp
        mesh its ``_get_mesh_info`` builds (the shard dims flattened; HSDP: replicate x shard), after
        the placements of the other dims -- the arithmetic of TP + FSDP2 on a separate dp mesh, exact
        when the dp dims come before the others (then torch's ``_StridedShard`` split factor is the
        others' shards of that dim)."""
        from fsdp_lint.replay.recorders import FakeMesh

        kw, pos = call.kwargs, call.pos
        mesh, dims = kw.get("mesh"), kw.get("dp_mesh_dims")
        shard, replicate = tuple(dims.shard_names), tuple(dims.replicate_names)

        def refuse(detail):
            self.unsupported.append(Unsupported("dp_mesh_dims", pos.path, pos.line, detail, blocks_partial=True))
            self.wrap_meshes[call.seq] = None

        if isinstance(mesh, FakeMesh):
            return refuse("fully_shard(dp_mesh_dims=...) on a mesh fsdp-lint stood in for: its dimensions are not known")
        if not shard:
            return refuse(f"fully_shard(dp_mesh_dims=DataParallelMeshDims(replicate={dims.replicate!r})) without a "
                          f"shard dim (replication only) is not modelled")
        info = self.describe_mesh(mesh)
        names = info.names
        dp = {names.index(n) for n in shard + replicate}
        if dp and max(dp) > min((i for i in range(info.ndim) if i not in dp), default=info.ndim):
            return refuse(f"fully_shard(dp_mesh_dims=...) with a non-data-parallel dim before a data-parallel one "
                          f"(mesh {info.label()}): torch's strided shard of that layout is not modelled")
        import torch
        from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info

        with torch._C.DisableTorchFunction():
            dp_mesh = _get_mesh_info(mesh, dims).mesh
        dp_info = self.describe_mesh(dp_mesh, root_index=info.root)
        if dp_info.ndim == 1:
            self.wrap_meshes[call.seq] = UnitMesh(shard=dp_info.dims[0], mesh=info, source="mesh")
        else:
            self.wrap_meshes[call.seq] = UnitMesh(shard=dp_info.dims[1], replicate=dp_info.dims[0], mesh=info,
                                                  source="mesh")
        others = [i for i in range(info.ndim) if i not in dp]
        tp_info = MeshInfo([info.dims[i] for i in others], root=info.root, path=info.path, line=info.line)
        earlier = self._wrapped_before
        for m in call.modules:
            for _name, p in modwalk.named_parameters(m, earlier):
                if not _is_dtensor(p) or id(p) in self._claimed:
                    continue
                placements = tuple(_placement(x) for x in p.placements)
                if any(x is None or x[0] == "P" for x in placements):
                    self.capture_param(p, pos)        # says which placement is not modelled
                    continue
                old = self.param_sharding.get(id(p))
                self.param_sharding[id(p)] = ParamSharding(tp_info, tuple(placements[i] for i in others),
                                                           old.path if old else pos.path, old.line if old else pos.line,
                                                           old.style if old else None)
        self._check_placement_meshes(call, dp_mesh, dp_info)
        for m in call.modules:
            self._claimed.update(id(p) for p in modwalk.parameters(m, earlier))
        self._wrapped_before.update(id(m) for m in call.modules)

    def _check_placement_meshes(self, call, dp_mesh, dp_info: Optional[MeshInfo]) -> None:
        """A ``ShardPlacementResult`` whose ``mesh_info`` is another mesh than the call's (torchtitan's
        per-parameter expert mesh): the units' shards, padding and collectives are computed over the
        call's mesh, so no part of the plan would be right -- refused even with --allow-partial."""
        from fsdp_lint.replay.recorders import FakeMesh

        for other in (getattr(call, "placement_meshes", None) or {}).values():
            if other is None or other is dp_mesh:
                continue
            same = dp_info is not None and not isinstance(other, FakeMesh) and \
                [d.radix for d in self.describe_mesh(other).dims][-1:] == [d.radix for d in dp_info.dims][-1:]
            if not same:
                self.unsupported.append(Unsupported(
                    "shard_placement_fn", call.pos.path, call.pos.line,
                    "shard_placement_fn returning ShardPlacementResult(mesh_info=...) on another mesh than the "
                    "call's (a per-parameter mesh, torchtitan's expert mesh) is not modelled", blocks_partial=True))
                return

    def default_mesh(self):
        """The mesh ``fully_shard`` builds without ``mesh=``: a new 1-D mesh over the world."""
        if self._default_mesh is None and self.real_init_mesh is not None and not self.rec.real:
            import torch

            with contextlib.suppress(Exception), torch._C.DisableTorchFunction():
                self._default_mesh = self.real_init_mesh("cpu", (self.pg_size or self.world_size,))
        return self._default_mesh

    def _check_meshes(self, dp_mesh, param, pos, module, name) -> None:
        """What torch says when FSDP2 combines its mesh with a DTensor parameter's (``FSDPParam``'s
        ``_init_sharding_spec_tp``: the two meshes are concatenated into one SPMD mesh)."""
        tp_mesh = param.device_mesh
        key = (id(dp_mesh), id(tp_mesh), tuple(param.shape), tuple(map(repr, param.placements)))
        if key not in self._checked:
            self._checked[key] = _concatenate_error(dp_mesh, tp_mesh, len(param.placements), param)
        message = self._checked[key]
        if message and not any(p.kind == "tp-mesh" and p.line == pos.line and p.path == pos.path and
                               p.message == message for p in self.problems):
            self.problems.append(MeshProblem("tp-mesh", pos.path, pos.line, pos.col, message,
                                             detail=f"{name} is a DTensor on mesh {self.describe_mesh(tp_mesh).label()},"
                                                    f" {', '.join(repr(p) for p in param.placements)}"))

    def capture_param(self, p, pos, style: Optional[str] = None) -> None:
        if id(p) in self.param_sharding:
            return
        placements = tuple(_placement(x) for x in p.placements)
        for x, raw in zip(placements, p.placements):
            if x is None:
                self.unsupported.append(Unsupported("placement", pos.path, pos.line,
                                                    f"parameter placement {raw} is not modelled"))
        placements = tuple(x or ("R",) for x in placements)
        if any(x[0] == "P" for x in placements):
            self.unsupported.append(Unsupported("placement", pos.path, pos.line,
                                                "a Partial() parameter placement is not modelled"))
        self.param_sharding[id(p)] = ParamSharding(self.describe_mesh(p.device_mesh), placements, pos.path,
                                                   pos.line, style)

    def _fsdp1(self, call) -> None:
        kw = call.kwargs
        pos = call.pos
        strategy = getattr(kw.get("sharding_strategy"), "name", None) or (
            str(kw["sharding_strategy"]) if kw.get("sharding_strategy") is not None else None)
        mesh, pg = kw.get("device_mesh"), kw.get("process_group")
        unit_mesh: Optional[UnitMesh] = None
        if strategy in HYBRID:
            if mesh is not None:
                info = self.describe_mesh(mesh)
                if info.ndim >= 2:
                    unit_mesh = UnitMesh(shard=info.dims[-1], replicate=info.dims[-2], mesh=info, source="device_mesh")
                else:
                    unit_mesh = UnitMesh(shard=info.dims[0], mesh=info, source="device_mesh")
            elif isinstance(pg, (tuple, list)) and len(pg) == 2:
                shard, replicate = self.group_dim(pg[0], "shard"), self.group_dim(pg[1], "replicate")
                if shard is None or replicate is None:
                    self.unsupported.append(Unsupported(
                        "process_group", pos.path, pos.line,
                        "the (shard, replicate) process groups of this HYBRID_SHARD wrap could not be read"))
                else:
                    unit_mesh = UnitMesh(shard=shard, replicate=replicate, source="process_group")
            elif pg is None:
                unit_mesh = UnitMesh(shard=MeshDim("node", 0), source="node")   # sized by --gpus-per-node
            else:
                self.unsupported.append(Unsupported(
                    "process_group", pos.path, pos.line,
                    f"{strategy} with a single process group: torch expects a (shard, replicate) pair"))
        elif mesh is not None:
            info = self.describe_mesh(mesh)
            unit_mesh = UnitMesh(shard=info.dims[-1], mesh=info, source="device_mesh")
        elif pg is not None:
            dim = self.group_dim(pg)
            if dim is None:
                self.unsupported.append(Unsupported("process_group", pos.path, pos.line,
                                                    "the process group of this wrap could not be read"))
            else:
                unit_mesh = UnitMesh(shard=dim, source="process_group")
        self.wrap_meshes[call.seq] = unit_mesh
        for m in call.modules:
            if any(_is_dtensor(p) for p in m.parameters()):
                self.unsupported.append(Unsupported(
                    "placement", pos.path, pos.line,
                    "FSDP1 over DTensor (tensor-parallel) parameters is not modelled; use FSDP2 (fully_shard)"))
                break

    # -- tensor parallelism ------------------------------------------------------------------
    def on_parallelize(self, module, style, mesh, pos) -> None:
        """One ParallelStyle applied to one module (a leaf of ``parallelize_module``'s plan)."""
        name = type(style).__name__
        for p in module.parameters():
            if _is_dtensor(p):
                self.capture_param(p, pos, style=name)
        try:
            self.tp_styles.append((id(module), _describe_style(module, style, self.describe_mesh(mesh), pos)))
        except Exception as exc:
            self.unsupported.append(Unsupported("tp-style", pos.path, pos.line,
                                                f"{name} could not be read: {type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------------------------
# installing it in the sandbox
# --------------------------------------------------------------------------------------------
def install(rec, patch, real_init_mesh) -> None:
    """Replace the sandbox's mesh and group functions by real ones over a fake process group, and
    record ``parallelize_module``. Called by ``sandbox()`` after its own patches, with torch's own
    ``init_device_mesh``; :func:`uninstall` destroys what it created."""
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm_mod
    from torch.distributed import distributed_c10d as c10d

    from fsdp_lint.replay.recorders import FakeMesh

    state = ParallelState(rec)
    state.real_init_mesh = real_init_mesh
    rec.parallel = state
    gpn = getattr(rec, "gpus_per_node", None)
    if gpn and not rec.real:
        # the launch's nodes: torchrun's LOCAL_WORLD_SIZE and the GPUs a rank sees
        local = min(gpn, rec.world_size)
        os.environ["LOCAL_WORLD_SIZE"] = str(local)
        patch(torch.cuda, "device_count", lambda: local)
    sandbox_init_mesh = dm_mod.init_device_mesh

    def ensure_pg(size: int) -> bool:
        if c10d.is_initialized():
            state.pg_size = state.pg_size or c10d.get_world_size()
            return True
        from torch.testing._internal.distributed.fake_pg import FakeStore

        state.pg_size = max(size, rec.world_size)
        c10d.init_process_group("fake", store=FakeStore(), rank=0, world_size=state.pg_size)
        state.owns_pg = True
        return True

    def init_device_mesh(device_type, mesh_shape, *args, mesh_dim_names=None, **kwargs):
        shape = tuple(int(s) for s in (mesh_shape if isinstance(mesh_shape, (tuple, list)) else (mesh_shape,)))
        numel = 1
        for s in shape:
            numel *= s
        if rec.real:
            mesh = sandbox_init_mesh(device_type, shape, *args, mesh_dim_names=mesh_dim_names, **kwargs)
        else:
            rec.mesh_sizes.append(shape)
            ensure_pg(numel)
            if numel > state.pg_size:
                # a second mesh larger than the first: torch would raise; keep a stand-in
                mesh = FakeMesh(device_type, shape, mesh_dim_names)
                state.unsupported.append(Unsupported(
                    "mesh", *state._where(), f"a mesh of {numel} ranks after one of {state.pg_size}"))
            else:
                with torch._C.DisableTorchFunction():
                    mesh = real_init_mesh("cpu", shape,
                                          mesh_dim_names=tuple(mesh_dim_names) if mesh_dim_names else None)
        with contextlib.suppress(Exception):
            state.root_index(mesh)
        return mesh

    patch_init_device_mesh(patch, init_device_mesh)      # every module a script may bind it from
    if hasattr(c10d, "_store_based_barrier"):
        # TORCH_DIST_INIT_BARRIER=1 (OLMo-core sets it) makes every new group wait on the store until all
        # ranks arrive; on the simulated node they all have (the fake store has no counters)
        patch(c10d, "_store_based_barrier", lambda *a, **k: None)
    if not rec.real:
        # device-mesh methods build small index tensors: keep them off the meta device
        for name in ("__getitem__", "_flatten", "_unflatten"):
            real = dm_mod.DeviceMesh.__dict__.get(name)
            if real is not None:
                patch(dm_mod.DeviceMesh, name, _off_meta(real))
        _install_groups(state, patch, ensure_pg, dist, c10d)
        default_group_on_demand(rec, patch, ensure_pg, c10d)
    _install_parallelize(state, patch)


def uninstall(rec) -> None:
    state = getattr(rec, "parallel", None)
    if state is None:
        return
    state._keep.clear()
    state._described.clear()
    state._default_mesh = None
    state.real_init_mesh = None
    if state.owns_pg:
        from torch.distributed import distributed_c10d as c10d

        with contextlib.suppress(Exception):
            c10d.destroy_process_group()
        state.owns_pg = False
        clear_dtensor_caches()


def clear_dtensor_caches() -> None:
    """DTensor caches sharding decisions and redistribution plans keyed by meshes that compare by
    value: after the process group is gone, a later file's equal mesh would reuse groups that no
    longer exist. Each cache is cleared on its own, under the name the installed torch gives it."""
    import torch

    with contextlib.suppress(Exception):
        torch._C._clear_DTensor_sharding_propagator_cache()   # the C++ fast path's cache (torch >= 2.9)
    for cache in dtensor_caches():
        with contextlib.suppress(Exception):
            # torch 2.6/2.9: propagate_op_sharding is a LocalLRUCache without cache_clear, its .cache has
            (cache.cache_clear if hasattr(cache, "cache_clear") else cache.cache.cache_clear)()
    with contextlib.suppress(Exception):
        from torch.distributed.tensor import _redistribute

        _redistribute.clear_redistribute_planner_cache()       # absent on torch 2.6/2.9


def dtensor_caches() -> list:
    """DTensor's Python caches: sharding propagation, tensor meta (``_propagate_tensor_meta_cached``,
    ``_propagate_tensor_meta`` on torch 2.6/2.9) and ``_gen_transform_infos``."""
    caches: list = []
    with contextlib.suppress(Exception):
        from torch.distributed.tensor import DTensor, _redistribute

        prop = DTensor._op_dispatcher.sharding_propagator
        meta = getattr(prop, "_propagate_tensor_meta_cached", None) or prop._propagate_tensor_meta
        caches += [prop.propagate_op_sharding, meta, _redistribute._gen_transform_infos]
    return caches


def _off_meta(fn):
    import functools

    import torch

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)
    return wrapper


def _without_backend(c10d, ranks, args, kwargs):
    """`new_group` again without its `backend`/`pg_options`, or None (it failed for another reason)."""
    if not args and "backend" not in kwargs and "pg_options" not in kwargs:
        return None
    rest = {k: v for k, v in kwargs.items() if k not in ("backend", "pg_options")}
    try:
        return c10d.new_group(ranks, **rest)
    except Exception:  # noqa: BLE001
        return None


def _install_groups(state: ParallelState, patch, ensure_pg, dist, c10d) -> None:
    made_with = backends.install(patch, dist)     # the backend each group was made with

    def new_group(ranks=None, *args, **kwargs):
        ensure_pg(max(ranks) + 1 if ranks else 0)
        try:
            pg = c10d.new_group(ranks, *args, **kwargs)
        except Exception as exc:
            # trials: a group with a backend of its own (`new_group(backend="gloo")` for CPU barriers) is the
            # same ranks over the simulated backend; the ranks are what a plan reads
            pg = _without_backend(c10d, ranks, args, kwargs)
            if pg is None:
                state.unsupported.append(Unsupported("process_group", *state._where(),
                                                     f"dist.new_group({ranks!r}) failed here: {exc}"))
                return None
        if ranks is not None:
            state.groups[id(pg)] = sorted(int(r) for r in ranks)
            state.group_pos[id(pg)] = state._where()
        made_with(pg, args, kwargs)
        return pg

    def new_subgroups(group_size=None, group=None, *args, **kwargs):
        ensure_pg(0)
        cur, subgroups = c10d.new_subgroups(group_size, group, *args, **kwargs)
        return cur, subgroups

    def new_subgroups_by_enumeration(ranks_per_subgroup_list, *args, **kwargs):
        ensure_pg(max((max(r) for r in ranks_per_subgroup_list if r), default=-1) + 1)
        cur, subgroups = c10d.new_subgroups_by_enumeration(ranks_per_subgroup_list, *args, **kwargs)
        for ranks, pg in zip(ranks_per_subgroup_list, subgroups):
            state.groups[id(pg)] = sorted(int(r) for r in ranks)
        return cur, subgroups

    for name, fn in (("new_group", new_group), ("new_subgroups", new_subgroups),
                     ("new_subgroups_by_enumeration", new_subgroups_by_enumeration)):
        if hasattr(dist, name):
            patch(dist, name, fn)


def _install_parallelize(state: ParallelState, patch) -> None:
    try:
        import torch.distributed.tensor.parallel as tp_pkg
        import torch.distributed.tensor.parallel.api as tp_api
        from torch.distributed.tensor.parallel import ParallelStyle
    except Exception:  # pragma: no cover - torch without tensor parallelism
        return
    real = tp_api.parallelize_module

    def parallelize_module(module, device_mesh=None, parallelize_plan=None, *args, **kwargs):
        if isinstance(parallelize_plan, ParallelStyle):
            pos = state.rec.position()
            out = real(module, device_mesh, parallelize_plan, *args, **kwargs)
            state.on_parallelize(module, parallelize_plan, device_mesh, pos)
            return out
        # a dict plan: torch walks it and calls parallelize_module (this function) for each leaf
        return real(module, device_mesh, parallelize_plan, *args, **kwargs)

    patch(tp_api, "parallelize_module", parallelize_module)
    patch(tp_pkg, "parallelize_module", parallelize_module)
