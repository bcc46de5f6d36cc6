"""Running an entry point's setup code the way ``python`` runs it, in the sandbox, up to the training
boundary, and turning what happened into a ReplayResult.

* A standalone file runs as ``__main__`` with its folder first on ``sys.path``; a module of a package
  runs as ``__main__`` with its package (``__package__``, ``__spec__``) so that relative imports work,
  the package root first on ``sys.path`` and the packages above it imported first, as ``python -m``.
* ``argv`` is the script's command line: its argument parser picks the model and settings as at
  launch; a parser that stops (a required argument, a usage error) is reported with its own message.
* Project-local imports go through the code transform (``imports.ProjectImporter``).
* The replay ends at the training boundary (``boundary``), at a training loop of project code, or
  when the script ends.
"""
from __future__ import annotations


import contextlib
import importlib
import importlib.util
import os
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from fsdp_lint.process.alarm import alarm
from fsdp_lint.entry.project import Entry, Reach, facts_for, reach
from fsdp_lint.replay import asked_keys, boundary, endings, network
from fsdp_lint.replay.failures import _FSDP_LINT_DIR, Failures, _display, _one_line
from fsdp_lint.replay.caught import caught_before_wrap, caught_helper
from fsdp_lint.replay.empty_data import empty_length
from fsdp_lint.replay.import_errors import (_import_message, _innermost_project_line, _names_absent_from_installed,
                                           _own_project_modules, own_folder_first, raised_by_a_project_module)
from fsdp_lint.replay.imports import (
    limited_uses,
    Missing,
    not_importable,
    MissingImport,
    ProjectImporter,
    StubUse,
    innermost_import,
    is_circular,
    missing_module_of,
    only_observes,
)
from fsdp_lint.replay.recorders import Recorder
from fsdp_lint.replay.records import (
    NoModelError,
    ReplayError,
    ReplayResult,
    TrainingBoundary,
)
from fsdp_lint.replay.sandbox import guarded_builtins, sandbox
from fsdp_lint.replay.targets import (
    LazyOverride,
    ModelTarget,
    Override,
    build_override,
    discover_model,
    helper_arguments,
    load_target,
)
from fsdp_lint.replay.transform import (CAUGHT, LENGTH, LOOP, REBIND, SETUP_DONE, SKIP, SKIPPABLE, STUB_IMPORT,
                                        transform)
from fsdp_lint.replay.helpers import ReplayHelper
from fsdp_lint.entry.source import SourceFacts, relevant_lines_with
from fsdp_lint.entry.reading import python_requirement_note
from fsdp_lint.replay.argv_hint import argv_hint
from fsdp_lint.replay.subprocess_launches import LaunchElsewhere
from fsdp_lint.replay.roots import last_resort_roots
from fsdp_lint.model.tree import user_class
from fsdp_lint.replay.model_root import _root_of, note_other_models, _undo_after_last_wrap  # noqa: F401 (api.py imports them here)


class _ReplayTimeout(BaseException):
    pass


def replay(facts: Union[SourceFacts, str], world_size: int, target: Optional[ModelTarget] = None,
           real: bool = False, timeout: Optional[float] = None, device=None, argv: Optional[List[str]] = None,
           project: Optional[Reach] = None, cwd: Optional[str] = None,
           gpus_per_node: Optional[int] = None, wrap: bool = True) -> ReplayResult:
    """Run the entry point `facts` (SourceFacts, or a path) as rank 0 of `world_size` ranks up to the
    training boundary. `argv`: the script's own arguments; `cwd`: the folder it is launched from
    (default: the current one). `wrap=False` (with `real`): the wrap calls are recorded and leave the
    model unwrapped (``--simulate`` of a ``--suggest`` candidate applies its own plan). Raises
    ReplayError (one line)."""
    facts = facts_for(os.path.abspath(facts)) if isinstance(facts, str) else facts

    def make_run():
        run = _Run(facts, world_size, target, real, device, list(argv or []), project)
        run.cwd, run.rec.defer_wrap = cwd, real and not wrap
        run.rec.gpus_per_node = gpus_per_node  # issue 11: LOCAL_WORLD_SIZE / device_count() (replay/parallel.py)
        return run
    return asked_keys.in_rounds(make_run, timeout)   # issue 15: again with the keys read from stood-in rows


@dataclass
class _Run:
    facts: SourceFacts
    world_size: int
    target: Optional[ModelTarget]
    real: bool
    device: Any
    argv: List[str]
    project: Optional[Reach]
    rec: Recorder = field(init=False)
    failures: Failures = field(init=False)

    def __post_init__(self):
        path = os.path.abspath(self.facts.path)
        self.path = path
        self.display = os.path.basename(path)
        rel = os.path.relpath(path)
        self.shown = path if rel.startswith("..") else rel      # the file as notes name it
        self.project = self.project or reach(path, self.facts)
        self.entry: Entry = self.project.entry
        self.relevant_names, self.wrap_names = self.project.relevant_names()
        self.param_writers = self.project.param_writers()
        self.rec = Recorder(path, self.world_size, real=self.real)
        self.rec.device = self.device
        self.rec.api = self.facts.api
        self.failures = Failures(entry_path=path, argv=list(self.argv),
                                 approximated=lambda: bool(self.rec.__dict__.get("approximated_by_collective")))
        self.rec.record_skip = self.failures.record_skip
        self.rec.on_wrap_stand_in = self._wrap_stand_in
        from fsdp_lint.entry.project import Project

        self.failures.resolves_locally = Project(self.entry).resolve
        self.cwd: Optional[str] = None
        self.importer = ProjectImporter(self._load_module)
        self.override: Optional[Override] = None
        self.namespaces: List[dict] = []
        self.terminal_spans: Dict = {}
        self.setup_done: Optional[tuple] = None     # (file, line) where the entry's setup ended
        self.finished = False                        # the replay is over (project code runs on in --run)
        self.ended_after_setup: Optional[str] = None
        self.ran_as_script: Optional[str] = None     # the package refused to import: the file ran as a script

    # -- modules -------------------------------------------------------------------------------
    def _helpers(self) -> Dict[str, Any]:
        rec = self.rec

        def skip(line, exc):
            if self.finished:       # the replay is over: project code called later (--run's steps) fails as written
                return False
            frame = sys._getframe(2)
            if not self.failures.may_skip(exc, frame, line):
                return False
            self.failures.record_skip(frame.f_code.co_filename, line, exc, depth=_depth(frame), frame=frame)
            self.failures.skips[-1].in_training = endings.under_framework_training(frame, exc)
            return True

        def stub_import(names, globs, module, exc):
            return self._stub_import(names, globs, module, exc, sys._getframe(2))

        def rebind(globs):
            if self.override is not None:
                self.override.rebind(globs)

        def training_loop(line):
            if not self.finished:
                boundary.training_loop(rec, line)

        def length(line, exc):      # a project Dataset's __len__ failed or was 0: a stand-in length where its data was skipped
            if not isinstance(exc, BaseException):
                return empty_length(self.failures, exc, sys._getframe(2), over=self.finished)
            return self.failures.standin_length(exc, sys._getframe(2), line, over=self.finished)

        helpers = {SKIP: skip, STUB_IMPORT: stub_import, REBIND: rebind, LOOP: training_loop, SETUP_DONE: self._setup_done,
                   LENGTH: length, CAUGHT: caught_helper(self)}
        return {**{name: ReplayHelper(name, fn) for name, fn in helpers.items()},
                SKIPPABLE: (Exception, network.NetworkWait), "__builtins__": guarded_builtins()}

    def _setup_done(self) -> None:
        """Called after the entry's last statement that matters for the plan: when every frame of
        the entry file on the stack is at its last relevant statement, the setup is done -- what
        the script does after it (exit, raise, fail) no longer decides the plan."""
        if self.setup_done is not None:
            return
        f = sys._getframe(2)
        pos = (f.f_code.co_filename, f.f_lineno)
        f = f.f_back
        while f is not None:
            fname = os.path.abspath(f.f_code.co_filename)
            if fname == self.path:
                name = f.f_code.co_name
                key = ("<module>", 0) if name == "<module>" else (name, f.f_code.co_firstlineno)
                spans = self.terminal_spans.get(key)
                if not spans or not any(a <= f.f_lineno <= b for a, b in spans):
                    return
                if name == "<module>":
                    break
            elif fname.startswith(_FSDP_LINT_DIR):
                break
            f = f.f_back
        self.setup_done = pos
        # issue 18: what the script does after it never runs (an os.system, a loop writing files, a
        # train(model) that logs before its first forward): the README's "left out"
        raise TrainingBoundary("checkpoint")

    def _compile(self, facts: SourceFacts, main: bool):
        relevant = relevant_lines_with(facts, self.relevant_names)
        dropped = {line for line in facts.dropped_loop_lines
                   if not (facts.loop_calls.get(line, set()) & self.wrap_names)}
        done = transform(facts, main=main, relevant=relevant, dropped=dropped, param_writers=self.param_writers)
        path = os.path.abspath(facts.path)
        if main:
            self.terminal_spans = done.terminal_spans
        self.failures.fatal_lines[path] = done.fatal_lines
        self.failures.deciding[path] = facts.sites     # what decides the wrap: worked out if a stand-in fails
        self.failures.tolerant[path] = done.tolerant
        return done.code

    def _load_module(self, module, path: str) -> None:
        """Exec a project module (imported by the entry) through the transform."""
        facts = self.project.modules.get(path) or facts_for(path)
        code = self._compile(facts, main=False)
        module.__dict__.update(self._helpers())
        self.namespaces.append(module.__dict__)
        exec(code, module.__dict__)

    def _stub_import(self, names, globs, module, exc, frame) -> bool:
        """A top-level import of project code failed: bind tracked stand-ins (False: re-raise)."""
        if is_circular(exc):
            # name the cycle while the imports that make it are still on the importer's stack
            from fsdp_lint.replay.imports import circular_module

            mod = circular_module(exc)
            chain = self.importer.cycle_through(mod) if mod else None
            if chain and not getattr(exc, "_fsdp_lint_cycle", False):     # the innermost import names it
                exc._fsdp_lint_cycle = True
                entry = "__main__ (" + self.display + ")"
                self.failures.cycles.append([entry] + [n for n, _ in chain] + [mod])
            return False
        path = os.path.abspath(frame.f_code.co_filename)
        gone = missing_module_of(exc)
        if globs is not frame.f_globals and gone and self.failures.resolves_locally(gone.split(".")[0]):
            return False        # inside a function, a module of the project's own that is not there: as python stops
        if raised_by_a_project_module(exc, self.rec.is_project_file, path):
            return False        # a project module's own `raise ImportError(...)` (no package missing): python stops there
        absent = _names_absent_from_installed(module, names, globs, exc)
        if absent:
            # `from transformers import AdamW, T5ForConditionalGeneration`: the package is installed and
            # lacks a name (another version); the names it has are bound for real above, only the absent
            # ones are stood in for
            names = absent
            missing = ", ".join(f"{module}.{n}" for n in absent)
        else:
            missing = missing_module_of(exc) or (module or "").lstrip(".")
        local = bool(module) and (module.startswith(".") or
                                  self.project is not None and self.failures.resolves_locally(module) is not None)
        self.failures.imports.append(MissingImport(module=module or "", missing=missing, path=path,
                                                   line=frame.f_lineno, local=local,
                                                   message=_import_message(exc), names=list(names),
                                                   absent_names=bool(absent),
                                                   imported="" if absent else innermost_import(exc, missing)))

        def on_use(name, _path=path, model=False, access=False, truth=False):     # model: called with the model
            use_frame = sys._getframe(3)      # the user's frame: Missing's method, limited_uses, here
            # handed a model once a wrap was made: what acts on the wrapped model (a rollout engine built from
            # it, a watcher) comes after the plan, not in it
            handed = model and not only_observes(missing) and not self.rec.wrap_calls
            in_model = not access and (handed or _in_model_build())
            self.failures.stub_uses.append(StubUse(name, use_frame.f_code.co_filename, use_frame.f_lineno, in_model))
            return truth and self.failures.decides_wrap(use_frame, use_frame.f_lineno)

        why = not_importable(missing if not absent else module, absent_names=bool(absent)) if not local else None
        where = f"{_display(path, self.path, self.display)}:{frame.f_lineno}"
        for name in names:
            globs.setdefault(name, Missing(name, limited_uses(on_use, name, why or _import_message(exc), where), why))
        return True

    def _wrap_stand_in(self, call) -> None:
        """A wrap call whose arguments hold a stand-in (``mp_policy=`` a float8 policy, a recipe config
        from a package that is not installed): the precision or the wrap would be planned without it."""
        from fsdp_lint.replay.imports import stand_in_within

        for value in call.kwargs.values():
            found = stand_in_within(value)
            if found is not None:
                self.failures.stub_uses.append(StubUse(name=found._fsdp_lint_name, path=call.pos.path,
                                                       line=call.pos.line, in_model=True, user="the wrap"))
                raise ReplayError(self.failures.incomplete_plan(self.display))

    # -- the run -------------------------------------------------------------------------------
    def execute(self, timeout: Optional[float]) -> ReplayResult:
        import torch.nn as nn

        entry = self.entry
        module = types.ModuleType("__main__")
        module.__file__ = self.path
        module.__builtins__ = guarded_builtins()
        if entry.is_package_module:
            module.__package__ = entry.package
            module.__spec__ = importlib.util.spec_from_file_location(entry.module, self.path)
        ns = module.__dict__
        ns.update(self._helpers())
        self.namespaces.append(ns)
        where_real = "with the real FSDP APIs" if self.real else "on the meta device"
        root = how = None
        launchers = tuple(sorted({imp.module.split(".")[0] for f in self.project.modules.values()
                                  for imp in f.imports} & {"hydra"}))
        # (`python -m pkg.mod` puts no folder of the module on sys.path: its siblings are not top-level modules)
        siblings = os.path.dirname(self.path) if entry.is_package_module and not entry.launched else None
        siblings = last_resort_roots(entry, siblings)   # trials: the roots the static Project resolves with
        script_folder = os.path.dirname(self.path) if self._runs_as_a_script_would() else None
        with _own_project_modules(), sandbox(self.rec, entry.root, self.argv, launchers=launchers,
                                             last_resort_path=siblings), own_folder_first(script_folder):
            if self.cwd:
                os.chdir(self.cwd)      # restored by the sandbox
            sys.meta_path.insert(0, self.importer)
            try:
                sys.modules["__main__"] = module
                if self.target is not None:
                    self.override = self._with_failures(lambda: load_target(self.target, self.path, ns), where_real)
                code = self._compile(self.facts, main=True)
                self._run(lambda: self._exec_entry(code, ns), timeout, where_real)
                root, how = self._find_model(ns, timeout, where_real)
                unreached = endings.training_unreached(self) or caught_before_wrap(self) or \
                    endings.training_before_wrap(self)
                if unreached is not None:
                    raise unreached
            finally:
                self.finished = True
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self.importer)
        problem = self.failures.incomplete_plan(self.display)
        if problem:
            raise ReplayError(problem)
        if not isinstance(root, nn.Module):
            raise ReplayError(f"{self.display}: could not find the model")
        skipped = [s.skipped for s in self.failures.skips]
        return ReplayResult(model=root, target=how, wrap_calls=self.rec.wrap_calls, optimizers=self.rec.optimizers,
                            param_events=self.rec.param_events, skipped=skipped, world_size=self.world_size,
                            mesh_sizes=self.rec.mesh_sizes, namespace=ns, stopped=self.rec.stopped,
                            argv=list(self.argv),
                            run_as=f"module {entry.module}" if entry.is_package_module and not self.ran_as_script
                            else "script",
                            stubs=list(self.failures.imports), stub_uses=list(self.failures.stub_uses),
                            notes=self._notes(), parallel=getattr(self.rec, "parallel", None))  # issue 11

    def _exec_entry(self, code, ns) -> None:
        if self.entry.is_package_module:
            # the packages above the module run first, as `python -m pkg.sub.mod` does
            try:
                importlib.import_module(self.entry.package)
            except (TrainingBoundary, ReplayError):
                raise
            except Exception as exc:
                if not self._as_script(exc, ns):
                    raise
        exec(code, ns)

    def _as_script(self, exc: BaseException, ns) -> bool:
        """Importing the file's package failed (a recipe folder whose ``__init__.py`` refuses to be
        imported, a package chain that cannot import here): the project runs the file as a script
        (``tune run`` / ``python recipes/x.py``), and so does the replay when the file has no relative
        imports -- said in a note. False: the package import is the failure."""
        if self.entry.namespace or any(i.level for i in self.facts.imports):
            return False
        where = _innermost_project_line(exc)
        at = f"{_display(where[0], self.path, self.shown)}:{where[1]}: " if where else ""
        self.ran_as_script = (f"importing its package `{self.entry.package}` failed ({at}{_one_line(exc)}); "
                              f"ran {self.display} as a script, as `python {self.shown}` does")
        folder = os.path.dirname(self.path)
        ns["__package__"] = None
        ns["__spec__"] = None
        if folder not in sys.path:
            sys.path.insert(0, folder)       # restored by the sandbox
        self.failures.skips.clear()          # the package's own failures are not the file's
        return True

    def _runs_as_a_script_would(self) -> bool:
        """A file given as it is, in a package folder, that is written as a script (no relative import, no import of
        its own package by name): its own folder is searched before the installed packages, as `python pkg/train.py`
        searches it -- a project folder `datasets/` beside it is the one it imports, not Hugging Face's."""
        entry = self.entry
        if not entry.is_package_module or entry.launched or not entry.package:
            return False
        top = entry.package.split(".")[0]
        return not any(i.level or (i.module or "").split(".")[0] == top for i in self.facts.imports)

    def _with_failures(self, fn, where_real: str):
        try:
            return fn()
        except NoModelError as exc:     # trials: say which skipped failure kept the wrap code from running
            raise endings.unreached(self, exc) from None
        except (ReplayError, TrainingBoundary):
            raise
        except Exception as exc:
            raise self._error(exc, where_real) from exc

    def _run(self, fn, timeout: Optional[float], where_real: str) -> None:
        try:
            with alarm(timeout, _ReplayTimeout):
                fn()
        except TrainingBoundary:
            pass
        except _ReplayTimeout:
            raise ReplayError(f"{self.display}: replaying the setup code took longer than {timeout:.0f} s") from None
        except network.NetworkWait as exc:      # issue 15: never wait on a network the lint does not have
            raise ReplayError(f"{self.display}: {exc}{self.failures.decides_note(self.shown)}") from None
        except LaunchElsewhere as exc:          # ... nor start the processes a launcher starts: that launch is
            err = ReplayError(str(exc))         # linted instead (engine.lint_facts)
            err.follow = exc.launch
            raise err from None
        except SystemExit as exc:
            if self.setup_done is not None and not self.rec.stopped:
                self.ended_after_setup = f"sys.exit({exc.code!r})"
                return
            endings.on_exit(self, exc)
        except ReplayError:
            raise
        except BaseException as exc:
            if not isinstance(exc, Exception):
                if endings.stops_itself(exc):       # `except ImportError: pytest.skip(...)`: the script's own stop
                    endings.on_own_stop(self, exc)
                if isinstance(exc, (KeyboardInterrupt, GeneratorExit)) or type(exc).__module__.startswith("fsdp_lint"):
                    raise
                # a library's own BaseException (torch.distributed.checkpoint's CheckpointException): a failure
            if self.setup_done is not None and self.failures.after_setup_ok(exc):
                self.ended_after_setup = _one_line(exc)
                return
            raise self._error(exc, where_real) from exc

    def _error(self, exc: BaseException, where_real: str) -> ReplayError:
        launch = f" ({self._namespace_launch()})" if self.entry.namespace and not self.entry.launched else ""
        err = ReplayError(self.failures.describe(exc, entry_display=self.display, where_real=where_real,
                                                 importer=self.importer)
                          + argv_hint(exc, self.path, self.argv, self.display) + launch)  # trials: no-argument launches
        err.user_exception = exc
        return err

    def _namespace_launch(self) -> str:
        root = os.path.relpath(self.entry.root)
        root = self.entry.root if root.startswith("..") or root == "." else root
        return (f"run as `python -m {self.entry.module}` from {root}: {self.display} is a module of the namespace "
                f"package {self.entry.package}")

    # -- the model ------------------------------------------------------------------------------
    def _find_model(self, ns, timeout, where_real):
        rec = self.rec
        root = how = None
        override = self.override
        if isinstance(override, LazyOverride) and override.callable is None:
            override.callable = override._find(ns)
            if override.callable is None:
                # --model names something in the linted file itself: it must exist even when the
                # file builds and wraps its own model (an unknown --model is a usage error, exit 2)
                raise ReplayError(f"--model {self.target.text}: {self.target.name!r} is not defined in {self.display}")
        if not rec.wrap_calls and rec.stopped is None:
            root, how = self._with_failures(lambda: self._library_helpers(ns, timeout, where_real), where_real)
        if not rec.wrap_calls and root is None and override is not None and not override.used:
            built: Dict[str, Any] = {}

            def build():
                built["model"] = build_override(override, rec)

            self._run(build, timeout, where_real)
            root = built.get("model")
            how = self.target.text
        if not rec.real:
            _undo_after_last_wrap(rec)
        if rec.wrap_calls:
            root = _root_of(rec)
            note_other_models(rec, root, lambda path: _display(path, self.path, self.shown))
            how = how if (how and override is not None and override.used) else f"{self.display}:{user_class(root).__name__}"
            if override is not None and not override.used:
                # the file wraps a model of its own: applying its wrap code (policies naming the
                # file's own block classes) to another model would report a plan nobody wrote
                raise ReplayError(
                    f"--model {self.target.text}: {self.display} never builds {self.target.name}; its wrap code wraps "
                    f"its own {user_class(root).__name__}. Use --model {self.display}:{user_class(root).__name__}(...) to change "
                    f"that model's arguments, or lint the file that builds {self.target.name}")
        elif root is None:
            if override is not None and override.used:
                from fsdp_lint.replay.targets import largest_built_model

                built_model = largest_built_model(rec)
                if built_model is None:
                    raise ReplayError(f"--model {self.target.text}: no model was built")
                root = built_model[0]
            else:
                root, how = self._with_failures(lambda: discover_model(self.facts, ns, rec, self.display), where_real)
        if override is not None and override.used:
            how = self.target.text
        return root, how

    def _library_helpers(self, ns, timeout, where_real):
        """Library-style files: wrap helpers that the file defines but never calls. Entry points
        without required arguments (``main()`` run by ``fire``/``typer``) build their own model;
        helpers taking the model get it, with simulated meshes and sizes."""
        rec = self.rec
        helpers = self.facts.uncalled_wrap_helpers()
        for helper in [h for h in helpers if h.defaults == len(h.params)]:
            fn = ns.get(helper.name)
            if callable(fn) and not rec.wrap_calls:
                self._arguments_not_dropped(helper.name, fn)
                try:
                    self._run(fn, timeout, where_real)
                except ReplayError:
                    rec.wrap_calls.clear()
        if rec.wrap_calls or not helpers:
            return None, None
        taking = [h for h in helpers if h.params and h.defaults < len(h.params) and callable(ns.get(h.name))]
        if not taking:
            return None, None
        if self.override is None and not (self.facts.defines_model or self.rec.constructed):
            names = ", ".join(f"{h.name}({', '.join(h.params)})" for h in taking)
            raise NoModelError(     # (a skipped failure that kept the setup from calling it is named instead)
                f"{self.display}: {names} wraps a model it is given, and nothing here builds one: lint the entry "
                f"point that calls it (fsdp-lint train.py -- ARGS), or pass the model with --model path.py:Class(...)")
        if self.override is not None:
            root = None

            def build():
                nonlocal root
                root = build_override(self.override, rec)

            self._run(build, timeout, where_real)
            how = self.target.text
        else:
            root, how = self._with_failures(lambda: discover_model(self.facts, ns, rec, self.display), where_real)
        for helper in taking:
            fn = ns[helper.name]
            args, kwargs = helper_arguments(fn, root, rec, self.display)
            self._run(lambda: fn(*args, **kwargs), timeout, where_real)
        return root, how

    def _arguments_not_dropped(self, name: str, fn) -> None:
        """`fn` is called here with its defaults because the script's command-line framework is a stand-in
        (``app = cyclopts.App(); @app.default def main(...)``, ``fire.Fire(main)``): with arguments given, that
        plan would not be the launch's -- refused, naming the package."""
        missing = [i for i in self.failures.imports if not i.local and os.path.abspath(i.path) == self.path]
        if not self.argv or not missing:
            return
        from fsdp_lint.replay.imports import distribution_of

        # the package that would have read them: the one whose stand-in decorated the function, or one the
        # `__main__` block calls (`fire.Fire(main)`); an unrelated missing package (a logger) reads nothing
        by = getattr(fn, "_fsdp_lint_decorated_by", None)
        guard = self.facts.main_guard_line
        called = {u.name.split(".")[0].split("(")[0] for u in self.failures.stub_uses
                  if guard is not None and os.path.abspath(u.path) == self.path and u.line > guard}
        names = ({by.split(".")[0].split("(")[0]} if by else set()) | called
        packages = [i.missing for i in missing if names & {i.missing.split(".")[0], *i.names}]
        if not packages:
            return
        top = packages[0].split(".")[0]
        raise ReplayError(f"{self.display}: the script's arguments ({' '.join(self.argv)}) reach {name}() through "
                          f"`{top}`, which is not installed here (pip install {distribution_of(top)}): run with its "
                          f"defaults, {name}() would not plan the launch")

    def _notes(self) -> List[str]:
        notes = []
        rec = self.rec
        if self.ran_as_script:
            notes.append(self.ran_as_script)
        elif self.entry.namespace and not self.entry.launched:
            notes.append(self._namespace_launch())
        if self.ended_after_setup:
            notes.append(f"the script ended after its setup ({self.ended_after_setup}) before training started")
        if not rec.wrap_calls and self.project.wrap_paths and rec.stopped is None:
            where = ", ".join(sorted({_display(p, self.path, self.shown) for p in self.project.wrap_paths}))
            notes.append(f"the wrap code in {where} did not run with these arguments; the plan shown is a suggestion")
        if self.failures.skips:
            first = self.failures.skips[0].skipped
            n = len(self.failures.skips)
            notes.append(f"{n} setup statement{'s' if n != 1 else ''} failed here and {'were' if n != 1 else 'was'} "
                         f"skipped (first: {_display(first.path, self.path, self.shown)}:{first.line}: {first.error})"
                         f"{python_requirement_note(self.path)}")
        notes.extend(getattr(rec, "framework_notes", []))     # trials: what a framework hook changed
        notes.extend(self.failures.import_notes(lambda path: _display(path, self.path, self.shown)))
        return notes



def _depth(frame) -> int:
    return sum(1 for _ in traceback.walk_stack(frame))


def _in_model_build() -> bool:
    """Whether a model is being built or wrapped on the current stack."""
    from fsdp_lint.replay.failures import _in_model_init, _is_recorder_frame

    f = sys._getframe(2)
    while f is not None:
        if _in_model_init(f) or _is_recorder_frame(f.f_code.co_filename):
            return True
        f = f.f_back
    return False
