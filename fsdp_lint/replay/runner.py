"""Running a file's setup code in the sandbox and turning what happened into a ReplayResult."""
from __future__ import annotations

import ast
import contextlib
import os
import re
import sys
import types
from typing import Dict, List, Optional, Tuple

from fsdp_lint.replay.recorders import Recorder
from fsdp_lint.replay.records import (
    _MISSING,
    ReplayError,
    ReplayResult,
    _counter,
    _StopReplay,
)
from fsdp_lint.replay.sandbox import _guarded_builtins, _stub_import, sandbox
from fsdp_lint.replay.targets import (
    ModelTarget,
    _call_helper,
    _discover_model,
    _LazyOverride,
    _load_target,
)
from fsdp_lint.replay.transform import (
    _CHECKPOINT,
    _REBIND,
    _SKIP,
    _STUB_IMPORT,
    _binds,
    compile_replay,
)
from fsdp_lint.source import SourceFacts


# --------------------------------------------------------------------------------------------
# the replay
# --------------------------------------------------------------------------------------------
def replay(facts: SourceFacts, world_size: int, target: Optional[ModelTarget] = None, real: bool = False,
           timeout: Optional[float] = None, device=None, gpus_per_node: Optional[int] = None) -> ReplayResult:
    missing: List[str] = []
    try:
        return _replay(facts, world_size, target, real, timeout, device, missing,
                       gpus_per_node=gpus_per_node)  # issue 11: the simulated node size
    except ReplayError as exc:
        if not missing:
            raise
        # the file imports something that is not installed here (transformers, peft, a package
        # of the training repository): that is most likely why it failed
        names = ", ".join(dict.fromkeys(missing))
        raise ReplayError(f"{exc} (not importable here: {names}; install it to lint this file)") from exc


def _replay(facts: SourceFacts, world_size: int, target: Optional[ModelTarget], real: bool,
            timeout: Optional[float], device, missing: List[str], gpus_per_node: Optional[int] = None) -> ReplayResult:
    import torch.nn as nn

    path = os.path.abspath(facts.path)
    rec = Recorder(path, world_size, real=real)
    rec.device = device
    rec.gpus_per_node = gpus_per_node  # issue 11: LOCAL_WORLD_SIZE / device_count() (replay/parallel.py)
    rec.api = facts.api
    code, spans = compile_replay(facts)
    rec.terminal_spans = spans
    mod_name = f"__fsdp_lint_replay_{next(_counter)}__"
    module = types.ModuleType(mod_name)
    module.__file__ = path
    ns = module.__dict__
    ns.update({
        "__builtins__": _guarded_builtins(),
        _CHECKPOINT: rec.checkpoint,
        _SKIP: rec.skip,
        _STUB_IMPORT: lambda names, globs, module=None: (missing.append(module or names[0]),
                                                         _stub_import(names, globs)),
        _REBIND: lambda g: None,
    })
    basename = os.path.basename(path)
    root = None
    how = None
    with sandbox(rec, os.path.dirname(path)):
        sys.modules[mod_name] = module
        override = None
        if target is not None:
            override = _load_target(target, facts, ns, rec)
            ns[_REBIND] = override.rebind
        try:
            with _alarm(timeout):
                exec(code, ns)
        except _StopReplay:
            pass
        except _ReplayTimeout:
            raise ReplayError(f"{basename}: replaying the setup code took longer than {timeout:.0f} s") from None
        except SystemExit as exc:
            raise ReplayError(f"{basename}: the setup code called sys.exit({exc.code!r})") from None
        except ReplayError:
            raise
        except Exception as exc:
            raise ReplayError(_describe_failure(basename, exc, path, rec, facts)) from exc

        if isinstance(override, _LazyOverride) and override.callable is None:
            # --model names something in the linted file itself: it must exist even when the file
            # builds and wraps its own model (an unknown --model is a usage error, exit 2)
            obj = ns.get(target.name.split(".")[0])
            for part in target.name.split(".")[1:]:
                obj = getattr(obj, part, None)
            if not callable(obj):
                raise ReplayError(f"--model {target.text}: {target.name!r} is not defined in {basename}")

        if not rec.wrap_calls:
            # library-style files: wrap helpers that the file defines but never calls; entry points
            # without required arguments (``main()`` run by ``fire``/``typer``) build their own model
            helpers = facts.uncalled_wrap_helpers()
            for helper in [h for h in helpers if h.defaults == len(h.params)]:
                fn = ns.get(helper.name)
                if callable(fn) and not rec.wrap_calls:
                    try:
                        with _alarm(timeout):
                            fn()
                    except _StopReplay:
                        pass
                    except Exception:
                        rec.wrap_calls.clear()
            if not rec.wrap_calls and (helpers or override is not None):
                root, how = _discover_model(facts, ns, rec, override)
                for helper in helpers:
                    fn = ns.get(helper.name)
                    if callable(fn) and (helper.params and helper.defaults < len(helper.params)):
                        try:
                            _call_helper(fn, helper, root, rec)
                        except _StopReplay:
                            pass
                        except Exception as exc:
                            raise ReplayError(_describe_failure(basename, exc, path, rec, facts)) from exc
        if not rec.real:
            _undo_after_last_wrap(rec)
        if rec.wrap_calls:
            root = _root_of(rec)
            how = how or _describe_root(root, ns, basename)
            if override is not None and not override.used:
                # the file wraps a model of its own: applying its wrap code (policies naming the file's
                # own block classes) to another model would report a plan nobody wrote
                raise ReplayError(
                    f"--model {target.text}: {basename} never builds {target.name}; its wrap code wraps its "
                    f"own {type(root).__name__}. Use --model {basename}:{type(root).__name__}(...) to change that "
                    f"model's arguments, or lint the file that builds {target.name}")
        elif root is None:
            root, how = _discover_model(facts, ns, rec, override)
        if override is not None and override.used:
            how = target.text
    if not isinstance(root, nn.Module):
        raise ReplayError(f"{basename}: could not find the model")
    return ReplayResult(model=root, target=how, wrap_calls=rec.wrap_calls, optimizers=rec.optimizers,
                        param_events=rec.param_events, skipped=rec.skipped, world_size=world_size,
                        mesh_sizes=rec.mesh_sizes, namespace=ns,
                        parallel=getattr(rec, "parallel", None))  # issue 11


class _ReplayTimeout(BaseException):
    pass


def _undo_after_last_wrap(rec: Recorder) -> None:
    """Put back the sub-modules and parameters that code after the last wrap call replaced."""
    for kind, owner, name, old, child, old_parent in reversed(rec.undo):
        table = owner._modules if kind == "module" else owner._parameters
        if old is _MISSING:
            table.pop(name, None)
        else:
            table[name] = old
        if kind == "module" and child is not None:
            if old_parent is _MISSING:
                rec.parents.pop(id(child), None)
            else:
                rec.parents[id(child)] = old_parent
    rec.undo.clear()


@contextlib.contextmanager
def _alarm(seconds: Optional[float]):
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise _ReplayTimeout()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)



def _describe_failure(basename: str, exc: BaseException, path: str, rec: Optional[Recorder] = None,
                      facts: Optional[SourceFacts] = None) -> str:
    import traceback

    where_real = "with the real FSDP APIs" if rec is not None and rec.real else "on the meta device"
    cause = _skipped_cause(exc, rec, facts) if rec is not None and facts is not None else None
    if cause is not None:
        # a name is missing because the statement that binds it failed earlier (typically the
        # model's constructor): that failure is the one to report
        line, err = cause
        return f"{basename}:{line}: setup code failed {where_real}: {err[:300]}" + _download_hint(err, basename)
    line = None
    for fs in reversed(traceback.extract_tb(exc.__traceback__)):
        if os.path.abspath(fs.filename) == path:
            line = fs.lineno
            break
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = f"{basename}:{line}" if line else basename
    return f"{where}: setup code failed {where_real}: {type(exc).__name__}: {msg[:300]}" + _download_hint(msg, basename)


def _download_hint(msg: str, basename: str) -> str:
    """fsdp-lint never downloads: a hub model needs its config locally, or a factory from a config."""
    if "huggingface.co" in msg or "from_pretrained" in msg or "cached files" in msg:
        return (" (fsdp-lint does not download models or configs: have the model's config.json in the local "
                "Hugging Face cache (HF_HOME), or build the model from a config in the linted code, e.g. "
                "AutoModelForCausalLM.from_config(AutoConfig.for_model(...)))")
    return ""


def _skipped_cause(exc: BaseException, rec: Recorder, facts: SourceFacts) -> Optional[Tuple[int, str]]:
    if not isinstance(exc, NameError) or not rec.skipped:
        return None
    name = getattr(exc, "name", None)
    if not name:
        m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", str(exc))
        name = m.group(1) if m else None
    if not name:
        return None
    try:
        tree = ast.parse(facts.text)
    except SyntaxError:
        return None
    binders = {node.lineno for node in ast.walk(tree)
               if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.ClassDef, ast.For, ast.While, ast.If,
                                                                      ast.With, ast.Try))
               and name in _binds(node)}
    for line, err in reversed(rec.skipped):
        if line in binders:
            return line, err
    return None


def _root_of(rec: Recorder):
    """The top ancestor of the wrapped modules (the model the file builds)."""
    def top(m):
        seen = set()
        while id(m) in rec.parents and id(m) not in seen:
            seen.add(id(m))
            m = rec.parents[id(m)]
        return m

    last = rec.wrap_calls[-1]
    candidates = []
    for call in rec.wrap_calls:
        for m in call.modules:
            candidates.append(top(m))
    # the root that contains the most wrapped modules, preferring the last call's
    best = top(last.modules[0])
    counts: Dict[int, int] = {}
    for c in candidates:
        counts[id(c)] = counts.get(id(c), 0) + 1
    if counts.get(id(best), 0) * 2 < len(candidates):
        best = max(candidates, key=lambda c: counts[id(c)])
    return best


def _describe_root(root, ns, basename: str) -> str:
    return f"{basename}:{type(root).__name__}"
