"""The ``ray`` modules of the simulated cluster, put in place of any real Ray for the replay (`install`); another
``ray.*`` module cannot be imported and says why."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, Dict

from fsdp_lint.replay.ray_node import api, cli, train
from fsdp_lint.replay.ray_node.actors import ActorClass, ActorHandle, ActorMethod, RemoteFunction, method, remote
from fsdp_lint.replay.ray_node.cluster import _CLUSTER, ObjectRef, SIMULATED_RAY_VERSION, UNSIMULATED, _Cluster


def _modules(version: str) -> Dict[str, Dict[str, Any]]:
    util_pg = {"PlacementGroup": api.PlacementGroup, "placement_group": api.placement_group,
               "remove_placement_group": api.remove_placement_group, "get_placement_group": api.get_placement_group,
               "get_current_placement_group": api.get_current_placement_group,
               "placement_group_table": api.placement_group_table}
    strategies = {"PlacementGroupSchedulingStrategy": api.PlacementGroupSchedulingStrategy,
                  "NodeAffinitySchedulingStrategy": api.NodeAffinitySchedulingStrategy,
                  "NodeLabelSchedulingStrategy": api.NodeLabelSchedulingStrategy}
    state = {"available_resources_per_node": api.available_resources_per_node,
             "state": types.SimpleNamespace(placement_group_table=api.placement_group_table,
                                            available_resources_per_node=api.available_resources_per_node)}
    top = {name: getattr(api, name) for name in (
        "init", "is_initialized", "shutdown", "get", "put", "wait", "kill", "cancel", "get_actor", "nodes",
        "cluster_resources", "available_resources", "get_gpu_ids", "timeline", "get_runtime_context")}
    top.update({"remote": remote, "method": method, "ObjectRef": ObjectRef, "__version__": version,
                "SCRIPT_MODE": api.SCRIPT_MODE, "WORKER_MODE": api.WORKER_MODE, "LOCAL_MODE": api.LOCAL_MODE})
    return {
        "ray": top,
        "ray.actor": {"ActorHandle": ActorHandle, "ActorClass": ActorClass, "ActorMethod": ActorMethod,
                      "exit_actor": api.exit_actor},
        "ray.remote_function": {"RemoteFunction": RemoteFunction},
        "ray.exceptions": api.exceptions(),
        "ray.runtime_context": {"RuntimeContext": api.RuntimeContext, "get_runtime_context": api.get_runtime_context},
        "ray.util": {**util_pg, "get_node_ip_address": api.get_node_ip_address,
                     "list_named_actors": api.list_named_actors},
        "ray.util.placement_group": util_pg,
        "ray.util.scheduling_strategies": strategies,
        "ray.util.state": {"list_actors": lambda *a, **k: [], "get_actor": lambda *a, **k: None},
        "ray.experimental": {},
        "ray.experimental.state": {},
        "ray.experimental.state.api": {"list_actors": lambda *a, **k: [], "get_actor": lambda *a, **k: None},
        "ray._private": {},
        "ray._private.state": state,
        "ray._private.services": {"get_node_ip_address": api.get_node_ip_address},
        "ray._private.runtime_env": {},
        "ray._private.runtime_env.constants": {"RAY_JOB_CONFIG_JSON_ENV_VAR": "RAY_JOB_CONFIG_JSON_ENV_VAR"},
        "ray.cloudpickle": _cloudpickle(),
        **train.namespaces(),
    }


def _cloudpickle() -> Dict[str, Any]:
    try:
        import cloudpickle as pickler
    except ImportError:
        import pickle as pickler
    return {"dumps": pickler.dumps, "loads": pickler.loads, "dump": pickler.dump, "load": pickler.load}


def _module(name: str, namespace: Dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name, f"The simulated node's Ray ({name}), in fsdp-lint's replay.")
    module.__dict__.update(namespace)
    module.__path__ = []                  # every simulated module is a package: `import ray.X` asks the finder
    module.__spec__ = importlib.machinery.ModuleSpec(name, _Finder, is_package=True)
    module.__file__ = f"<fsdp-lint simulated {name}>"
    module.__fsdp_lint_simulated__ = True     # (never kept past a replay: `fsdp_lint.record` keeps what a block imports)

    def __getattr__(item):
        if item.startswith("__"):
            raise AttributeError(item)
        raise AttributeError(f"module '{name}' has no attribute '{item}' (`{name}.{item}` {UNSIMULATED})")
    module.__getattr__ = __getattr__
    return module


class _Finder(importlib.abc.MetaPathFinder):
    """``ray`` and ``ray.*`` are the simulated modules; another ``ray.*`` cannot be imported, and says why."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "ray" or fullname.startswith("ray."):
            raise ModuleNotFoundError(f"No module named '{fullname}': `{fullname}` {UNSIMULATED}", name=fullname)
        return None


def node_has_ray(entry_path: str) -> bool:
    """Whether the simulated node has Ray: it is installed here, or the repository requires it (not as an extra
    only -- a project that probes for Ray, `is_ray_available()`, and goes on without it, goes on here too)."""
    from importlib import metadata

    from fsdp_lint.replay.requirements import requires, set_project

    set_project(entry_path)
    try:
        metadata.distribution("ray")
        return True
    except metadata.PackageNotFoundError:
        return requires("ray")


def install(node_gpus: int) -> Callable[[], None]:
    """Put the simulated Ray in place of any real one for the replay; the returned function puts back what was."""
    version = SIMULATED_RAY_VERSION
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("ray")
    except Exception:  # noqa: BLE001  not installed: the API level simulated
        pass
    saved = {k: v for k, v in sys.modules.items() if k == "ray" or k.startswith("ray.")}
    for k in saved:
        del sys.modules[k]
    modules = {name: _module(name, ns) for name, ns in _modules(version).items()}
    for name, module in modules.items():
        parent, _, child = name.rpartition(".")
        if parent and not hasattr(modules[parent], child):     # (`ray.util.placement_group` is the function, as
            setattr(modules[parent], child, module)              # ray.util imports it over its submodule)
    sys.modules.update(modules)
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    _CLUSTER.append(_Cluster(node_gpus))
    remove_command = cli.install(node_gpus, version)        # `ray start` / `ray status` in a subprocess

    def uninstall():
        remove_command()
        _CLUSTER.pop()
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "ray" or k.startswith("ray.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return uninstall
