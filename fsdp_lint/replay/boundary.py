"""The training boundary, detected while the setup code runs.

Training starts -- and the replay stops, raising `TrainingBoundary` -- at the first of:

* the forward of a module that was wrapped (``fully_shard``/``FullyShardedDataParallel``), or of a
  module whose parameters an optimizer holds;
* ``Tensor.backward()`` / ``torch.autograd.backward``;
* an optimizer's ``step()``;
* the first batch drawn from a ``torch.utils.data.DataLoader`` once a model exists (``iter(loader)`` alone
  draws nothing; before a model exists, a look at the data during set-up runs in this process).

(Frameworks' fit/train calls are driven up to their first step by the framework drivers; the
static second line -- training loops found in the code -- is in ``transform``.)
"""
from __future__ import annotations

from typing import Any, Callable, List

from fsdp_lint.replay.records import TrainingBoundary


def install_boundaries(rec, patch: Callable[[Any, str, Any], None]) -> List[Any]:
    """Install the boundary hooks; returns handles to remove when the replay ends."""
    import torch
    import torch.nn as nn
    import torch.utils.data

    def stop(reason: str):
        pos = rec.position()
        rec.stopped = (reason, pos)
        raise TrainingBoundary(reason)

    def on_forward(module, args):
        if rec.stopped is not None and not rec.real:
            raise TrainingBoundary(rec.stopped[0])
        if id(module) in rec.wrapped_ids:
            stop(f"the first forward of the wrapped {_user_class(module)}")
        if rec.optimizer_param_ids and not type(module).__module__.startswith("torch.nn.utils.parametriz"):
            # (a parametrized weight computed -- `orthogonal`'s, read by a state_dict -- is no forward of the model)
            p = next(iter(module._parameters.values()), None) if module._parameters else None
            if p is not None and id(p) in rec.optimizer_param_ids:
                stop(f"the first forward of {_user_class(module)}, whose parameters an optimizer holds")
        return None

    handles = [nn.modules.module.register_module_forward_pre_hook(on_forward)]

    def backward(*args, **kwargs):
        stop("backward()")

    patch(torch.Tensor, "backward", backward)
    patch(torch.autograd, "backward", backward)

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def on_step(optimizer, args, kwargs):
        stop(f"{type(optimizer).__name__}.step()")

    handles.append(register_optimizer_step_pre_hook(on_step))

    loader_class = torch.utils.data.DataLoader
    real_iter = loader_class.__iter__

    def with_boundary(own_iter):
        def loader_iter(self):
            if not rec.real and not _a_model_exists(rec):
                # nothing to train yet: a look at the data during set-up (`_print_batch(train_loader)` before the
                # model is built), in this process (no worker processes), as the loader would give it
                try:
                    single = _in_process(self)
                except Exception:  # noqa: BLE001 - a loader that cannot be rebuilt so: the boundary, as before
                    single = None
                if single is not None:
                    return real_iter(single)
            return _FirstBatchStops(stop)     # `self.iterator = iter(loader)` in a constructor draws nothing yet
        loader_iter.__wrapped__ = own_iter
        return loader_iter

    def own_iter_too(cls):
        # a loader class with its own `__iter__` (torchdata's StatefulDataLoader, verl's): the same boundary, before
        # its worker processes start on data the node has and this machine has not
        if "__iter__" in cls.__dict__ and not hasattr(cls.__dict__["__iter__"], "__wrapped__"):
            patch(cls, "__iter__", with_boundary(cls.__dict__["__iter__"]))

    patch(loader_class, "__iter__", with_boundary(real_iter))
    todo = list(loader_class.__subclasses__())
    while todo:
        cls = todo.pop()
        own_iter_too(cls)
        todo += cls.__subclasses__()
    real_init_subclass = loader_class.__dict__.get("__init_subclass__")

    def init_subclass(cls, **kwargs):
        super(loader_class, cls).__init_subclass__(**kwargs)
        own_iter_too(cls)

    patch(loader_class, "__init_subclass__", classmethod(init_subclass) if real_init_subclass is None else
          real_init_subclass)
    return handles


class _FirstBatchStops:
    """A loader's iterator once a model exists: training starts with the first batch drawn (``next``), not
    with ``iter(loader)`` (a prefetching wrapper's constructor makes its iterator while the setup goes on)."""

    def __init__(self, stop):
        self._stop = stop

    def __iter__(self):
        return self

    def __next__(self):
        self._stop("iteration over a DataLoader")


def _a_model_exists(rec) -> bool:
    """A module with parameters was built by the set-up (not at an import) or wrapped."""
    if rec.wrap_calls:
        return True
    skip = getattr(rec, "built_at_import", ())
    return any(next(m.parameters(), None) is not None for m, _ in rec.constructed if id(m) not in skip)


def _in_process(loader):
    """The same data, batches and collation as `loader`, without worker processes."""
    import torch.utils.data as data

    if isinstance(loader.dataset, data.IterableDataset):
        return data.DataLoader(loader.dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn,
                               drop_last=loader.drop_last)
    if loader.batch_size is None and loader.batch_sampler is not None:
        return data.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn)
    return data.DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=loader.sampler,
                           collate_fn=loader.collate_fn, drop_last=loader.drop_last)


def _user_class(module) -> str:
    from fsdp_lint.model.tree import user_class

    return user_class(module).__name__


def training_loop(rec, line: int) -> None:
    """Called where a training loop of project code starts (the transform put the call there)."""
    pos = rec.position()
    rec.stopped = (f"the training loop at line {line}", pos)
    raise TrainingBoundary(rec.stopped[0])
