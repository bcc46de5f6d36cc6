"""The replay: run a training entry point's setup code the way ``python`` runs it, on the meta
device, with FSDP replaced by recorders, up to the moment training starts.

The stages, one module each:

* ``runner``     -- how Python runs the entry (a script, or a module of a package with its relative
                    imports), the script's own ``argv``, the model found afterwards, the result;
* ``imports``    -- project-local imports loaded through the transform, stand-ins for packages that
                    are not installed (their uses tracked), circular imports named;
* ``transform``  -- the code transform of every project module (training loops end the replay,
                    failing setup statements can be skipped, the entry's unneeded setup does not run);
* ``sandbox``    -- the simulated world: rank 0 of ``world_size``, ``torch.distributed``/``torch.cuda``,
                    the meta device, launchers (``mp.spawn``, Hydra), records of casts, freezes and
                    optimizers;
* ``boundary``   -- the training boundary detected while running (first forward of a wrapped model,
                    ``backward()``, ``optimizer.step()``, iterating a DataLoader);
* ``recorders``  -- ``fully_shard``/``FullyShardedDataParallel`` recorded (or real, ``real=True``);
* ``parallel``   -- device meshes, process groups and tensor parallelism run by torch's own code;
* ``failures``   -- which failures may be skipped, and the one line that names the first cause;
* ``targets``    -- ``--model`` targets, models built by the setup code, uncalled wrap helpers;
* ``records``    -- the plain data a replay returns.

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
