"""The ``ray.*`` functions of the simulated cluster: init, get/put/wait, nodes and resources, placement groups,
scheduling strategies, the runtime context, Ray's exceptions."""
from __future__ import annotations

from typing import Any, Dict, Optional

from fsdp_lint.replay.ray_node.actors import ActorHandle, _Actor
from fsdp_lint.replay.ray_node.cluster import NODE_ID, NODE_IP, ObjectRef, _cluster


class _RayContext(dict):
    address_info = {"node_ip_address": NODE_IP, "address": f"{NODE_IP}:6379"}
    dashboard_url = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutdown()


def init(*args, **kwargs):
    _cluster().init(**kwargs)
    return _RayContext()


def is_initialized() -> bool:
    return _cluster().initialized


def shutdown(*_, **__):
    cluster = _cluster()
    cluster.initialized = False
    cluster.named.clear()


def get(refs, *, timeout=None):
    if isinstance(refs, (list, tuple)):
        return [get(r) for r in refs]
    if not isinstance(refs, ObjectRef):
        raise TypeError(f"Attempting to call `get` on the value {refs!r}, which is not an ray.ObjectRef.")
    return refs._resolve()


def put(value, **_):
    return ObjectRef(value)


def wait(refs, *, num_returns=1, timeout=None, fetch_local=True):
    refs = list(refs)
    return refs[:num_returns], refs[num_returns:]


def kill(*_, **__):
    return None


def cancel(*_, **__):
    return None


def get_actor(name, namespace=None):
    try:
        return _cluster().named[name]
    except KeyError:
        raise ValueError(f"Failed to look up actor with name '{name}'. This could because 1. You are trying to "
                         f"look up a named actor you didn't create. 2. The named actor died.") from None


def nodes():
    cluster = _cluster()
    cluster.ensure()
    return [{"NodeID": NODE_ID, "Alive": True, "NodeManagerAddress": NODE_IP, "NodeManagerHostname": "node-0",
             "NodeName": NODE_IP, "Resources": dict(cluster.resources), "Labels": {}}]


def cluster_resources():
    _cluster().ensure()
    return dict(_cluster().resources)


available_resources = cluster_resources


def get_gpu_ids():
    return [0] if _cluster().current else []


def timeline(*_, **__):
    return []


# the modes of Ray's worker (`ray._private.worker`): the driver's, an actor's or task's
SCRIPT_MODE, WORKER_MODE, LOCAL_MODE = 0, 1, 2


class RuntimeContext:
    namespace = "fsdp-lint"
    gcs_address = f"{NODE_IP}:6379"
    was_current_actor_reattached = False

    def _actor(self) -> Optional[_Actor]:
        current = _cluster().current
        return current[-1] if current and current[-1].cls is not type(None) else None

    def get_node_id(self):
        return NODE_ID

    def get_job_id(self):
        return "01000000"

    def get_worker_id(self):
        return "0" * 56

    def get_task_id(self):
        return "0" * 48

    def get_actor_id(self):
        return format(id(self._actor()), "x").rjust(32, "0") if self._actor() else None

    def get_actor_name(self):
        actor = self._actor()
        return actor.options.get("name") if actor else None

    def get_accelerator_ids(self):
        return {"GPU": ["0"] if _cluster().current else [], "neuron_cores": [], "TPU": []}

    def get_assigned_resources(self):
        actor = _cluster().current[-1] if _cluster().current else None
        return {"CPU": float(actor.options.get("num_cpus", 1)), "GPU": float(actor.options.get("num_gpus", 0))} \
            if actor else {}

    def get_runtime_env_string(self):
        return "{}"

    @property
    def runtime_env(self):
        return {}

    @property
    def worker(self):
        import types

        return types.SimpleNamespace(mode=WORKER_MODE if _cluster().current else SCRIPT_MODE,
                                     worker_id=self.get_worker_id(), node_ip_address=NODE_IP)

    @property
    def current_actor(self):
        actor = self._actor()
        return ActorHandle(actor) if actor else None


def get_runtime_context():
    return RuntimeContext()


class _ID(str):
    """A placement group's id (a dict key, ``.hex()``)."""

    def hex(self) -> str:
        return str(self)


class PlacementGroup:
    def __init__(self, bundles, strategy="PACK", name=""):
        self.bundle_specs, self.strategy, self.name = [dict(b) for b in bundles], strategy, name
        self.id = _ID(format(id(self), "x").rjust(36, "0"))

    @property
    def bundle_count(self):
        return len(self.bundle_specs)

    def ready(self):
        return ObjectRef(self)

    def wait(self, timeout_seconds=30):
        return True


def placement_group(bundles, strategy="PACK", name="", lifetime=None, **_):
    cluster = _cluster()
    cluster.ensure()
    asked = sum(float(b.get("GPU", 0)) for b in bundles)
    if asked > cluster.resources.get("GPU", 0):
        # Ray would wait for ever for GPUs the cluster does not have
        raise RuntimeError(f"placement group {name or ''} asks for {asked:g} GPUs; the simulated Ray cluster is one "
                           f"node of {cluster.resources.get('GPU', 0):g} (--gpus-per-node, or ray.init(num_gpus=)); "
                           f"on a node it would wait for ever".replace("group  asks", "group asks"))
    pg = PlacementGroup(bundles, strategy, name)
    pgs = cluster.__dict__.setdefault("placement_groups", {})
    pgs[name or id(pg)] = pg
    return pg


def remove_placement_group(*_):
    return None


def get_placement_group(name):
    pg = _cluster().__dict__.get("placement_groups", {}).get(name)
    if pg is None:
        raise ValueError(f"Failed to look up placement group with name: {name}")
    return pg


def get_current_placement_group():
    return None


def placement_group_table(pg=None):
    def table(one):
        return {"placement_group_id": one.id.hex(), "name": one.name, "strategy": one.strategy, "state": "CREATED",
                "bundles": dict(enumerate(one.bundle_specs)),
                "bundles_to_node_id": {i: NODE_ID for i in range(one.bundle_count)}}
    if pg is not None and not isinstance(pg, PlacementGroup):
        pg = next((p for p in _cluster().__dict__.get("placement_groups", {}).values() if p.id == pg), None)
    if pg is None:
        return {p.id.hex(): table(p) for p in _cluster().__dict__.get("placement_groups", {}).values()}
    return table(pg)


def available_resources_per_node():
    _cluster().ensure()
    return {NODE_ID: dict(_cluster().resources)}


def get_node_ip_address(*_):
    return NODE_IP


def list_named_actors(all_namespaces=False):
    names = list(_cluster().named)
    return [{"name": n, "namespace": "fsdp-lint"} for n in names] if all_namespaces else names


class PlacementGroupSchedulingStrategy:
    def __init__(self, placement_group, placement_group_bundle_index=-1, placement_group_capture_child_tasks=None):
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks


class NodeAffinitySchedulingStrategy:
    def __init__(self, node_id, soft, _spill_on_unavailable=False, _fail_on_unavailable=False):
        self.node_id, self.soft = node_id, soft


class NodeLabelSchedulingStrategy:
    def __init__(self, hard, *, soft=None):
        self.hard, self.soft = hard, soft


def exit_actor():
    raise SystemExit(0)


class RayError(Exception):
    pass


def exceptions() -> Dict[str, Any]:
    out: Dict[str, Any] = {"RayError": RayError}
    for name in ("RayTaskError", "RayActorError", "ActorDiedError", "GetTimeoutError", "ObjectLostError",
                 "TaskCancelledError", "WorkerCrashedError", "RaySystemError", "OutOfMemoryError",
                 "ActorUnavailableError", "PlacementGroupSchedulingError", "RuntimeEnvSetupError"):
        out[name] = type(name, (RayError,), {"__module__": "ray.exceptions"})
    return out

