"""The simulated Ray cluster's state (what ``ray.init`` made, the actors running) and its object refs: a task runs
when it is called, its result or error held for ``ray.get``."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

SIMULATED_RAY_VERSION = "2.49.0"
NODE_ID = "0" * 55 + "1"
NODE_IP = "127.0.0.1"
UNSIMULATED = ("is not part of the Ray cluster fsdp-lint simulates in the replay's process (a node runs it in Ray's own "
               "processes)")


class _Cluster:
    """What ``ray.init`` made: the node's resources, the job's ``runtime_env``, named actors."""

    def __init__(self, gpus: int):
        self.node_gpus = gpus
        self.initialized = False
        self.resources: Dict[str, float] = {}
        self.env_vars: Dict[str, str] = {}
        self.named: Dict[str, Any] = {}                 # name -> the actor's handle (`ray.get_actor`)
        self.firsts: Dict[type, Any] = {}               # class -> the actor replayed for it (actors._Actor)
        self.current: List[Any] = []                    # the actors whose code is running (innermost last)

    def init(self, num_cpus=None, num_gpus=None, runtime_env=None, **_):
        if not self.initialized:
            gpus = self.node_gpus if num_gpus is None else num_gpus
            cpus = num_cpus if num_cpus is not None else max(os.cpu_count() or 1, 8 * max(int(gpus), 1))
            self.resources = {"CPU": float(cpus), "GPU": float(gpus), "memory": float(1 << 40),
                              "object_store_memory": float(1 << 37), f"node:{NODE_IP}": 1.0}
            self.env_vars = {str(k): str(v) for k, v in dict((runtime_env or {}).get("env_vars") or {}).items()}
            self.initialized = True

    def ensure(self):
        if not self.initialized:
            self.init()           # Ray starts a local cluster on the first use, as here


_CLUSTER: List[_Cluster] = []


def _cluster() -> _Cluster:
    if not _CLUSTER:
        _CLUSTER.append(_Cluster(8))
    return _CLUSTER[-1]



# ----------------------------------------------------------------------------------------------------------
# objects
# ----------------------------------------------------------------------------------------------------------
class ObjectRef:
    """A task's result (or the error it raised, raised again by ``ray.get``), there at once."""

    def __init__(self, value: Any = None, error: Optional[BaseException] = None):
        self._value, self._error = value, error

    def _resolve(self):
        if self._error is not None:
            raise self._error
        return self._value

    def __await__(self):
        async def resolved():
            return self._resolve()
        return resolved().__await__()

    def future(self):
        import concurrent.futures

        fut = concurrent.futures.Future()
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._value)
        return fut

    def hex(self) -> str:
        return format(id(self), "x").rjust(56, "0")

    def __repr__(self):
        return f"ObjectRef({self.hex()})"


def _resolved(value):
    """A task's arguments as Ray passes them: a top-level ``ObjectRef`` is its value."""
    return value._resolve() if isinstance(value, ObjectRef) else value


def _run(call: Callable[[], Any]) -> ObjectRef:
    from fsdp_lint.replay.records import ReplayError

    try:
        value = call()
        if _is_coroutine(value):
            value = _run_coroutine(value)
        return ObjectRef(value)
    except ReplayError:
        raise                 # the replay's own signals (the world the actor gives itself) are not the task's
    except Exception as exc:  # noqa: BLE001  the task failed: `ray.get` raises it, as Ray does
        return ObjectRef(error=exc)


def raised_in_a_task(exc: BaseException) -> Optional[str]:
    """`` (raised in a Ray actor or task, at rlkit/workers/fsdp_worker.py:21)``: the innermost project line of a
    failure a task or actor raised -- the driver's ``ray.get`` is only where it came back -- else None."""
    from fsdp_lint.entry.project import is_local

    tb, inside, last = exc.__traceback__, False, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code is _run.__code__:
            inside, last = True, None
        elif inside and is_local(code.co_filename):
            last = (code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if last is None:
        return None
    shown = os.path.relpath(last[0]) if not os.path.relpath(last[0]).startswith("..") else last[0]
    return f" (raised in a Ray actor or task, at {shown}:{last[1]})"


def _is_coroutine(value) -> bool:
    import inspect

    return inspect.iscoroutine(value)


def _run_coroutine(coro):
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()
    import concurrent.futures     # called from async code: the actor's own event loop is another thread

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_run_coroutine, coro).result()


def _split(ref: ObjectRef, num_returns) -> Any:
    if not isinstance(num_returns, int) or num_returns == 1:
        return ref
    if ref._error is not None:
        return [ObjectRef(error=ref._error) for _ in range(num_returns)]
    return [ObjectRef(v) for v in ref._value]

