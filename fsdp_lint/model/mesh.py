"""Device meshes, process groups and DTensor placements as plain data, and their arithmetic.

A replay records the meshes the file builds (``init_device_mesh``, slices ``mesh["tp"]``, flattened
dims), the process groups it creates (``dist.new_group``) and the placements of parameters that are
already DTensors when FSDP sees them (tensor/expert parallelism). This module describes them without
torch objects, so that plan, layout, rules and report can compute with them:

* a mesh dimension is a group size plus where its ranks sit in the world: rank r's coordinate along
  the dimension is read from r in mixed radix (``radix``: (size, stride) digits, outermost first), the
  way a row-major root mesh, a slice of it or a flattening of adjacent dimensions lays ranks out;
* a placement is ``("S", dim)`` (Shard), ``("R",)`` (Replicate), ``("P",)`` (Partial) or
  ``("SS", dim, split_factor)`` (``_StridedShard``), printed as torch prints them;
* local shapes follow DTensor's ``Shard`` arithmetic (``torch.chunk``: ``ceil(n / k)`` per rank, the
  last ranks fewer or none), one mesh dimension after the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

Placement = Tuple  # ("S", dim) | ("R",) | ("P",) | ("SS", dim, split_factor)
HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")   # FSDP1 strategies that shard in a group, replicate across


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class MeshDim:
    name: Optional[str]
    size: int
    radix: Tuple[Tuple[int, int], ...] = ()      # (size, stride) digits of a global rank, outermost first

    def coordinate(self, rank: int) -> int:
        """Rank `rank`'s coordinate along this dimension (0 .. size-1)."""
        if not self.radix:
            return 0
        coord = 0
        for size, stride in self.radix:
            coord = coord * size + (rank // stride) % size
        return coord

    @property
    def label(self) -> str:
        return f"{self.name} {self.size}" if self.name else str(self.size)

    def group_ranks(self) -> List[int]:
        """The global ranks of rank 0's group along this dimension, by coordinate."""
        if not self.radix:
            return list(range(self.size))
        out = []
        for c in range(self.size):
            rank, rest = 0, c
            for size, stride in reversed(self.radix):
                rank += (rest % size) * stride
                rest //= size
            out.append(rank)
        return out


@dataclass
class MeshInfo:
    """A device mesh (or the rank layout of process groups) the file builds."""
    dims: List[MeshDim]
    root: int = 0                     # which root mesh it derives from (meshes with different roots do not mix)
    path: Optional[str] = None        # where its root was created
    line: int = 0
    kind: str = "mesh"                # "mesh" (built by the file) | "stand-in" (fsdp-lint's, for a helper's argument)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def names(self) -> Tuple[Optional[str], ...]:
        return tuple(d.name for d in self.dims)

    @property
    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.size
        return n

    @property
    def ndim(self) -> int:
        return len(self.dims)

    def label(self) -> str:
        """``(dp 4, tp 2)``; an unnamed 1-D mesh is ``(8)``."""
        return "(" + ", ".join(d.label for d in self.dims) + ")"

    def coordinates(self, rank: int) -> Tuple[int, ...]:
        return tuple(d.coordinate(rank) for d in self.dims)

    def corner_ranks(self) -> List[int]:
        """The ranks at the first and the last coordinate of every dimension (2^ndim of them, in
        rank order): where uneven shards differ most."""
        ranks = {0}
        for d in self.dims:
            last = d.group_ranks()[-1] if d.size > 1 else 0
            ranks |= {r + last for r in ranks}
        return sorted(ranks)


@dataclass
class UnitMesh:
    """The data-parallel groups of one FSDP unit: sharded over `shard`, replicated over `replicate`."""
    shard: MeshDim
    replicate: Optional[MeshDim] = None
    mesh: Optional[MeshInfo] = None           # the mesh (or process groups) the wrap call got
    source: str = "world"                     # "mesh" | "device_mesh" | "process_group" | "world" | "node"

    @property
    def shard_size(self) -> int:
        return self.shard.size

    @property
    def replicate_size(self) -> int:
        return self.replicate.size if self.replicate is not None else 1

    def label(self) -> str:
        shard = self.shard.name or "shard"
        if self.replicate is None or self.replicate.size == 1:
            return f"{shard} {self.shard.size}"
        return f"{self.replicate.name or 'replicate'} {self.replicate.size} × {shard} {self.shard.size}"


@dataclass
class ParamSharding:
    """A parameter that is a DTensor before FSDP sees it (tensor or expert parallelism)."""
    mesh: MeshInfo
    placements: Tuple[Placement, ...]
    path: Optional[str] = None            # the parallelize_module / distribute_tensor call that made it
    line: int = 0
    style: Optional[str] = None           # "ColwiseParallel", ...

    def local_shape(self, shape: Sequence[int], rank: int) -> Tuple[int, ...]:
        """The DTensor's local shape on global rank `rank`."""
        return dtensor_local_shape(shape, self.placements, self.mesh, rank)

    def num_shards(self, dim: int) -> int:
        n = 1
        for p, d in zip(self.placements, self.mesh.dims):
            if p[0] in ("S", "SS") and p[1] == dim:
                n *= d.size
        return n


@dataclass
class MeshProblem:
    """A mesh layout torch rejects (its message, obtained from torch while the file was replayed)."""
    kind: str                 # "tp-mesh" | "mesh-ndim" | "reshard-int" | "reshard-int-dtensor" | "world-size"
    path: str
    line: int
    col: int
    message: str              # torch's own message
    module: str = ""
    detail: str = ""
    summary: str = ""         # the detail without the names from the linted code (a short message)


@dataclass
class Unsupported:
    """A plan element fsdp-lint does not model: said, never silently ignored."""
    what: str
    path: str
    line: int
    detail: str
    # the rest of the plan depends on it (it would be scaled wrongly without it): refused even with
    # --allow-partial, which may only leave out what it names
    blocks_partial: bool = False

    def to_json(self, display) -> dict:
        return {"what": self.what, "path": display(self.path) if self.path else None, "line": self.line or None,
                "detail": self.detail}


def placement_str(p: Placement) -> str:
    """As torch prints it: ``Shard(dim=0)``, ``Replicate()``, ``Partial(sum)``, ``_StridedShard(dim=0, sf=2)``."""
    if p[0] == "S":
        return f"Shard(dim={p[1]})"
    if p[0] == "SS":
        return f"_StridedShard(dim={p[1]}, sf={p[2]})"
    if p[0] == "P":
        return f"Partial({p[1] if len(p) > 1 else 'sum'})"
    return "Replicate()"


def chunk_size(n: int, k: int, i: int) -> int:
    """Elements of chunk `i` when `n` is split in `k` as ``torch.chunk`` (and DTensor's Shard) splits."""
    if k <= 1:
        return n
    rows = ceil_div(n, k) if n else 0
    return max(0, min(rows, n - i * rows)) if rows else 0


def dtensor_local_shape(shape: Sequence[int], placements: Sequence[Placement], mesh: MeshInfo,
                        rank: int) -> Tuple[int, ...]:
    local = list(shape)
    for p, d in zip(placements, mesh.dims):
        if p[0] == "S" and local:
            dim = p[1] % len(local)
            local[dim] = chunk_size(local[dim], d.size, d.coordinate(rank))
    return tuple(local)


def radix_of(ranks: Sequence[int]) -> Optional[Tuple[Tuple[int, int], ...]]:
    """The mixed-radix digits (outermost first) that map a coordinate to the ranks of a group that
    contains rank 0 at coordinate 0 (``[0, 2, 4, 6]`` -> ``((4, 2),)``; ``[0, 1, 4, 5]`` ->
    ``((2, 4), (2, 1))``); None for a layout that is not such a product (a custom group)."""
    ranks = list(ranks)
    n = len(ranks)
    if n == 0 or ranks[0] != 0:
        return None
    if n == 1:
        return ((1, 1),)
    digits: List[Tuple[int, int]] = []      # innermost first
    block = 1
    while block < n:
        stride = ranks[block]
        size = 1
        while block * size < n and ranks[block * size] == size * stride:
            size += 1
        if size == 1 or n % (block * size):
            return None
        digits.append((size, stride))
        block *= size
    out = tuple(reversed(digits))
    probe = MeshDim(None, n, out)
    if any(probe.coordinate(r) != i for i, r in enumerate(ranks)):
        return None
    return out


def row_major_dims(shape: Sequence[int], names: Optional[Sequence[Optional[str]]] = None) -> List[MeshDim]:
    """The dimensions of a mesh laid out row-major over ranks 0 .. prod(shape)-1."""
    dims = []
    stride = 1
    for size in reversed(list(shape)):
        dims.append((size, stride))
        stride *= size
    dims.reverse()
    names = list(names) if names else [None] * len(dims)
    return [MeshDim(n, s, ((s, st),)) for n, (s, st) in zip(names, dims)]


def world_dim(ws: int, name: Optional[str] = None) -> MeshDim:
    return MeshDim(name, ws, ((ws, 1),))


@dataclass
class TPStyle:
    """One ParallelStyle applied to one module by ``parallelize_module``."""
    module: str                     # FQN
    style: str                      # class name (``ColwiseParallel``; a subclass of a known style: its base's)
    known: str                      # the torch style it behaves as, or "" when fsdp-lint does not know it
    mesh: MeshInfo
    path: str
    line: int
    input_layouts: Tuple = ()       # placements (or None) per input
    output_layouts: Tuple = ()
    desired_input_layouts: Tuple = ()
    use_local_output: bool = True
    module_cls: str = ""
    in_features: Optional[int] = None
    out_features: Optional[int] = None
    param_numels: List[Tuple[str, int, str]] = field(default_factory=list)   # (fqn, numel, dtype)
