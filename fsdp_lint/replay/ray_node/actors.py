"""Remote functions and actors as the simulated Ray runs them: in this process, each actor with its own environment;
the first actor of a class replayed, the others answering as it did."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

from fsdp_lint.replay.ray_node.cluster import ObjectRef, _cluster, _resolved, _run, _split


def _actor_env(options: Dict[str, Any], gpus) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(_cluster().env_vars)
    env.update({str(k): str(v) for k, v in dict((options.get("runtime_env") or {}).get("env_vars") or {}).items()})
    if gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    return env


class _Actor:
    """One actor's process as the replay has it: its instance (None for the actors not replayed), its
    environment between calls, and the answers the replayed actor gave (for the others)."""

    def __init__(self, cls: type, options: Dict[str, Any]):
        self.cls, self.options = cls, options
        self.env = _actor_env(options, options.get("num_gpus", 0))
        self.instance = None
        self.answers: Dict[str, List[ObjectRef]] = {}
        self.calls: Dict[str, int] = {}
        self.first: Optional[_Actor] = None

    def run(self, call: Callable[[], Any]) -> ObjectRef:
        driver = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)
        cluster = _cluster()
        cluster.current.append(self)
        try:
            return _run(call)
        finally:
            cluster.current.pop()
            self.env = dict(os.environ)
            os.environ.clear()
            os.environ.update(driver)


class ActorMethod:
    def __init__(self, handle: "ActorHandle", name: str, num_returns=None):
        self._handle, self._name, self._num_returns = handle, name, num_returns

    def remote(self, *args, **kwargs):
        ref = self._handle._ray_call(self._name, args, kwargs)
        returns = self._num_returns or getattr(getattr(self._handle._ray_actor.cls, self._name, None),
                                                "__ray_num_returns__", 1)
        return _split(ref, returns)

    def options(self, num_returns=None, **_):
        return ActorMethod(self._handle, self._name, num_returns)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running 'object.{self._name}()', "
                        f"try 'object.{self._name}.remote()'.")


class ActorHandle:
    def __init__(self, actor: _Actor):
        object.__setattr__(self, "_ray_actor", actor)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if not callable(getattr(self._ray_actor.cls, name, None)):
            raise AttributeError(f"'ActorHandle' object has no attribute '{name}'")
        return ActorMethod(self, name)

    def _ray_call(self, name: str, args, kwargs) -> ObjectRef:
        actor = self._ray_actor
        if actor.first is not None:       # an actor the replay does not run answers as the replayed one did
            seen = actor.first.answers.get(name) or [ObjectRef(None)]
            index = actor.calls.get(name, 0)
            actor.calls[name] = index + 1
            return seen[min(index, len(seen) - 1)]
        args = tuple(_resolved(a) for a in args)
        kwargs = {k: _resolved(v) for k, v in kwargs.items()}
        ref = actor.run(lambda: getattr(actor.instance, name)(*args, **kwargs))
        actor.answers.setdefault(name, []).append(ref)
        return ref

    def __repr__(self):
        return f"Actor({self._ray_actor.cls.__name__}, {id(self):x})"

    def __reduce__(self):
        return (_same, (self,))


def _same(handle):
    return handle


class ActorClass:
    """``ray.remote(cls)``, as Ray makes it: an instance of ``ActorClass(Name)``, a class derived from this one
    and from `cls` (frameworks read the name, and the methods off it: ``dir(actor_class)``), never initialised."""

    @classmethod
    def _ray_from(cls, user_class: type, options: Dict[str, Any]) -> "ActorClass":
        derived = type(f"ActorClass({user_class.__name__})", (cls, user_class), {"__module__": user_class.__module__})
        self = derived.__new__(derived)
        self.__dict__.update({"__ray_actor_class__": user_class, "_default_options": options})
        return self

    def options(self, **options):
        return ActorClass._ray_from(self.__ray_actor_class__, {**self._default_options, **options})

    def remote(self, *args, **kwargs) -> ActorHandle:
        cluster = _cluster()
        cluster.ensure()
        cls, options = self.__ray_actor_class__, self._default_options
        name = options.get("name")
        if name and options.get("get_if_exists") and name in cluster.named:
            return cluster.named[name]
        actor = _Actor(cls, options)
        first = cluster.firsts.get(cls)
        if first is None:
            cluster.firsts[cls] = actor
            args = tuple(_resolved(a) for a in args)
            kwargs = {k: _resolved(v) for k, v in kwargs.items()}

            def construct():
                actor.instance = cls(*args, **kwargs)
            actor.run(construct)._resolve()     # a constructor that fails fails here (Ray: at the first call)
        else:
            actor.first = first
        handle = ActorHandle(actor)
        if name:
            cluster.named[name] = handle
        return handle

    def __call__(self, *args, **kwargs):
        name = self.__ray_actor_class__.__name__
        raise TypeError(f"Actors cannot be instantiated directly. Instead of '{name}()', use '{name}.remote()'.")


class RemoteFunction:
    def __init__(self, function: Callable, options: Dict[str, Any]):
        self._function, self._default_options = function, options
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(self, attr, getattr(function, attr, None))

    def options(self, **options):
        return RemoteFunction(self._function, {**self._default_options, **options})

    def remote(self, *args, **kwargs):
        _cluster().ensure()
        args = tuple(_resolved(a) for a in args)
        kwargs = {k: _resolved(v) for k, v in kwargs.items()}
        task = _Actor(type(None), self._default_options)    # a task's worker process: the same environment
        ref = task.run(lambda: self._function(*args, **kwargs))
        return _split(ref, self._default_options.get("num_returns", 1))

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{self.__module__}.{self.__name__}()', try '{self.__module__}.{self.__name__}.remote()'.")


def remote(*args, **options):
    def make(target):
        if isinstance(target, type):
            return ActorClass._ray_from(target, options)
        return RemoteFunction(target, options)
    if len(args) == 1 and not options and callable(args[0]):
        return make(args[0])
    return make


def method(*args, num_returns=None, **_):
    def mark(fn):
        if num_returns is not None:
            fn.__ray_num_returns__ = num_returns
        return fn
    return mark(args[0]) if len(args) == 1 and callable(args[0]) else mark

