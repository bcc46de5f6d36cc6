"""``dist.get_backend`` answers what each group was made with, as on a node: the world's backend
(``init_process_group``'s, NCCL where none was named, as on a GPU node) and a ``new_group(backend=
"gloo")``'s gloo -- vLLM-style group coordinators keep a CPU group beside each device group and assert
it is not NCCL before they use it for host-side exchanges."""
from __future__ import annotations

from typing import Any, Callable, Dict


def _asked(args, kwargs, at: int):
    """The backend a call named (`backend=` or the positional at index `at`), lower-case, or None."""
    value = kwargs.get("backend", args[at] if len(args) > at else None)
    return str(value).lower() if value else None


def install(patch, dist) -> Callable[[Any, tuple, dict], None]:
    """Patch ``init_process_group`` (to remember the world's backend) and ``get_backend``; returns the
    function ``new_group`` calls with each group it made and its arguments."""
    made_with: Dict[int, str] = {}
    world = ["nccl"]
    sandbox_init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        world[0] = _asked(args, kwargs, 0) or world[0]
        return sandbox_init(*args, **kwargs)

    def get_backend(group=None):
        return made_with.get(id(group), world[0]) if group is not None else world[0]

    def record(group, args: tuple, kwargs: dict) -> None:
        made_with[id(group)] = _asked(args, kwargs, 1) or world[0]     # new_group(ranks, timeout, backend, ...)

    patch(dist, "init_process_group", init_process_group)
    patch(dist, "get_backend", get_backend)
    return record
