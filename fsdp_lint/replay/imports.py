"""Imports during a replay: project-local modules are loaded through the code transform, packages
that are not installed get a tracked stand-in, and import failures are described by their cause.

* `ProjectImporter` is a meta-path finder: a module whose file belongs to the user's project (not
  the standard library, site-packages or fsdp-lint) is compiled with ``transform`` (imported-module
  mode) so that its training loops end the replay and its failing setup statements can be skipped;
  everything else imports as usual. The import stack it keeps names circular imports.
* `Missing` stands in for a name whose top-level import failed (``import wandb``, ``from flash_attn
  import flash_attn_func``). Every use of it is recorded, with whether it happened while the model
  was being built or wrapped: a plan built with a stand-in inside the model is incomplete.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_lint.entry.project import is_local

from fsdp_lint.replay.distributions import _NAMESPACES, distribution_of, requirement  # noqa: F401 - (callers' names)


def innermost_import(exc: BaseException, missing: str) -> str:
    """The module named by the innermost import statement on `exc`'s traceback that names `missing` (a
    library's own ``from google.cloud import storage`` behind the project's ``from cached_path import ...``)."""
    import ast
    import linecache

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    for filename, lineno in reversed(frames):
        try:
            node = ast.parse(linecache.getline(filename, lineno).strip()).body[0]
        except (SyntaxError, IndexError, ValueError):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
            if node.module in _NAMESPACES:
                names = [f"{node.module}.{a.name}" for a in node.names] + names
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == missing or name.startswith(missing + "."):
                return name
    return ""


def installed_version(module: str) -> str:
    """"transformers 4.57.1": the distribution that provides `module` and its version, as far as known."""
    from importlib import metadata

    top = module.split(".")[0]
    try:
        dists = metadata.packages_distributions().get(top) or [distribution_of(top)]
        return f"{dists[0]} {metadata.version(dists[0])}"
    except Exception:  # noqa: BLE001
        return top


def not_importable(module: str, absent_names: bool = False) -> str:
    """Why import `module` failed, said as a cause: the installed version lacks the names (that version
    is named, never "not installed"), or the package is not installed."""
    top = module.lstrip(".").split(".")[0]
    if not absent_names:
        try:
            absent_names = bool(top) and importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            absent_names = False
    if absent_names:
        return f"the installed {installed_version(top)} does not have it (the code needs another version)"
    return f"`{top}` is not installed here (pip install {distribution_of(top)})"


# --------------------------------------------------------------------------------------------
# stand-ins for what is not installed
# --------------------------------------------------------------------------------------------
@dataclass
class StubUse:
    name: str                 # "flash_attn.flash_attn_func"
    path: str
    line: int
    in_model: bool            # used while a model was being built or wrapped
    user: str = "the model"   # what uses it ("the wrap": a stand-in among a wrap call's arguments)


@dataclass
class MissingImport:
    module: str               # the module as the file imports it ("flash_attn", ".data")
    missing: str              # the module that is really not there ("flash_attn", "webdataset")
    path: str                 # the file with the import
    line: int
    local: bool               # a project module that exists but failed on its own imports
    message: str              # the ImportError's message
    names: List[str] = field(default_factory=list)
    absent_names: bool = False  # the module is installed; the names are not in it (another version)
    imported: str = ""        # the module the innermost failing import names ("google.api_core.exceptions")


# uses of one failed import's stand-ins before the replay stops: a framework driving a stand-in in a
# loop (a CLI library's ``Fire(main)`` walking a ``main`` whose import failed) never ends otherwise
STAND_IN_USE_LIMIT = 20_000


def limited_uses(on_use: Callable[..., None], name: str, cause: str, where: str) -> Callable[..., None]:
    """`on_use` for the stand-ins of one failed import, which ends the replay (one line naming the
    import and its failure) once they have been used :data:`STAND_IN_USE_LIMIT` times."""
    count = [0]

    def use(*args, **kwargs):
        count[0] += 0 if kwargs.get("truth") else 1      # `if stand_in:` in a loop is not using it
        if count[0] > STAND_IN_USE_LIMIT:
            from fsdp_lint.replay.records import ReplayError

            raise ReplayError(f"{where}: the setup code keeps using `{name}`, which could not be imported here "
                              f"({cause}), in a loop ({STAND_IN_USE_LIMIT:,} uses): it cannot run without it")
        return on_use(*args, **kwargs)
    return use


def _any_arguments(*args, **kwargs):
    return None


class Missing:
    """A stand-in for a name whose import failed. Attribute access, calls and iteration work and are
    recorded; it is falsy, iterates as empty and contains whatever it is asked for (a data set that
    does not exist here has the splits and columns the script checks for)."""

    __slots__ = ("_fsdp_lint_name", "_fsdp_lint_on_use", "_fsdp_lint_why", "_fsdp_lint_set")

    def __init__(self, name: str, on_use: Callable[[str], None], why: Optional[str] = None):
        object.__setattr__(self, "_fsdp_lint_name", name)
        object.__setattr__(self, "_fsdp_lint_on_use", on_use)
        # why the import failed, said as the cause: "`addict` is not installed here (pip install addict)"
        object.__setattr__(self, "_fsdp_lint_why", why)
        object.__setattr__(self, "_fsdp_lint_set", {})

    def __setattr__(self, item, value):
        if item in Missing.__slots__:       # copy.deepcopy(cfg) of a stand-in restores its slots
            object.__setattr__(self, item, value)
            return
        # configuring a package that is not installed (`posthog.host = URL`, `openai.api_key = key`):
        # a module takes any attribute, and reading it back gives what was set
        self._fsdp_lint_on_use(f"{self._fsdp_lint_name}.{item}", access=True)
        self._fsdp_lint_set[item] = value

    def __delattr__(self, item):
        self._fsdp_lint_set.pop(item, None)

    @property
    def __code__(self):
        # a function of a package that cannot be installed here (flash_attn's kernels need CUDA to build),
        # introspected (`"softmax_scale" in flash_attn_func.__code__.co_varnames`): any arguments, as its
        # signature says (`inspect.signature`); the use is recorded, so a failure after it names the package
        self._fsdp_lint_on_use(f"{self._fsdp_lint_name}.__code__")
        return _any_arguments.__code__

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__") or item.startswith("_fsdp_lint_"):
            raise AttributeError(item)      # (an unset slot of a copy: no recursion)
        if item in self._fsdp_lint_set:
            return self._fsdp_lint_set[item]
        name = f"{self._fsdp_lint_name}.{item}"
        # naming an attribute is no use of it (`-> pa.Table`, `x: wandb.Run`): what is done with it is
        self._fsdp_lint_on_use(name, access=True)
        return Missing(name, self._fsdp_lint_on_use, self._fsdp_lint_why)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], type):
            # a decorator from a package that is not installed (`@register("name")`) leaves the class as it
            # is, marked: a failure on what the decorator would have added (`@ray.remote` class's
            # `Runner.remote()`) names the package (fsdp_lint.replay.stand_ins)
            self._fsdp_lint_on_use(self._fsdp_lint_name + "()", access=True)
            try:
                type.__setattr__(args[0], "_fsdp_lint_decorated_by", self._fsdp_lint_name + "()")
            except (TypeError, AttributeError):
                pass
            return args[0]
        if len(args) == 1 and not kwargs and isinstance(args[0], types.FunctionType):
            self._fsdp_lint_on_use(self._fsdp_lint_name + "()", access=True)
            return _decorated(args[0], self)
        if _holds_a_module(args, kwargs):     # trials: `convert_to_float8_training(model)` acts on the model
            self._fsdp_lint_on_use(self._fsdp_lint_name + "()", model=True)
        else:
            self._fsdp_lint_on_use(self._fsdp_lint_name + "()")
        return Missing(self._fsdp_lint_name + "()", self._fsdp_lint_on_use, self._fsdp_lint_why)

    def __iter__(self):
        self._fsdp_lint_on_use(self._fsdp_lint_name)
        return iter(())

    def __bool__(self):
        # falsy (`if wandb_run:`), except where the truth decides what a wrap is given (`param_dtype=bf16
        # if cfg.bf16 else None` with `cfg.bf16 = supports_bf16()`): there it has no value, as a number has none
        if self._fsdp_lint_on_use(self._fsdp_lint_name, access=True, truth=True):
            raise TypeError(f"{self._fsdp_lint_name} stands in for something not installed here and has no truth "
                            f"value")
        return False

    def __len__(self):              # a data set from a package not installed here sizes a DataLoader
        self._fsdp_lint_on_use(self._fsdp_lint_name)
        return 1

    def __enter__(self):            # `with profiler.profile(...):` of a package not installed: a context that does nothing
        self._fsdp_lint_on_use(self._fsdp_lint_name, access=True)
        return self

    def __exit__(self, *exc):
        return False

    def __contains__(self, item):   # trials: a stand-in data set has the split a script checks for
        self._fsdp_lint_on_use(self._fsdp_lint_name)   # (`if "train" not in raw_datasets: raise ...`)
        return True

    def __getitem__(self, item):
        name = f"{self._fsdp_lint_name}[]"
        self._fsdp_lint_on_use(name)
        return Missing(name, self._fsdp_lint_on_use, self._fsdp_lint_why)

    def __mro_entries__(self, bases):
        # a base class that is not installed (a checkpoint client's `boto3` session, a config mix-in):
        # a fresh empty class stands in (`object` in the middle of the bases breaks the MRO:
        # `class C(Config, Missing, Generic[T])`); defining the class is no use of it, building an
        # instance while a model is built is (`class FusedNorm(apex.FusedLayerNorm)` in a block)
        on_use, name = self._fsdp_lint_on_use, self._fsdp_lint_name
        on_use(name, access=True)
        why = self._fsdp_lint_why or not_importable(name)

        def __init__(inner, *args, **kwargs):
            on_use(name + "()")

        def __getattr__(inner, item):
            # what the missing base provides (addict's `Dict` answers every attribute from its items):
            # the failure names the package, not only the subclass that lacks it
            own = type(inner).__name__
            if item.startswith("__") and item.endswith("__"):
                raise AttributeError(f"'{own}' object has no attribute '{item}'")
            raise AttributeError(f"'{own}' object has no attribute '{item}' (`{own}` is built on `{name}`, "
                                 f"which could not be imported: {why}; fsdp-lint stands in for it with an empty class)")

        # the missing base's class attributes (`@Config.register("name")`) are stand-ins too; with the
        # metaclasses of the other bases (ABCMeta) mixed in, so that one class can have both
        # (ABCMeta always: `class C(Config, Missing, metaclass=ABCMeta)` names it where this cannot see it)
        import abc

        others = tuple(dict.fromkeys(type(b) for b in bases if isinstance(b, type) and type(b) is not type))
        others = others if any(issubclass(m, abc.ABCMeta) for m in others) else others + (abc.ABCMeta,)
        meta = type("StandInMeta", (_StandInMeta, *others), {})
        cls = meta(name.rsplit(".", 1)[-1], (), {"__init__": __init__, "__getattr__": __getattr__,
                                                 "__module__": "fsdp_lint.stand_in",
                                                 "_fsdp_lint_stand_in": name, "_fsdp_lint_missing": self})
        return (cls,)

    def __instancecheck__(self, obj):
        # `isinstance(loader, StatefulDataLoader)` with the class's package not installed: only what was
        # built from the stand-in (a call of it, a class built on it) is one; anything else is not
        # (`isinstance()` asked a non-type raised TypeError, and the statement was skipped)
        self._fsdp_lint_on_use(self._fsdp_lint_name, access=True)
        if isinstance(obj, Missing):
            return obj._fsdp_lint_name.startswith(self._fsdp_lint_name + "(")
        return self.__subclasscheck__(type(obj))

    def __subclasscheck__(self, cls):
        return any(getattr(c, "__dict__", {}).get("_fsdp_lint_missing") is self for c in getattr(cls, "__mro__", ()))

    def __or__(self, other):        # `pa.Table | None` in an annotation
        return self

    __ror__ = __or__

    def __repr__(self):
        return f"<{self._fsdp_lint_name}: not installed here>"

    def _fsdp_lint_as_value(self, *_):
        # a stand-in used as a number (`vocab_size = tokenizer.n_words` from a tokenizer package that
        # is not installed, then `vocab_size > 0`, `nn.Embedding(vocab_size, dim)`): the use is
        # recorded where it happens, so that the failure names the package, not a 'Missing' type
        self._fsdp_lint_on_use(self._fsdp_lint_name)
        raise TypeError(f"{self._fsdp_lint_name} stands in for something not installed here and has no value")

    __lt__ = __le__ = __gt__ = __ge__ = _fsdp_lint_as_value
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _fsdp_lint_as_value
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _fsdp_lint_as_value
    __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = _fsdp_lint_as_value
    __index__ = __int__ = __float__ = _fsdp_lint_as_value


class _StandInMeta(type):
    """The metaclass of a stand-in base class: its class attributes are the missing base's."""

    def __getattribute__(cls, item):
        if not item.startswith("__") and not hasattr(type, item):
            mro = type.__getattribute__(cls, "__mro__")
            if not any(item in b.__dict__ for b in mro):
                # not the class's own: the missing base's (before another metaclass's `register`)
                missing = next((b.__dict__["_fsdp_lint_missing"] for b in mro if "_fsdp_lint_missing" in b.__dict__),
                               None)
                if missing is not None:
                    return getattr(missing, item)
        return type.__getattribute__(cls, item)


# packages that only look at a model they are given (loggers, profilers, summaries): a stand-in for
# them called with the model leaves the plan as it is
_OBSERVERS = {"wandb", "mlflow", "comet_ml", "neptune", "clearml", "aim", "tensorboard", "tensorboardX",
              "torchinfo", "torchsummary", "thop", "fvcore", "ptflops", "codecarbon", "tqdm", "rich", "swanlab",
              "dvclive", "trackio"}


def stand_in_within(value, depth: int = 3):
    """A stand-in (`Missing`) inside `value` -- itself, an item of a list/tuple/dict, an attribute of an
    object (a precision policy, a recipe's config) -- or None."""
    if isinstance(value, Missing):
        return value
    if depth <= 0 or isinstance(value, (str, bytes, int, float, bool, type(None), type, types.ModuleType)):
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif isinstance(value, dict):
        items = list(value.values())
    else:
        try:
            items = list(vars(value).values())
        except TypeError:
            return None
    nn = sys.modules.get("torch.nn")
    for item in items:
        if nn is not None and isinstance(item, nn.Module):
            continue            # the model itself: its stand-ins are found where they are used
        found = stand_in_within(item, depth - 1)
        if found is not None:
            return found
    return None


def only_observes(module: str) -> bool:
    """Whether the package of import `module` only looks at a model it is given (`wandb.watch(model)`)."""
    return (module or "").lstrip(".").split(".")[0] in _OBSERVERS


def _decorated(fn: types.FunctionType, decorator: "Missing") -> Callable[..., Any]:
    """`fn` as a decorator from a package that is not installed leaves it (`@numba.jit`), except for the
    arguments the decorator would have supplied (`@draccus.wrap()` parses the config into `train(cfg)`,
    called as `train()`): a call that `fn` cannot take is a use of the decorator, where it is called."""
    import functools
    import inspect

    on_use, name = decorator._fsdp_lint_on_use, decorator._fsdp_lint_name

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except TypeError:
            on_use(name + "()")         # (recorded at the caller's line: on_use reads the frame above this one)
        except ValueError:              # no signature to read
            pass
        return fn(*args, **kwargs)
    call._fsdp_lint_decorated_by = name + "()"      # (`@ray.remote def task(cfg)`, then `task.remote(cfg)`)
    return call


def _holds_a_module(args, kwargs) -> bool:
    """A stand-in called with a model (an ``nn.Module`` argument) acts on the model: the plan would miss it."""
    nn = sys.modules.get("torch.nn")
    return nn is not None and any(isinstance(a, nn.Module) for a in (*args, *kwargs.values()))


# --------------------------------------------------------------------------------------------
# the project importer
# --------------------------------------------------------------------------------------------
class ProjectImporter(importlib.abc.MetaPathFinder):
    """Loads project-local modules through the code transform."""

    def __init__(self, load: Callable[[Any, str], None]):
        self._load = load                      # load(module, path): transform and exec
        self.stack: List[Tuple[str, str]] = []   # (module name, file) being imported, outermost first
        self.loaded: Dict[str, str] = {}         # file -> module name

    def find_spec(self, fullname, path=None, target=None):
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except (ImportError, ValueError, AttributeError):
                spec = None
            if spec is not None:
                break
        if spec is None or not spec.origin or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        if not is_local(spec.origin):
            return None
        new = importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_TransformingLoader(self, spec.origin),
            submodule_search_locations=spec.submodule_search_locations)
        return new

    def cycle_through(self, module: str) -> Optional[List[Tuple[str, str]]]:
        """The import chain from `module` (being imported) to the innermost module, or None."""
        names = [n for n, _ in self.stack]
        if module not in names:
            return None
        return self.stack[names.index(module):]


class _TransformingLoader(importlib.abc.Loader):
    def __init__(self, importer: ProjectImporter, path: str):
        self.importer = importer
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        self.importer.stack.append((name, self.path))
        try:
            self.importer.loaded[self.path] = name
            self.importer._load(module, self.path)
        finally:
            self.importer.stack.pop()

    def get_filename(self, fullname=None):
        return self.path

    def get_source(self, fullname=None):
        with open(self.path, encoding="utf-8-sig") as fh:
            return fh.read()

    def get_code(self, fullname=None):
        # `runpy.run_module("pkg.train", run_name="__main__")` (a launcher running a recipe as a script) asks
        # for the module's code to run in a namespace of its own: the file's code as Python compiles it
        return compile(self.get_source(fullname), self.path, "exec", dont_inherit=True)

    def is_package(self, fullname):
        return os.path.basename(self.path) == "__init__.py"


def missing_module_of(exc: BaseException) -> Optional[str]:
    """The module that is not installed, from a ModuleNotFoundError (``No module named 'x.y'``)."""
    name = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and name:
        return name
    return None


def package_behind(exc: BaseException) -> Optional[str]:
    """The package not installed here behind `exc`: a ModuleNotFoundError in its chain of causes (a
    project module's ``raise ImportError("needs the streaming package") from e``, a project module whose
    import failed on a package and stands in for its names), or None."""
    seen: set = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        top = (missing_module_of(exc) or "").split(".")[0]
        if top:
            try:
                found = importlib.util.find_spec(top) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return top
        exc = exc.__cause__ or exc.__context__
    return None


def is_circular(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, ImportError) and ("partially initialized module" in text or "circular import" in text)


def circular_module(exc: BaseException) -> Optional[str]:
    import re

    m = re.search(r"partially initialized module '([^']+)'", str(exc))
    return m.group(1) if m else getattr(exc, "name", None)
