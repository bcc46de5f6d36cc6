"""What a replay records: wrap calls, optimizers, parameter events, and the result."""
from __future__ import annotations

import os

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

_counter = itertools.count()


# fsdp-lint's own package folder: its frames are the replay's, never the linted code's
FSDP_LINT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# set on a failure a framework hook tolerated inside the framework's training (the HF Trainer's data loader)
IN_TRAINING = "_fsdp_lint_in_training"


class ReplayError(Exception):
    """The file's setup code could not be replayed (message is one line)."""


class WorldSizeFromScript(ReplayError):
    """The script starts its own processes (Lightning's ``Fabric(devices=4)`` / ``Trainer(devices=4)`` run as
    ``python train.py``) and nothing else gave the world size: the replay runs again on that world."""

    def __init__(self, size: int, source: str):
        super().__init__(f"the script's {source} launches {size} processes")
        self.size, self.source = size, source


class NoModelError(ReplayError):
    """The file builds no model, and none of its model classes or factories can be built with their
    defaults (a model file whose constructor needs a config)."""


class TrainingBoundary(BaseException):
    """Raised where the replay stops: training starts (the first forward of a wrapped model, a
    ``backward()``, an optimizer ``step()``, a framework's fit/train, iteration over a data loader),
    or the terminal checkpoint after the last statement that matters for the plan. A BaseException,
    so that the linted code's ``except Exception`` does not swallow it. `reason` says which."""

    def __init__(self, reason: str = "checkpoint"):
        super().__init__(reason)
        self.reason = reason


_StopReplay = TrainingBoundary


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------
@dataclass
class Position:
    path: str
    line: int
    col: int = 1
    # where the linted file calls into the helper module that holds `line` (None: `line` is in it)
    via: Optional["Position"] = None


@dataclass
class WrapCall:
    api: str                                  # "fsdp1" | "fsdp2"
    seq: int                                  # order among all records
    modules: List[Any]                        # module objects as passed (FSDP2 list -> several)
    kwargs: Dict[str, Any]
    pos: Position
    # FSDP1: the units an auto-wrap policy made inside this call, post-order, as module objects
    auto_wrapped: List[Any] = field(default_factory=list)
    policy_desc: Optional[str] = None
    policy_classes: List[str] = field(default_factory=list)   # class names a class-based policy names
    state: Dict[int, Tuple[bool, Any]] = field(default_factory=dict)  # id(param) -> (requires_grad, dtype)
    shard_dims: Dict[int, int] = field(default_factory=dict)   # FSDP2 shard_placement_fn: id(param) -> dim


@dataclass
class OptimizerCall:
    cls: str
    seq: int
    param_ids: List[int]
    pos: Position
    obj: Any = None                           # the optimizer itself (real replays only: --run steps it)


@dataclass
class ParamEvent:
    kind: str          # "freeze" | "dtype"
    seq: int
    param_ids: List[int]
    value: Any         # requires_grad bool, or dtype name
    pos: Position


@dataclass
class ReplayResult:
    model: Any                                # the root nn.Module (meta)
    target: str                               # how it was found, e.g. "train.py:Transformer"
    wrap_calls: List[WrapCall]
    optimizers: List[OptimizerCall]
    param_events: List[ParamEvent]
    skipped: List["Skipped"]                  # setup statements that failed and were skipped
    world_size: int
    mesh_sizes: List[Tuple[int, ...]]
    namespace: Optional[Dict[str, Any]] = None   # the replayed file's globals (--run: example_inputs())
    stopped: Optional[Tuple[str, Position]] = None   # the training boundary that ended the replay
    argv: List[str] = field(default_factory=list)    # the script's arguments
    run_as: str = ""                              # "script" or "module pkg.sub.train"
    stubs: List[Any] = field(default_factory=list)   # imports that failed and got a stand-in (MissingImport)
    stub_uses: List[Any] = field(default_factory=list)   # uses of those stand-ins (StubUse)
    notes: List[str] = field(default_factory=list)   # what the report should say about the replay
    parallel: Any = None                      # issue 11: meshes, groups, DTensor params (replay/parallel.py)


@dataclass
class Skipped:
    """A setup statement that failed and was skipped (a data set or tokenizer not found here)."""
    path: str
    line: int
    error: str                                # "FileNotFoundError: data/train.bin"
    exc_type: str = ""

    def __iter__(self):                       # (line, error), as the records used to be
        return iter((self.line, self.error))



_MISSING = object()


def traceback_frames(exc: BaseException) -> List[Tuple[Any, int]]:
    """(frame, the line it was on) of each entry of `exc`'s traceback, outermost first."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def exception_chain(exc: Optional[BaseException], limit: int = 8):
    """`exc`, then what it was raised from or while handling (``__cause__``, else ``__context__``), `limit` deep."""
    seen = 0
    while exc is not None and seen < limit:
        yield exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
