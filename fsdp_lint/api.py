"""The Python API, for frameworks fsdp-lint does not drive itself and for users' own tests.

``with fsdp_lint.record(world_size=64) as rec: parallelize(model)`` runs any code — a framework's own wrap
function imported from its package included — with the simulated process group (rank 0 of
`world_size`), the meta device for new tensors, and recorders in place of ``fully_shard`` /
``FullyShardedDataParallel``; ``rec.report()`` then lints what was wrapped, with the same rules as the
command line. ``fsdp_lint.lint_module(model, world_size=...)`` lints a model already wrapped for real
(FSDP1 units or FSDP2 ``FSDPModule``s, e.g. in a pytest under the fake process group) from the units
torch actually built.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class UnitReport:
    module: str                 # FQN in the unwrapped model ("" = the root)
    modules: List[str]
    cls: str
    numel: int                  # parameters the unit owns
    trainable_numel: int
    shard_numel: int            # elements each rank holds (padding included)
    padded_numel: int
    params: List[str]
    line: int                   # the wrap call's line (0 when not known)
    path: Optional[str]


@dataclass
class PlanReport:
    api: Optional[str]
    world_size: int
    framework: Optional[str]
    root_wrapped: bool
    units: List[UnitReport] = field(default_factory=list)


class Report:
    """What ``rec.report()`` / ``lint_module()`` return: ``.findings`` (the CLI's Finding objects), ``.plan``
    (``.units`` with ``.module``, ``.numel``, ``.shard_numel``), and ``.to_json()`` (the CLI's JSON)."""

    def __init__(self, result, settings):
        self.result = result                      # engine.FileResult
        self.settings = settings
        self.findings = result.findings
        self.tree, self.wrap_plan, self.layout = result.tree, result.plan, result.layout
        plan = result.plan
        self.plan = PlanReport(api=plan.api, world_size=plan.world_size, framework=getattr(plan, "framework", None),
                               root_wrapped=plan.root_wrapped)
        for ul in result.layout.units:
            u = ul.unit
            self.plan.units.append(UnitReport(
                module=u.module, modules=list(u.modules), cls=u.cls, numel=ul.numel, trainable_numel=ul.trainable_numel,
                shard_numel=ul.shard_numel, padded_numel=ul.padded_numel, params=list(u.params), line=u.line,
                path=u.path if u.line else None))

    def to_json(self) -> str:
        """The document ``fsdp-lint --format json`` prints for this model."""
        from fsdp_lint.report.machine import render_json

        return render_json([self.result])

    def __repr__(self) -> str:
        return (f"<fsdp_lint Report: {self.plan.api} on {self.plan.world_size} ranks, {len(self.plan.units)} units, "
                f"{len(self.findings)} findings>")


def _settings(world_size: int, settings=None, **overrides):
    from fsdp_lint.config import Settings

    base = settings if settings is not None else Settings()
    return base.with_overrides(world_size=world_size, **overrides)


def _lint(path: str, model, replay_result, settings) -> Report:
    from fsdp_lint.engine import FileResult, check_rules, plan_replay
    from fsdp_lint.entry.source import parse_source, read_source

    try:
        facts = read_source(path) if path.endswith(".py") and os.path.isfile(path) else parse_source(path, "")
    except Exception:
        facts = parse_source(path, "")
    tree, plan, layout = plan_replay(replay_result, settings)
    res = FileResult(path=path, target=replay_result.target, facts=facts, tree=tree, plan=plan, layout=layout)
    res.findings = check_rules(res, settings)
    return Report(res, settings)


class Recording:
    """``fsdp_lint.record(...)``: a context manager; ``report()`` after the block."""

    def __init__(self, world_size: int = 8, *, settings=None, path: Optional[str] = None, _depth: int = 1, **options):
        self.settings = _settings(world_size, settings, **options)
        frame = sys._getframe(_depth)
        self.path = os.path.abspath(path or frame.f_code.co_filename)
        self.rec = None
        self.model = None
        self._stack: Optional[contextlib.ExitStack] = None
        self.boundary: Optional[str] = None

    def __enter__(self) -> "Recording":
        import argparse

        from fsdp_lint.replay import frameworks
        from fsdp_lint.replay.frameworks.options import FrameworkOptions
        from fsdp_lint.replay.recorders import Recorder
        from fsdp_lint.replay.sandbox import sandbox

        self.rec = Recorder(self.path, self.settings.world_size)
        stdout, stderr, argv = sys.stdout, sys.stderr, list(sys.argv)
        parse_known_args = argparse.ArgumentParser.__dict__["parse_known_args"]
        parse_args = argparse.ArgumentParser.__dict__["parse_args"]
        stack = contextlib.ExitStack()
        stack.enter_context(frameworks.configured(FrameworkOptions.from_settings(self.settings)))
        stack.enter_context(sandbox(self.rec, os.path.dirname(self.path)))
        # the simulated world, not a replayed script: the caller's output, argv and argparse stay theirs
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        sys.argv = argv
        argparse.ArgumentParser.parse_known_args = parse_known_args
        argparse.ArgumentParser.parse_args = parse_args
        self._modules = dict(sys.modules)
        self._stack = stack
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        from fsdp_lint.replay.records import TrainingBoundary
        from fsdp_lint.replay.runner import _undo_after_last_wrap

        imported = dict(sys.modules)
        try:
            _undo_after_last_wrap(self.rec)
        finally:
            self._stack.close()
            # modules the block imported stay imported (the sandbox forgets a replayed file's own modules)
            for name, mod in imported.items():
                if not getattr(mod, "__fsdp_lint_simulated__", False):     # (the simulated node's Ray: its own)
                    sys.modules.setdefault(name, mod)
        if exc_type is not None and issubclass(exc_type, TrainingBoundary):
            self.boundary = exc.reason          # a framework started training: the plan is complete
            return True
        return False

    def report(self, model=None) -> Report:
        """Lint what the block wrapped (`model`: the model, when the block wrapped nothing or several models)."""
        from fsdp_lint.replay.records import ReplayResult
        from fsdp_lint.replay.runner import _root_of

        if self.rec is None:
            raise RuntimeError("report() is available after the `with fsdp_lint.record(...)` block")
        rec = self.rec
        root = model if model is not None else (_root_of(rec) if rec.wrap_calls else None)
        if root is None:
            raise ValueError("no FSDP wrap call was recorded in the block; pass the model: rec.report(model)")
        from fsdp_lint.model.tree import user_class

        result = ReplayResult(model=root, target=f"{os.path.basename(self.path)}:{user_class(root).__name__}",
                              wrap_calls=rec.wrap_calls, optimizers=rec.optimizers, param_events=rec.param_events,
                              skipped=rec.skipped_records(), world_size=rec.world_size, mesh_sizes=rec.mesh_sizes)
        return _lint(self.path, root, result, self.settings)


def record(world_size: int = 8, *, settings=None, path: Optional[str] = None, **options) -> Recording:
    """Record the FSDP wrap calls of the code in a ``with`` block (see the module docstring)."""
    return Recording(world_size, settings=settings, path=path, _depth=2, **options)


# --------------------------------------------------------------------------------------------
# a model wrapped for real
# --------------------------------------------------------------------------------------------
def lint_module(model, world_size: Optional[int] = None, *, settings=None, path: Optional[str] = None) -> Report:
    """Lint a model wrapped for real (FSDP1 ``FullyShardedDataParallel`` units or FSDP2 ``fully_shard``
    groups) from the units torch built; `world_size` defaults to the process group's."""
    from fsdp_lint.replay.wrapped import read_wrapped

    if world_size is None:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_initialized() else 8
    settings = _settings(world_size, settings)
    caller = path or sys._getframe(1).f_code.co_filename
    result = read_wrapped(model, world_size, os.path.abspath(caller))
    return _lint(os.path.abspath(caller), result.model, result, settings)
