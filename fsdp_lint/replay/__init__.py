"""Replay a training file's setup code against a meta-device model, with FSDP replaced by recorders.

The file is compiled with its own line numbers after a small AST transform:

* training/data loops (``for batch in loader``, loops that call ``.backward()``/``.step()``, every
  ``while``) are replaced by ``pass``;
* statements that do not affect the wrap plan run inside ``try``: a data set or checkpoint that
  cannot be loaded here is skipped, not fatal;
* after the last statement that affects the plan (a wrap call, a freeze, a dtype change, an
  optimizer, or a call of a function that does one of these) a checkpoint stops the replay, so
  nothing after the wrap -- the training loop -- ever runs;
* the ``if __name__ == "__main__":`` block runs only up to that checkpoint.

While it runs, tensors are created on the meta device, ``torch.distributed``/``torch.cuda`` calls are
simulated for rank 0 of ``world_size`` ranks, ``fully_shard``/``FullyShardedDataParallel`` record
their calls instead of sharding, and optimizers record which parameters they hold.

The same replay runs with the real FSDP APIs (``real=True``) for ``--run`` and for the tests that
compare the static plan with what torch builds.
"""
from fsdp_lint.replay.recorders import FakeMesh, Recorder  # noqa: F401
from fsdp_lint.replay.records import (  # noqa: F401
    OptimizerCall,
    ParamEvent,
    Position,
    NoModelError,
    ReplayError,
    ReplayResult,
    TrainingBoundary,
    WrapCall,
)
from fsdp_lint.replay.runner import replay  # noqa: F401
from fsdp_lint.replay.targets import ModelTarget  # noqa: F401
from fsdp_lint.replay.transform import compile_replay  # noqa: F401
