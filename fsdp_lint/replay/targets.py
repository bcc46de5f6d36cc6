"""Finding the model: ``--model`` targets, models built while the setup code ran, factories and
module classes of the file, and wrap helpers the file defines but never calls.

``--model`` accepts what real constructors need, evaluated safely (literals, names, attribute
chains and calls of named callables -- nothing else):

* ``path.py:Class`` / ``path.py:factory`` / ``pkg.mod:factory``, with arguments:
  ``path.py:Transformer(num_layers=4)``;
* ``path.py:Class.classmethod(...)`` (``model.py:GPT.from_name("7B")``);
* nested calls with config objects: ``model.py:GPT(GPTConfig(n_layer=2))`` (a bare name is looked up
  in the target's own module), ``pkg.mod:build(cfg=pkg.cfg:Config.from_name("x"))``;
* ``train.py:main`` -- a function that builds and wraps: it is called and its wrap calls recorded.
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_lint.replay.line_values import dotted_path
from fsdp_lint.replay.recorders import FakeMesh, Recorder
from fsdp_lint.replay.records import FSDP_LINT_DIR, NoModelError, ReplayError, TrainingBoundary
from fsdp_lint.entry.source import SourceFacts
from fsdp_lint.model.tree import user_class

_CO_OPTIMIZED = 0x1          # inspect.CO_OPTIMIZED: a function's code (not a module or class body)

# `path.py:Name` or `pkg.mod:Name.attr` inside a target expression
_REF = re.compile(
    r"(?P<src>(?:[A-Za-z]:[\\/])?[\w./\\-]+\.py|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


# --------------------------------------------------------------------------------------------
# model targets (--model)
# --------------------------------------------------------------------------------------------
@dataclass
class ModelTarget:
    source: Optional[str]      # "path.py" or "pkg.mod" (None: the linted file)
    name: str                  # "Transformer" / "build_model" / "GPT.from_name"
    text: str
    call: Optional[ast.Call] = None                       # the argument list, when given
    refs: Dict[str, Tuple[str, str]] = field(default_factory=dict)   # placeholder -> (source, dotted name)

    @property
    def kwargs(self) -> Dict[str, Any]:
        """The literal keyword arguments (what a target without nested calls carries)."""
        if self.call is None:
            return {}
        out = {}
        for kw in self.call.keywords:
            try:
                out[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                pass
        return out

    @classmethod
    def parse(cls, text: str) -> "ModelTarget":
        raw = text.strip()
        refs: Dict[str, Tuple[str, str]] = {}

        def placeholder(m: "re.Match") -> str:
            key = f"__fsdp_lint_ref{len(refs)}__"
            refs[key] = (m.group("src"), m.group("name"))
            return key

        expr = _REF.sub(placeholder, raw, count=0) if ":" in raw else raw
        try:
            node = ast.parse(expr, mode="eval").body
        except SyntaxError:
            raise ReplayError(f"invalid --model target {_shown(text)}: expected [path.py:]NAME or "
                              f"NAME(arg, key=value, ...)") from None
        except (RecursionError, MemoryError):
            raise ReplayError(f"invalid --model target {_shown(text)}: its expression nests too deeply "
                              f"(literals, names and calls are evaluated)") from None
        call = node if isinstance(node, ast.Call) else None
        head = node.func if call is not None else node
        dotted = dotted_path(head)
        if dotted is None:
            raise ReplayError(f"invalid --model target {_shown(text)}: {_unparsed(head)!r} is not a name")
        source = None
        first = dotted.split(".")[0]
        if first in refs:
            source, ref_name = refs.pop(first)
            dotted = ref_name + dotted[len(first):]
        if source is not None and len(source) == 1 and source.isalpha():  # pragma: no cover - drive letter
            source = None
        if call is not None:
            for arg in list(call.args) + [k.value for k in call.keywords]:
                _check_safe(arg, text)
            if any(k.arg is None for k in call.keywords):
                raise ReplayError(f"invalid --model target {_shown(text)}: **kwargs are not supported")
        return cls(source=source, name=dotted, text=raw, call=call, refs=refs)

    def arguments(self, resolve: Callable[[str], Any]) -> Tuple[List[Any], Dict[str, Any]]:
        """The evaluated (args, kwargs); `resolve` looks a bare name up in the target's module."""
        if self.call is None:
            return [], {}

        def lookup(name: str) -> Any:
            if name in self.refs:
                return load_object(*self.refs[name], text=self.text)
            return resolve(name)

        args = [_evaluate(a, lookup, self.text) for a in self.call.args]
        kwargs = {k.arg: _evaluate(k.value, lookup, self.text) for k in self.call.keywords}
        return args, kwargs




_SAFE = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Name, ast.Attribute, ast.Call, ast.UnaryOp,
         ast.USub, ast.UAdd, ast.Load, ast.keyword)


_SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bool", "range", "slice",
                  "complex", "bytes", "None", "True", "False"}


def _shown(text: str) -> str:
    """The target in a message: whole if short, else its start (a message is one readable line)."""
    return repr(text) if len(text) <= 200 else f"{text[:120]!r}... ({len(text):,} characters)"


def _unparsed(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except RecursionError:
        return type(node).__name__
    return text if len(text) <= 120 else text[:100] + "..."


def _check_safe(node: ast.AST, text: str) -> None:
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name is not None and name.startswith("__") and not name.startswith("__fsdp_lint_ref"):
            raise ReplayError(f"invalid --model target {_shown(text)}: {name!r} is not allowed (only literals, names and "
                              f"calls of named callables are evaluated)")
        if not isinstance(n, _SAFE):
            raise ReplayError(f"invalid --model target {_shown(text)}: only literals, names and calls of named callables "
                              f"are evaluated, not {_unparsed(n) if isinstance(n, ast.expr) else type(n).__name__}")
        if isinstance(n, ast.Call) and dotted_path(n.func) is None:
            raise ReplayError(f"invalid --model target {_shown(text)}: {_unparsed(n.func)!r} is not a named callable")


def _evaluate(node: ast.AST, lookup: Callable[[str], Any], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, lookup, text)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_evaluate(e, lookup, text) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        return {_evaluate(k, lookup, text): _evaluate(v, lookup, text) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return lookup(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate(node.value, lookup, text), node.attr)
    if isinstance(node, ast.Call):
        fn = _evaluate(node.func, lookup, text)
        if not callable(fn):
            raise ReplayError(f"--model {text}: {_unparsed(node.func)} is not callable")
        args = [_evaluate(a, lookup, text) for a in node.args]
        kwargs = {k.arg: _evaluate(k.value, lookup, text) for k in node.keywords}
        return fn(*args, **kwargs)
    raise ReplayError(f"invalid --model target {_shown(text)}")  # pragma: no cover - _check_safe rejects it


def load_object(source: str, dotted: str, *, text: str) -> Any:
    """`dotted` in module `source` (a path or an importable name), imported the way the replay
    imports project modules."""
    module = load_module(source, text=text)
    obj: Any = module
    for part in dotted.split("."):
        if not hasattr(obj, part):
            raise ReplayError(f"--model {text}: {dotted!r} not found in {source}")
        obj = getattr(obj, part)
    return obj


def load_module(source: str, *, text: str):
    if source.endswith(".py") or os.sep in source or "/" in source:
        path = os.path.abspath(source)
        if not os.path.isfile(path):
            raise ReplayError(f"--model {text}: no such file {source!r}")
        from fsdp_lint.entry.project import entry_for

        entry = entry_for(path)
        if entry.root not in sys.path:
            sys.path.insert(0, entry.root)
        name = entry.module
    else:
        name = source
    try:
        return importlib.import_module(name)
    except TrainingBoundary:
        raise
    except Exception as exc:
        raise ReplayError(f"--model {text}: cannot import {source}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc


# --------------------------------------------------------------------------------------------
# the override: the file's own calls of the target get the target's arguments
# --------------------------------------------------------------------------------------------
class Override:
    def __init__(self, target: ModelTarget, callable_obj, ns: dict, module_ns: Optional[dict] = None):
        self.target = target
        self.callable = callable_obj
        self.used = False
        self.called_main = False
        self._factory = None
        self.ns = ns                     # the linted file's namespace
        self.module_ns = module_ns       # the target's module namespace (bare names in arguments)

    def _resolve(self, name: str) -> Any:
        for space in (self.module_ns, self.ns):
            if space is not None and name in space:
                return space[name]
        import builtins

        if name in _SAFE_BUILTINS and hasattr(builtins, name):
            return getattr(builtins, name)
        raise ReplayError(f"--model {self.target.text}: {name!r} is not defined in "
                          f"{self.target.source or 'the linted file'}")

    def arguments(self) -> Tuple[List[Any], Dict[str, Any]]:
        return self.target.arguments(self._resolve)

    def build(self):
        args, kwargs = self.arguments()
        self.used = True
        return self.callable(*args, **kwargs)

    def rebind(self, globs: dict) -> None:
        if "." in self.target.name:
            return                      # a classmethod target is built, not substituted
        for key, value in list(globs.items()):
            if key.startswith("__"):
                continue
            if value is self.callable or (_same_callable(value, self.callable) and value is not self._factory):
                globs[key] = self._make_factory(value)

    def _merge(self, args, kwargs):
        t_args, t_kwargs = self.arguments()
        return list(t_args) + list(args[len(t_args):]), {**kwargs, **t_kwargs}

    def _make_factory(self, original):
        if self._factory is not None:
            return self._factory
        override = self
        if isinstance(original, type):
            # a subclass keeps isinstance checks and class-name lookups working
            def __new__(cls, *args, **kwargs):
                override.used = True
                args, kwargs = override._merge(args, kwargs)
                obj = original.__new__(original)
                obj.__init__(*args, **kwargs)
                return obj
            factory = types.new_class(original.__name__, (original,), {}, lambda ns: ns.update({"__new__": __new__}))
            factory.__qualname__ = original.__qualname__
            factory.__module__ = original.__module__
        else:
            def factory(*args, **kwargs):
                override.used = True
                args, kwargs = override._merge(args, kwargs)
                return original(*args, **kwargs)
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


class LazyOverride(Override):
    """A target defined in the linted file itself: found once its definition has run."""

    def __init__(self, target: ModelTarget, ns):
        super().__init__(target, None, ns, ns)

    def _find(self, globs: dict):
        obj = globs.get(self.target.name.split(".")[0])
        for part in self.target.name.split(".")[1:]:
            obj = getattr(obj, part, None)
        return obj if obj is not None and callable(obj) else None

    def rebind(self, globs: dict) -> None:
        if self.callable is None and globs is self.ns:
            self.callable = self._find(globs)
        if self.callable is not None:
            super().rebind(globs)

    def build(self):
        if self.callable is None:
            self.callable = self._find(self.ns)
        if self.callable is None:
            raise ReplayError(f"--model {self.target.text}: {self.target.name!r} is not defined in the file")
        return super().build()


def load_target(target: ModelTarget, entry_path: str, ns: dict) -> Override:
    """The override for `target`; the linted file's own targets are resolved once they are defined."""
    src = target.source
    if src is None or (src.endswith(".py") and os.path.abspath(src) == entry_path):
        return LazyOverride(target, ns)
    module = load_module(src, text=target.text)
    obj: Any = module
    for part in target.name.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise ReplayError(f"--model {target.text}: {target.name!r} not found in {src}")
    return Override(target, obj, ns, module.__dict__)


# --------------------------------------------------------------------------------------------
# discovery
# --------------------------------------------------------------------------------------------
def build_override(override: Override, rec: Recorder):
    """Build the `--model` target; a function that builds and wraps (``main``) gives the model it
    wrapped or built."""
    import torch.nn as nn

    try:
        model = override.build()
    except (ReplayError, TrainingBoundary):
        raise
    except Exception as exc:
        raise ReplayError(f"--model {override.target.text}: cannot build it on the meta device: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    if isinstance(model, nn.Module):
        return model
    if rec.wrap_calls:
        return None                     # the caller takes the wrapped root
    built = largest_built_model(rec)
    if built is not None:
        return built[0]
    raise ReplayError(f"--model {override.target.text}: returned {type(model).__name__}, not an nn.Module, and "
                      f"built no model")


def built_by_an_import(frame, entry_path: str) -> bool:
    """Whether the module whose ``__init__`` chain runs in `frame` is built by the module-level code of a
    module other than the linted file (while it is imported): the first frame above the constructors."""
    import torch

    skip = (os.path.dirname(torch.__file__) + os.sep, FSDP_LINT_DIR + os.sep)
    while frame is not None and (frame.f_code.co_name == "__init__" or frame.f_code.co_filename.startswith(skip)):
        frame = frame.f_back
    # a class body (its defaults are evaluated there) runs in the module that defines it
    while frame is not None and frame.f_code.co_name != "<module>" and not frame.f_code.co_flags & _CO_OPTIMIZED:
        frame = frame.f_back
    return (frame is not None and frame.f_code.co_name == "<module>"
            and os.path.abspath(frame.f_code.co_filename) != entry_path)


def largest_built_model(rec: Recorder) -> Optional[Tuple[Any, Any]]:
    """The largest root module the setup code built (model, position), or None."""
    best = None
    best_numel = 0
    for module, pos in rec.constructed:
        if id(module) in rec.parents or id(module) in rec.built_at_import:
            continue
        numel = sum(p.numel() for p in module.parameters())
        if numel > best_numel:
            best, best_numel = (module, pos), numel
    return best


def discover_model(facts: SourceFacts, ns: dict, rec: Recorder, display: str):
    """The model of a file that wraps nothing: built by its setup code, else a factory, else the
    top module class."""
    import torch.nn as nn

    built = largest_built_model(rec)
    if built is not None:
        model, pos = built
        return model, f"{display}:{user_class(model).__name__}"
    errors = []
    for name in facts.factories():
        fn = ns.get(name)
        if callable(fn):
            try:
                model = fn()
            except TrainingBoundary:
                raise
            except Exception as exc:
                errors.append(f"{name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            if isinstance(model, nn.Module):
                return model, f"{display}:{name}"
    for cls_name in _top_module_classes(facts, ns):
        cls = ns.get(cls_name)
        try:
            model = cls()
        except TrainingBoundary:
            raise
        except Exception as exc:
            errors.append(f"{cls_name}(): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        return model, f"{display}:{cls_name}"
    shown = os.path.relpath(facts.path) if not os.path.relpath(facts.path).startswith("..") else facts.path
    if errors:
        raise NoModelError(f"{display}: cannot build the model on the meta device: {errors[0]}"
                           f" (pass --model {shown}:Class(arg=...) to choose the model and its arguments)")
    raise NoModelError(f"{display}: no model found: define an nn.Module, a build_model() factory, "
                       f"or pass --model path.py:Class")


def _top_module_classes(facts: SourceFacts, ns: dict) -> List[str]:
    """nn.Module classes of this file that no other module class of the file uses, last first."""
    import inspect

    import torch.nn as nn

    classes = [(name, line) for name, line in facts.module_classes
               if isinstance(ns.get(name), type) and issubclass(ns[name], nn.Module)]
    text_lines = facts.text.splitlines()
    used = set()
    for name, line in classes:
        cls = ns[name]
        try:
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


# --------------------------------------------------------------------------------------------
# wrap helpers the file defines but never calls
# --------------------------------------------------------------------------------------------
_MODEL_PARAMS = ("model", "module", "net", "network", "m")
_WORLD_PARAMS = ("world_size", "ws", "num_gpus", "dp_size", "dp_shard", "dp_degree", "fsdp_size")
_RANK_PARAMS = ("rank", "local_rank", "global_rank")


def helper_arguments(fn, model, rec: Recorder, display: str) -> Tuple[List[Any], Dict[str, Any]]:
    """Arguments for a wrap helper the file never calls: the model, a simulated mesh, the world
    size, rank 0, "cuda"; any other required argument cannot be made up (ReplayError)."""
    import inspect

    sig = inspect.signature(fn)
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    unfilled: List[str] = []
    for i, (name, param) in enumerate(sig.parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        lname = name.lower()
        if i == 0 or lname in _MODEL_PARAMS:
            value = model
        elif "mesh" in lname:
            value = FakeMesh("cuda", (rec.world_size,))
        elif lname in _WORLD_PARAMS:
            value = rec.world_size
        elif lname in _RANK_PARAMS:
            value = 0
        elif param.default is not param.empty:
            continue
        elif "device" in lname:
            value = "cuda"
        else:
            unfilled.append(name)
            continue
        if param.kind == param.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    if unfilled:
        shown = ", ".join(f"`{n}`" for n in unfilled)
        params = ", ".join(sig.parameters)
        raise ReplayError(
            f"{display}: {fn.__name__}({params}) wraps the model but is never called here, and fsdp-lint does not "
            f"make up its argument{'s' if len(unfilled) > 1 else ''} {shown}: lint the entry point that calls it, "
            f"with the script's arguments (fsdp-lint train.py -- ARGS)")
    return args, kwargs
