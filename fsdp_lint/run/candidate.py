"""A ``--suggest`` candidate applied for real (``--simulate`` of the top candidates): its plan as
plain data (``files[].suggestions[].plan``) turned into torch's own calls on the model the file's
setup code built -- ``apply_activation_checkpointing`` with ``checkpoint_wrapper`` on the blocks it
checkpoints, then FSDP2 ``fully_shard`` (``mp_policy``, ``reshard_after_forward``, ``offload_policy``,
a 2-D mesh for HSDP) or FSDP1 ``FullyShardedDataParallel`` (``mixed_precision``,
``sharding_strategy``, ``cpu_offload``) on its units, children first, the root last."""
from __future__ import annotations

from typing import List, Tuple


def apply_candidate(cand: dict, model, ws: int, device):
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing, checkpoint_wrapper)

    # where each unit's module hangs (its parent and name), found before checkpoint_wrapper puts a
    # wrapper between a block and its parent: the unit then takes the wrapper, as torchtitan does
    slots: List[List[Tuple[object, str]]] = [[_slot(model, m) for m in mods] for mods in cand["units"]]
    if cand.get("checkpointed"):
        targets = {id(model.get_submodule(f)) for f in cand["checkpointed"]}
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: id(m) in targets)

    def current(slot):
        parent, name = slot
        return model if parent is None else getattr(parent, name)

    pd, rd = cand.get("param_dtype"), cand.get("reduce_dtype")
    if cand["api"] == "fsdp1":
        from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        kw = dict(device_id=device, use_orig_params=cand.get("use_orig_params", False),
                  sharding_strategy=ShardingStrategy[cand.get("sharding_strategy") or "FULL_SHARD"])
        if pd:
            kw["mixed_precision"] = MixedPrecision(param_dtype=getattr(torch, pd), reduce_dtype=getattr(torch, rd or pd))
        if cand.get("offload"):
            kw["cpu_offload"] = CPUOffload(offload_params=True)
        if cand.get("mesh"):
            from torch.distributed.device_mesh import init_device_mesh

            kw["device_mesh"] = init_device_mesh(device.type, tuple(cand["mesh"]))
        root = model
        for unit in slots:
            parent, name = unit[0]
            wrapped = FSDP(current(unit[0]), **kw)
            if parent is None:
                root = wrapped
            else:
                setattr(parent, name, wrapped)
        return root
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if cand.get("mesh"):
        mesh = init_device_mesh(device.type, tuple(cand["mesh"]), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (ws,))
    for unit, raf in zip(slots, cand["reshard_after_forward"]):
        kw = {"mesh": mesh}
        if pd:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, pd), reduce_dtype=getattr(torch, rd or pd))
        if raf is not None:
            kw["reshard_after_forward"] = raf
        if cand.get("offload"):
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        mods = [current(s) for s in unit]
        fully_shard(mods if len(mods) > 1 else mods[0], **kw)
    return model


def _slot(model, fqn: str):
    if not fqn:
        return (None, "")
    parent_fqn, _, name = fqn.rpartition(".")
    return (model.get_submodule(parent_fqn) if parent_fqn else model, name)
