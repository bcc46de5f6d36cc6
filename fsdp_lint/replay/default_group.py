"""The default process group a node has once the script initialised it.

In a recorded replay the process group is simulated function by function (``dist.get_rank()``,
``get_world_size()``, the collectives), and a real fake process group exists only once a mesh or a group is
made. Code that asks for the default group itself -- mmengine's ``get_rank()`` is ``dist.get_rank(
_get_default_group())``, others read ``dist.group.WORLD`` -- got ``Default process group has not been
initialized`` or None where a node has the world's group. Both are the fake process group of the world,
made when first asked for (`fsdp_lint.replay.parallel`'s, destroyed with it).
"""
from __future__ import annotations

import os
import sys


def default_group_on_demand(rec, patch, ensure_pg, c10d) -> None:
    real_default = c10d._get_default_group
    making = []         # (re-entered: making the group reads GroupMember.WORLD itself)

    def ensure() -> None:
        # asked by the script or a library, not by torch.distributed itself (its `is_initialized()` reads
        # GroupMember.WORLD; a real `init_process_group` bound before the replay checks it too)
        caller = sys._getframe(2).f_code.co_filename
        if making or f"{os.sep}torch{os.sep}distributed{os.sep}" in caller:
            return
        making.append(True)
        try:
            ensure_pg(rec.world_size)
        finally:
            making.clear()

    def default_group():
        ensure()
        return real_default()

    patch(c10d, "_get_default_group", default_group)
    meta = type(c10d.GroupMember)
    real_world = meta.__dict__.get("WORLD")
    if isinstance(real_world, property):
        def world(cls):
            ensure()
            return real_world.fget(cls)
        patch(meta, "WORLD", property(world, real_world.fset))
