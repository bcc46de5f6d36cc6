"""The tensor-parallel collectives of one training step, from the ParallelStyles the file applies.

Each style redistributes activations at its module's boundary (DTensor ``redistribute``) and, in
backward, their gradients the other way; ``SequenceParallel`` parameters (replicated norm weights used
on sequence shards) get partial gradients that are all-reduced. Per style, with its input/output
layouts (torch's defaults unless the file sets them):

* ``ColwiseParallel``: forward, an input ``Shard`` -> ``Replicate`` is all-gathered and an output
  -> ``Replicate`` too (its features padded to a multiple of the group); backward, the input gradient
  is reduce-scattered back to ``Shard``, or all-reduced for a ``Replicate`` input -- not when the
  input is already a DTensor (a parent's ``PrepareModuleInput`` reduces it once for all its layers);
* ``RowwiseParallel``: forward, the ``Partial`` output is all-reduced to ``Replicate`` or
  reduce-scattered to ``Shard``; backward, a ``Shard`` output's gradient is all-gathered, and so is a
  Linear's ``Replicate`` input's;
* ``SequenceParallel``: backward, one all-reduce per trainable parameter;
* ``PrepareModuleInput``: ``Shard`` -> ``Replicate`` is an all-gather forward and a reduce-scatter
  backward (DTensor inputs); ``Replicate`` -> ``Shard`` an all-gather backward.

Activation collectives move ``tokens x elements_per_token`` elements (tokens: batch x sequence, what the
training loop feeds); parameter all-reduces move ``numel``. The tests check counts, group sizes and
sizes against the collectives torch issues in a real forward + backward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from fsdp_lint.model.mesh import TPStyle


@dataclass
class TPCollective:
    module: str
    style: str
    kind: str                   # "all_gather" | "reduce_scatter" | "all_reduce" | "all_to_all"
    phase: str                  # "forward" | "backward"
    mesh_dim: str               # the mesh dimension it runs over ("tp")
    group_size: int
    what: str                   # "input", "output", "input gradient", "output gradient", "weight gradient"
    elements_per_token: Optional[int] = None   # activations: elements of the unsharded tensor per token
    numel: Optional[int] = None                # parameters: elements of the gradient
    path: str = ""
    line: int = 0


def _is_shard(p) -> bool:
    return p is not None and p[0] in ("S", "SS")


def _is_replicate(p) -> bool:
    return p is not None and p[0] == "R"


def _redistribute(src, dst) -> List[tuple]:
    """(forward kind, backward kind) of redistributing an activation from `src` to `dst`."""
    if src is None or dst is None or src == dst:
        return []
    if _is_shard(src) and _is_replicate(dst):
        return [("all_gather", "forward"), ("reduce_scatter", "backward")]
    if _is_replicate(src) and _is_shard(dst):
        return [("all_gather", "backward")]
    if _is_shard(src) and _is_shard(dst):
        return [("all_to_all", "forward"), ("all_to_all", "backward")]
    if src[0] == "P" and _is_replicate(dst):
        return [("all_reduce", "forward")]
    if src[0] == "P" and _is_shard(dst):
        return [("reduce_scatter", "forward"), ("all_gather", "backward")]
    return []


def _first_linear_in(styles_by_module: Dict[str, TPStyle], module: str) -> Optional[int]:
    """The hidden size entering `module`: the in_features of the first Linear styled below it."""
    for fqn, st in styles_by_module.items():
        if fqn.startswith(module + ".") and st.module_cls == "Linear" and st.in_features:
            return st.in_features
    return None


def tp_collectives(styles: List[TPStyle]) -> List[TPCollective]:
    out: List[TPCollective] = []
    by_module = {s.module: s for s in styles}
    # modules whose inputs arrive as DTensors: below a PrepareModuleInput that keeps DTensors
    dtensor_inputs = [s.module for s in styles if s.known in ("PrepareModuleInput", "PrepareModuleInputOutput")
                      and not s.use_local_output]

    def add(st: TPStyle, kind: str, phase: str, what: str, per_token=None, numel=None) -> None:
        dim = st.mesh.dims[0] if st.mesh.dims else None
        out.append(TPCollective(st.module, st.style, kind, phase, (dim.name if dim else None) or "tp",
                                dim.size if dim else 1, what, per_token, numel, st.path, st.line))

    for st in styles:
        if st.mesh.size <= 1:
            continue
        inp = st.input_layouts[0] if st.input_layouts else None
        outp = st.output_layouts[0] if st.output_layouts else None
        linear = st.module_cls == "Linear" or (st.in_features is not None and st.module_cls != "Embedding")
        in_f = st.in_features if linear else None
        out_f = st.out_features
        if st.known == "ColwiseParallel":
            if linear:
                if _is_shard(inp):
                    add(st, "all_gather", "forward", "input", in_f)
                    add(st, "reduce_scatter", "backward", "input gradient", in_f)
                elif _is_replicate(inp) and not any(st.module.startswith(m + ".") for m in dtensor_inputs):
                    add(st, "all_reduce", "backward", "input gradient", in_f)
            elif _is_shard(inp):
                add(st, "all_gather", "forward", "input", 1)
            # the local output is sharded on its features; its gradient comes back replicated (a local
            # chunk in backward), so only the forward gathers -- padded to a multiple of the group
            if _is_replicate(outp):
                tp = st.mesh.dims[0].size if st.mesh.dims else 1
                add(st, "all_gather", "forward", "output", -(-out_f // tp) * tp if out_f else None)
            elif _is_shard(outp) and outp[1] != -1:
                add(st, "all_to_all", "forward", "output", out_f)
                add(st, "all_to_all", "backward", "output gradient", out_f)
        elif st.known == "RowwiseParallel":
            if linear and _is_replicate(inp):
                add(st, "all_gather", "backward", "input gradient", in_f)
            elif linear and _is_shard(inp) and inp[1] not in (-1,):
                add(st, "all_to_all", "forward", "input", in_f)
                add(st, "all_to_all", "backward", "input gradient", in_f)
            for kind, phase in _redistribute(("P",), outp):
                add(st, kind, phase, "output" if phase == "forward" else "output gradient", out_f)
        elif st.known == "SequenceParallel":
            for fqn, numel, _dtype in st.param_numels:
                add(st, "all_reduce", "backward", "weight gradient", numel=numel)
        elif st.known in ("PrepareModuleInput", "PrepareModuleInputOutput"):
            hidden = _first_linear_in(by_module, st.module)
            n_in = len(st.input_layouts)
            for src, dst in zip(st.input_layouts, st.desired_input_layouts[:n_in]):
                for kind, phase in _redistribute(src, dst):
                    if phase == "backward" and kind == "reduce_scatter" and st.use_local_output:
                        continue   # local inputs: each consumer reduces its own gradient
                    add(st, kind, phase, "input" if phase == "forward" else "input gradient", hidden)
            if st.known == "PrepareModuleInputOutput":
                for src, dst in zip(st.output_layouts, st.desired_input_layouts[n_in:]):
                    for kind, phase in _redistribute(src, dst):
                        add(st, kind, phase, "output" if phase == "forward" else "output gradient", None)
        elif st.known == "PrepareModuleOutput":
            for src, dst in zip(st.output_layouts, st.desired_input_layouts):
                for kind, phase in _redistribute(src, dst):
                    add(st, kind, phase, "output" if phase == "forward" else "output gradient", None)
    return out


def summary(collectives: List[TPCollective]) -> Dict[str, Dict[str, int]]:
    """Per mesh dimension: collectives per step by kind."""
    out: Dict[str, Dict[str, int]] = {}
    for c in collectives:
        per = out.setdefault(c.mesh_dim, {})
        per[c.kind] = per.get(c.kind, 0) + 1
    return out
