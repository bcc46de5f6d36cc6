"""The script's own ``init_process_group``: a no-op in a recorded replay, answering ``is_initialized()`` as a node
does (False until the script, or its framework, initialised the world), and the world a plain `python` process
gives itself (``world_size=``, or the ``WORLD_SIZE`` it sets for ``env://``)."""
from __future__ import annotations

import os


def initialised_by_the_script(dist, world_size: int):
    """``init_process_group`` (a no-op) and ``is_initialized`` as a node answers them: False until the
    script (or its framework) initialised the world, or a mesh or the default group made the fake one
    (``if not dist.is_initialized(): return 1`` before the init is a world of 1 on a node too)."""
    from torch.distributed import distributed_c10d as c10d

    done = []

    def init_process_group(*args, **kwargs):
        _own_world(kwargs, world_size)
        done.append(True)

    def is_initialized():
        return bool(done) or c10d.is_initialized()
    return init_process_group, is_initialized


def _own_world(kwargs, world_size: int) -> None:
    """A plain `python` process (no launcher) that gives ``init_process_group`` its own world -- ``world_size=``,
    or the ``WORLD_SIZE`` it set in its environment for ``env://`` (a one-GPU run's own rendezvous values) --
    runs on that world: the replay runs again on it, when nothing else gave the world size."""
    from fsdp_lint.replay.frameworks import current_options
    from fsdp_lint.replay.records import WorldSizeFromScript

    options = current_options()
    if not (options.launch_plain and options.script_world):
        return
    given = kwargs.get("world_size")
    if given is None and kwargs.get("init_method") in (None, "env://") and kwargs.get("store") is None:
        given = os.environ.get("WORLD_SIZE")
    try:
        size = int(given) if given is not None else None
    except (TypeError, ValueError):
        return
    if size and size > 0 and size != world_size:
        raise WorldSizeFromScript(size, f"init_process_group (world {size}, from the rendezvous values it sets itself)")
