"""Finding the model: --model targets, factories, module classes, uncalled wrap helpers."""
from __future__ import annotations

import ast
import os
import re
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from fsdp_lint.replay.recorders import FakeMesh, Recorder
from fsdp_lint.replay.records import ReplayError, _StopReplay
from fsdp_lint.replay.sandbox import _guarded_builtins, _stub_import
from fsdp_lint.replay.transform import (
    _CHECKPOINT,
    _REBIND,
    _SKIP,
    _STUB_IMPORT,
    compile_replay,
)
from fsdp_lint.source import SourceFacts


# --------------------------------------------------------------------------------------------
# model targets (--model)
# --------------------------------------------------------------------------------------------
@dataclass
class ModelTarget:
    source: Optional[str]      # "path.py" or "pkg.mod"
    name: str                  # "Transformer" / "build_model"
    kwargs: Dict[str, Any]
    text: str

    @classmethod
    def parse(cls, text: str) -> "ModelTarget":
        raw = text.strip()
        source, sep, rest = raw.rpartition(":")
        if not sep:
            source, rest = None, raw
        if source is not None and len(source) == 1 and source.isalpha():  # a Windows drive letter
            source, rest = None, raw
        name, kwargs = rest, {}
        if "(" in rest:
            if not rest.endswith(")"):
                raise ReplayError(f"invalid --model target {text!r}: expected NAME(key=literal, ...)")
            name = rest[: rest.index("(")]
            try:
                call = ast.parse(rest, mode="eval").body
                assert isinstance(call, ast.Call) and not call.args
                kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
            except Exception:
                raise ReplayError(
                    f"invalid --model target {text!r}: arguments must be literal keywords, e.g. "
                    f"Transformer(num_layers=4)") from None
        if not name.isidentifier() and not all(p.isidentifier() for p in name.split(".")):
            raise ReplayError(f"invalid --model target {text!r}: {name!r} is not a name")
        return cls(source=source or None, name=name, kwargs=kwargs, text=raw)



class _Override:
    def __init__(self, target: ModelTarget, callable_obj, ns):
        self.target = target
        self.callable = callable_obj
        self.used = False
        self._factory = None
        self.ns = ns

    def build(self):
        obj = self.callable(**self.target.kwargs)
        self.used = True
        return obj

    def rebind(self, globs: dict) -> None:
        for key, value in list(globs.items()):
            if key.startswith("__"):
                continue
            if value is self.callable or (_same_callable(value, self.callable) and value is not self._factory):
                globs[key] = self._make_factory(value)

    def _make_factory(self, original):
        if self._factory is not None:
            return self._factory
        override = self
        if isinstance(original, type):
            # a subclass keeps isinstance checks and class-name lookups working
            def __new__(cls, *args, **kwargs):
                override.used = True
                merged = {**kwargs, **override.target.kwargs}
                obj = original.__new__(original)
                obj.__init__(*args, **merged)
                return obj
            factory = types.new_class(original.__name__, (original,), {}, lambda ns: ns.update({"__new__": __new__}))
            factory.__qualname__ = original.__qualname__
            factory.__module__ = original.__module__
        else:
            def factory(*args, **kwargs):
                override.used = True
                return original(*args, **{**kwargs, **override.target.kwargs})
        self._factory = factory
        return factory


def _same_callable(a, b) -> bool:
    return (callable(a) and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", object())
            and getattr(a, "__name__", None) == getattr(b, "__name__", None)
            and _src_stem(a) == _src_stem(b))


def _src_stem(obj) -> Optional[str]:
    mod = sys.modules.get(getattr(obj, "__module__", "") or "")
    f = getattr(mod, "__file__", None)
    return os.path.splitext(os.path.basename(f))[0] if f else None


def _load_target(target: ModelTarget, facts: SourceFacts, ns: dict, rec: Recorder) -> _Override:
    import importlib
    import importlib.util

    path = os.path.abspath(facts.path)
    src = target.source
    if src is None or (src.endswith(".py") and os.path.abspath(src) == path):
        # resolved lazily against the replayed file's own namespace
        return _LazyOverride(target, ns)
    if src.endswith(".py") or os.sep in src or "/" in src:
        if not os.path.isfile(src):
            raise ReplayError(f"--model {target.text}: no such file {src!r}")
        from fsdp_lint.source import read_source

        sub_facts = read_source(src)
        sub_code, spans = compile_replay(sub_facts)
        rec.terminal_spans.update(spans)
        stem = os.path.splitext(os.path.basename(src))[0]
        mod = types.ModuleType(stem)
        mod.__file__ = os.path.abspath(src)
        sys.modules.setdefault(stem, mod)
        mod.__dict__.update({_CHECKPOINT: lambda: None, _SKIP: rec.skip, _STUB_IMPORT: _stub_import,
                             _REBIND: lambda g: None, "__builtins__": _guarded_builtins()})
        sys.path.insert(0, os.path.dirname(os.path.abspath(src)))
        try:
            exec(sub_code, mod.__dict__)
        except _StopReplay:
            pass
        except Exception as exc:
            raise ReplayError(f"--model {target.text}: cannot load {src}: {type(exc).__name__}: {exc}") from None
        obj = mod.__dict__.get(target.name)
    else:
        try:
            mod = importlib.import_module(src)
        except Exception as exc:
            raise ReplayError(f"--model {target.text}: cannot import {src!r}: {type(exc).__name__}: {exc}") from None
        obj = mod
        for part in target.name.split("."):
            obj = getattr(obj, part, None)
    if not callable(obj):
        raise ReplayError(f"--model {target.text}: {target.name!r} not found in {src}")
    return _Override(target, obj, ns)


class _LazyOverride(_Override):
    """A target defined in the linted file itself: found once its definition has run."""

    def __init__(self, target: ModelTarget, ns):
        super().__init__(target, None, ns)

    def rebind(self, globs: dict) -> None:
        if self.callable is None:
            obj = globs.get(self.target.name.split(".")[0])
            for part in self.target.name.split(".")[1:]:
                obj = getattr(obj, part, None)
            if obj is None or not callable(obj):
                return
            self.callable = obj
        super().rebind(globs)

    def build(self):
        if self.callable is None:
            self.rebind(self.ns)
        if self.callable is None:
            raise ReplayError(f"--model {self.target.text}: {self.target.name!r} is not defined in the file")
        return super().build()


def _discover_model(facts: SourceFacts, ns: dict, rec: Recorder, override: Optional[_Override]):
    import torch.nn as nn

    basename = os.path.basename(facts.path)
    if override is not None:
        try:
            model = override.build()
        except ReplayError:
            raise
        except Exception as exc:
            raise ReplayError(f"--model {override.target.text}: cannot build it on the meta device: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        if not isinstance(model, nn.Module):
            raise ReplayError(f"--model {override.target.text}: returned {type(model).__name__}, not an nn.Module")
        return model, override.target.text
    errors = []
    for name in facts.factories():
        fn = ns.get(name)
        if callable(fn):
            try:
                model = fn()
            except Exception as exc:
                errors.append(f"{name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            if isinstance(model, nn.Module):
                return model, f"{basename}:{name}"
    for cls_name in _top_module_classes(facts, ns):
        cls = ns.get(cls_name)
        try:
            model = cls()
        except Exception as exc:
            errors.append(f"{cls_name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        return model, f"{basename}:{cls_name}"
    if errors:
        raise ReplayError(f"{basename}: cannot build the model on the meta device: {errors[0]}"
                          f" (pass --model {basename}:Class(arg=...) to choose the model and its arguments)")
    raise ReplayError(f"{basename}: no model found: define an nn.Module, a build_model() factory, "
                      f"or pass --model path.py:Class")


def _top_module_classes(facts: SourceFacts, ns: dict) -> List[str]:
    """nn.Module classes of this file that no other module class of the file uses, last first."""
    import torch.nn as nn

    classes = [(name, line) for name, line in facts.module_classes
               if isinstance(ns.get(name), type) and issubclass(ns[name], nn.Module)]
    text_lines = facts.text.splitlines()
    used = set()
    for name, line in classes:
        cls = ns[name]
        try:
            import inspect

            src = inspect.getsource(cls)
        except Exception:
            src = "\n".join(text_lines[line - 1: line + 200])
        for other, _ in classes:
            if other != name and re.search(rf"\b{re.escape(other)}\b", src.split("\n", 1)[-1]):
                used.add(other)
        # base classes are not "used" as components
    tops = [n for n, _ in classes if n not in used]
    rest = [n for n, _ in classes if n in used]
    return list(reversed(tops)) + list(reversed(rest))




def _call_helper(fn, helper, model, rec: Recorder):
    """Call a wrap helper the file never calls, with the model and simulated arguments."""
    import inspect

    sig = inspect.signature(fn)
    args = []
    kwargs = {}
    for i, (name, param) in enumerate(sig.parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        lname = name.lower()
        if i == 0 or lname in ("model", "module", "net", "network"):
            value = model
        elif "mesh" in lname:
            value = FakeMesh("cuda", (rec.world_size,))
        elif lname in ("world_size", "ws", "num_gpus", "dp_size", "dp_shard"):
            value = rec.world_size
        elif lname in ("rank", "local_rank", "global_rank"):
            value = 0
        elif param.default is not param.empty:
            continue
        elif "device" in lname:
            value = "cuda"
        else:
            value = None
        if param.kind == param.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    fn(*args, **kwargs)
