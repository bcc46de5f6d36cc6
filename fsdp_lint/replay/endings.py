"""How a replay ends without a plan, in one line naming the cause: no model reached (a skipped failure
kept the setup from its model or wrap code, or the script said why it stopped), a training script whose
setup never reached its wrap or its training, a file the project's command line runs, and the script's own
``sys.exit`` (the end of the script, its argument parser, or a failure it was handling). Functions of the
replay's run (`fsdp_lint.replay.runner._Run`)."""
from __future__ import annotations

import re
from typing import Optional

from fsdp_lint.replay.failures import _display, _one_line, package_hint
from fsdp_lint.replay.import_errors import _innermost_project_line
from fsdp_lint.replay.records import IN_TRAINING, NoModelError, ReplayError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")     # a coloured logger's escapes


def unreached(run, exc: NoModelError) -> NoModelError:
    """No model, though the entry reaches wrap code: when setup statements failed and were skipped, the
    first of them is the likely cause (a logger whose backend is missing left `fabric` unbound, and
    every statement after it was skipped in turn)."""
    launch = _cli_launch(run) or _dispatcher_missing(run)
    if launch is not None:
        return launch
    if not run.rec.wrap_calls:
        # (also where the file's syntax reaches no wrap: its config names the trainer, a library or framework
        # builds and wraps the model -- Hydra's own failure, a package of the framework not installed)
        err = _first_cause_error(run, "the setup never reached a model or its wrap code")
        if err is not None:
            return err
        called = _stand_in_called(run)
        if called is not None:
            return called
    said = _error_line(run) if run.facts.main_guard_line is not None and run.override is None else ""
    if said:        # nothing failed here, but the script said why it did not go on (its own parser, a check)
        return NoModelError(f"{run.display}: the script ran to its end without building a model or reaching its "
                            f"wrap code; it reported: {said}")
    return exc


def _stand_in_called(run) -> Optional[NoModelError]:
    """No model, and the setup called what could not be imported here (a framework's model loader, its FSDP
    helper): the model, or its wrap, comes from that package."""
    import os

    from fsdp_lint.entry.project import is_local

    calls = [u for u in run.failures.stub_uses if u.name.endswith("()")
             and (is_local(u.path) or os.path.abspath(u.path) == run.path)]     # (an installed package's entry)
    if not calls:
        return None
    return NoModelError(f"{run.display}: no model was built or wrapped here: "
                        f"{run.failures.stand_in_called(calls[0], run.shown)}; the model or its wrap comes from it")


def _dispatcher_missing(run) -> Optional[NoModelError]:
    """The ``__main__`` block hands the entry to a command-line package that is not installed here (``app()``
    of ``cyclopts.App``, ``fire.Fire(main)``, ``typer.run(main)``): the entry point never runs."""
    import os

    guard = run.facts.main_guard_line
    if guard is None:
        return None
    for use in run.failures.stub_uses:
        if os.path.abspath(use.path) == run.path and use.line > guard and use.name.endswith("()"):
            top = use.name.split(".")[0].split("(")[0]
            imp = next((i for i in run.failures.imports if top in i.names or i.missing.split(".")[0] == top), None)
            if imp is None or imp.local:
                continue
            from fsdp_lint.replay.imports import distribution_of

            import linecache

            package = imp.missing.split(".")[0]
            said = linecache.getline(run.path, use.line).strip() or use.name
            return NoModelError(f"{run.display}:{use.line}: the `__main__` block runs the entry point through "
                                f"`{said}`, from `{package}`, which is not installed here (pip install "
                                f"{distribution_of(package)}): the entry point never ran")
    return None


def _stderr_lines(run):
    """The lines the script wrote to stderr, without a coloured logger's escapes."""
    err_text = run.rec.stderr.getvalue() if getattr(run.rec, "stderr", None) else ""
    return [ln.strip() for ln in _ANSI.sub("", err_text).splitlines() if ln.strip()]


def _error_line(run) -> str:
    """The last line the script wrote to stderr that says "error" (its own argument parser, a check)."""
    return next((ln for ln in reversed(_stderr_lines(run)) if "error" in ln.lower()), "")


def _first_cause_error(run, what: str) -> Optional[NoModelError]:
    """``<what>: <where>: <the first skipped failure> (...)`` or None (nothing was skipped)."""
    cause = run.failures.first_cause()
    if cause is None:
        return None
    n = len(run.failures.skips) - 1
    later = f"; {n} later setup statement{'s' if n != 1 else ''} failed too" if n else ""
    skipped_at = f"{_display(cause.skipped.path, run.path, run.shown)}:{cause.skipped.line}"
    failed_at = _innermost_project_line(cause.exc)
    where = (f"{_display(failed_at[0], run.path, run.shown)}:{failed_at[1]}" if failed_at else skipped_at)
    how = "failed here and skipped" if where == skipped_at else f"the statement at {skipped_at} was skipped"
    first = run.failures.skips[0]
    if first is not cause:      # what failed before it, left an argument at its default (`steps = None`)
        how += (f"; the first setup statement that failed: {_display(first.skipped.path, run.path, run.shown)}:"
                f"{first.skipped.line}: {first.skipped.error}")
    err = NoModelError(f"{run.display}: {what}: {where}: {cause.skipped.error} ({how}{later})")
    err.user_exception = cause.exc
    return err


def training_unreached(run) -> Optional[NoModelError]:
    """A script (it has a ``__main__`` block) whose setup wrapped nothing and never reached training
    because statements failed and were skipped: the model found is whatever was built on the way (a
    module made as a default argument at import), and a suggested plan for it would pass as the job's.
    The first skipped failure is the cause, as on a node that stops there."""
    if (run.rec.wrap_calls or run.rec.stopped is not None or run.override is not None
            or run.facts.main_guard_line is None or run.ended_after_setup
            or any(getattr(rec, "in_training", False) or getattr(rec.exc, IN_TRAINING, False)
                   for rec in run.failures.skips)
            # a data set that stood in (the script went on with it as loaded): no failure that stopped the setup
            or all(getattr(rec.exc, "fsdp_lint_data_stand_in", False) for rec in run.failures.skips)):
        return None
    return _first_cause_error(run, "the setup never reached its wrap code or its training")


def training_before_wrap(run) -> Optional[NoModelError]:
    """Training started (a batch drawn, a backward, an optimizer step) before the project's wrap code ran: a
    plan suggested for what was built would pass as the job's. The boundary and the unreached wrap are named."""
    if run.rec.wrap_calls or run.rec.stopped is None or run.override is not None or not run.project.wrap_paths:
        return None
    reason, pos = run.rec.stopped
    at = f" at {_display(pos.path, run.path, run.shown)}:{pos.line}" if getattr(pos, "line", 0) else ""
    where = ", ".join(sorted({_display(p, run.path, run.shown) for p in run.project.wrap_paths}))
    return NoModelError(f"{run.display}: the setup reached what the replay takes for training ({reason}{at}) before "
                        f"the wrap code in {where} ran: with these arguments the job trains a model FSDP does not wrap, "
                        f"or it reaches the wrap after that; no plan is shown")


# a framework's training entry (the HF Trainer's train, Lightning's fit): a failure inside it (its data
# loader) is past the set-up, where the framework decides the plan
_TRAINING_ENTRIES = frozenset({"train", "fit", "_inner_training_loop", "_fit_impl", "_run"})
_FRAMEWORK_DIRS = ("transformers", "trl", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate")


def under_framework_training(frame, exc: BaseException) -> bool:
    """Whether the skipped failure `exc`, caught in `frame`, happened inside a framework's training entry:
    a caller of `frame`, or a frame between it and where `exc` was raised."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for f in frames:
        parts = f.f_code.co_filename.replace("\\", "/").split("/")
        if f.f_code.co_name in _TRAINING_ENTRIES and "site-packages" in parts and \
                any(d in parts for d in _FRAMEWORK_DIRS):
            return True
    return False


def _cli_launch(run) -> Optional[NoModelError]:
    """A file without a ``__main__`` block that builds no model when run: the project's command line
    calls it (``litgpt pretrain``, ``python -m pkg pretrain``); the error names that launch."""
    from fsdp_lint.entry.launches import cli_launches

    if run.facts.main_guard_line is not None or run.rec.wrap_calls or run.override is not None:
        return None
    launches = cli_launches(run.entry)
    if not launches:
        return None
    first = launches[0]
    err = NoModelError(f"{run.display}: no model found: it has no `if __name__ == \"__main__\"` block; the project "
                       f"runs it through its command line `{first.command}` ({_display(first.cli_path, run.path, run.shown)}): "
                       f"lint that launch: {first.lint_hint(lambda p: _display(p, run.path, run.shown))}")
    return err


def on_exit(run, exc: SystemExit) -> None:
    """The script called sys.exit: the end of the script (status 0), or its argument parser
    stopping it, or a failure."""
    code = exc.code
    if code in (0, None):
        out = run.rec.stdout.getvalue() if getattr(run.rec, "stdout", None) else ""
        if (set(run.argv or ()) & {"-h", "--help", "--helpfull"} or out.lstrip().lower().startswith("usage:")) \
                and not run.rec.wrap_calls:
            # the script printed its help and ended: there is no plan to lint in that run
            args = " ".join(run.argv) if run.argv else "(none)"
            raise ReplayError(f"{run.display}: the script printed its help and exited (arguments {args}) "
                              f"before it built a model: pass the arguments of a real launch after --: "
                              f"fsdp-lint {run.display} -- ARGS")
        return
    lines = _stderr_lines(run)
    usage = next((ln for ln in lines if ln.lower().startswith("usage:")), None)
    # trials: with no line saying "error", the first line says why (litgpt: "checkpoint_dir ... is missing
    # the files ...", then download hints); the last one is a hint
    last_error = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[0] if lines else "")
    if usage or (last_error and "argument" in last_error.lower()):
        args = " ".join(run.argv) if run.argv else "(none)"
        raise ReplayError(
            f"{run.display}: the script's argument parser stopped it with arguments {args}: {last_error}"
            + (f" [{usage}]" if usage and usage != last_error else "")
            + ("" if run.argv else f" (pass the script's own arguments after --: fsdp-lint {run.display} -- ARGS)"))
    if not run.project.reaches_fsdp and not run.rec.wrap_calls:
        return        # a model file whose __main__ block exits (a test runner, a demo)
    handled = exc.__context__
    if isinstance(handled, Exception):
        # `except ImportError: print("pip install x"); exit(1)`: the failure it was handling is the cause
        where = _innermost_project_line(handled)
        at = f"{_display(where[0], run.path, run.shown)}:{where[1]}: " if where else ""
        text = _one_line(handled)
        if run.failures.root_cause(handled) is not None:     # a name a skipped statement should have bound
            first = run.failures.skips[0]
            first = (f" (it follows from what failed and was skipped before it; the first: "
                     f"{_display(first.skipped.path, run.path, run.shown)}:{first.skipped.line}: {first.skipped.error})")
        else:
            first = package_hint(handled, text)
        raise ReplayError(f"{run.display}: the script exited with status {code!r} before training started, "
                          f"handling {at}{text}{first}")
    detail = f": {last_error}" if last_error else ""
    raise ReplayError(f"{run.display}: the script exited with status {code!r} before training started{detail}")


def stops_itself(exc: BaseException) -> bool:
    """The script's own stop that is neither a failure nor ``sys.exit``: pytest's skip of a module whose optional
    package is missing (``except ImportError: pytest.skip(..., allow_module_level=True)``, ``pytest.importorskip``;
    a BaseException), or any BaseException of the script raised while it handled an ImportError."""
    if isinstance(exc, (Exception, SystemExit, KeyboardInterrupt, GeneratorExit)):
        return False
    return _pytest_outcome(exc) or isinstance(exc.__context__, ImportError)


def _pytest_outcome(exc: BaseException) -> bool:
    """pytest's skip/exit/fail of the module (its classes say `builtins` for their module)."""
    import sys

    outcomes = sys.modules.get("_pytest.outcomes")
    return outcomes is not None and isinstance(exc, getattr(outcomes, "OutcomeException", ()))


def on_own_stop(run, exc: BaseException) -> None:
    """The script stopped itself (`stops_itself`): on an import that failed, that import and its package."""
    how = f"pytest.{type(exc).__name__.lower().replace('skipped', 'skip').replace('failed', 'fail')}" \
        if _pytest_outcome(exc) else type(exc).__name__
    reason = getattr(exc, "msg", None) or str(exc)
    said = f"{how}: {reason}" if reason else how
    handled = exc.__context__
    named = re.search(r"No module named '([^']+)'", reason) if _pytest_outcome(exc) else None
    if not isinstance(handled, ImportError) and named:      # pytest.importorskip raises after its `except`
        handled = ModuleNotFoundError(named.group(0), name=named.group(1))
        handled.__traceback__ = exc.__traceback__
    if isinstance(handled, ImportError):
        where = _innermost_project_line(handled)
        at = f"{_display(where[0], run.path, run.shown)}:{where[1]}" if where else run.display
        text = run.failures.describe_import_error(handled) or (_one_line(handled) + package_hint(handled, ""))
        raise ReplayError(f"{at}: {text} (the script stops itself there, as on a node without it: {said})")
    where = _innermost_project_line(exc)
    at = f"{_display(where[0], run.path, run.shown)}:{where[1]}" if where else run.display
    raise ReplayError(f"{at}: the script stopped itself before it built a model ({said})")


def install_exit(rec, patch) -> None:
    """``os._exit(0)`` after statements failed and were skipped (verl's driver after ``ray.get(runner.run.remote(
    cfg))``, whose remote run failed on a folder this machine lacks) ends the script as ``sys.exit`` does
    (`on_exit`), so the first failure is reported; it ended the process linting it, and with it that report. With
    nothing failed before, it ends the process as it always did (a settings module that gives up at import: the
    lint says the file ended it), and a process the setup forks (a loader's worker) exits at once."""
    import os

    real_exit, main = os._exit, os.getpid()

    def _exit(status):
        failures = getattr(getattr(rec, "record_skip", None), "__self__", None)
        if os.getpid() != main or not getattr(failures, "skips", None):
            real_exit(status)
        raise SystemExit(status)

    patch(os, "_exit", _exit)
