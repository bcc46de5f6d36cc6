"""The rank side of `--simulate` (see `fsdp_lint.run.simulate`): rank 0 of the plan's world under the
fake process group and ``FakeTensorMode``, two steps watched by torch's memory tracker."""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
from typing import Any, Dict, Optional

def simulate_rank(spec: dict, rep, remaining) -> None:
    """Rank 0 of ``spec["world_size"]``: fake process group, fake tensors, the shared session."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fsdp_lint.run.session import Phases, build, run_steps, user_code_io

    ws = spec["world_size"]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(ws), "LOCAL_WORLD_SIZE": str(ws)})
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
    with contextlib.suppress(Exception):
        import torch._dynamo

        torch._dynamo.config.disable = True
    out: Dict[str, Any] = {"rank": 0, "error": None, "setup_error": None, "steps_done": 0,
                           "collectives": [], "notes": []}
    phase = Phases(rep)
    cpu = torch.device("cpu")
    try:
        with _meshes_outside_fake_mode(), _fake_safe_init(), FakeTensorMode(allow_non_fake_inputs=True):
            with user_code_io(spec["debug"]):
                model, optimizers, info, example_fn = build(spec, ws, cpu, phase, out, remaining)
            if model is not None:
                out.update(info)
                with user_code_io(spec["debug"]):
                    run_steps(spec, 0, cpu, model, optimizers, phase, out, example_fn, track_memory=True)
    finally:
        rep.result(out)


@contextlib.contextmanager
def _meshes_outside_fake_mode():
    """``init_device_mesh`` (the file's, or the one the replay makes for ``fully_shard``) builds
    its mesh with fake tensor mode suspended: a DeviceMesh holds real rank tensors."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as dm
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = dm.init_device_mesh

    def init_device_mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return original(*args, **kwargs)

    dm.init_device_mesh = init_device_mesh
    had = hasattr(dist, "init_device_mesh")
    previous: Optional[Any] = getattr(dist, "init_device_mesh", None)
    if had:
        dist.init_device_mesh = init_device_mesh
    # fully_shard(..., reshard_after_forward=<int>) builds the post-forward mesh (a DeviceMesh of a
    # view of the mesh's rank tensor) itself: under fake tensors its ranks could not be read
    post_forward = []
    for name in ("torch.distributed.fsdp._fully_shard._fsdp_init", "torch.distributed.fsdp._fully_shard._fully_shard"):
        try:
            mod = importlib.import_module(name)
        except ImportError:     # another torch's layout: its fully_shard is left as it is
            continue
        fn = getattr(mod, "_get_post_forward_mesh_info", None)
        if fn is not None:
            post_forward.append((mod, fn))
            mod._get_post_forward_mesh_info = _outside_fake_mode(fn)
    # slicing a mesh, flattening dimensions (torchtitan's `mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")`, then
    # `mesh["dp_shard_cp"]`) and building one directly index its rank tensor: outside fake mode too
    methods = [(name, dm.DeviceMesh.__dict__[name]) for name in ("__init__", "__getitem__", "_flatten", "_unflatten",
                                                                  "get_local_rank", "get_coordinate")
               if name in dm.DeviceMesh.__dict__]
    for name, fn in methods:
        setattr(dm.DeviceMesh, name, _outside_fake_mode(fn))
    try:
        yield
    finally:
        dm.init_device_mesh = original
        if had:
            dist.init_device_mesh = previous
        for mod, fn in post_forward:
            mod._get_post_forward_mesh_info = fn
        for name, fn in methods:
            setattr(dm.DeviceMesh, name, fn)


def _outside_fake_mode(fn):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    @functools.wraps(fn)
    def outside(*args, **kwargs):
        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    return outside


@contextlib.contextmanager
def _fake_safe_init():
    """Initialisers whose result depends on the values they draw (``trunc_normal_`` resamples until
    no value is outside its bounds: a data-dependent mask) cannot run on fake tensors, whose values
    do not exist; here they fill their tensor in place without reading it back -- nothing reads the
    values of a fake tensor either. Shapes, dtypes and storages stay what the model makes them."""
    import torch
    import torch.nn.init as init

    original = init.trunc_normal_

    def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
        with torch.no_grad():
            return tensor.uniform_(a, b)

    init.trunc_normal_ = trunc_normal_
    try:
        yield
    finally:
        init.trunc_normal_ = original
