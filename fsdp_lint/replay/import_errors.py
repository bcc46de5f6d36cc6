"""What the replay says about imports: the project's own modules set aside for a replay, an ImportError's
first line, names the installed version of a package lacks, the project line an exception came from."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import List, Optional

from fsdp_lint.replay.failures import _FSDP_LINT_DIR
from fsdp_lint.replay.records import exception_chain

@contextlib.contextmanager
def _own_project_modules():
    """The entry imports its own project modules afresh: project-local modules this process imported
    before (another file linted in-process, a test's fixtures) are set aside for the replay and put
    back afterwards, so that a `model` of another project never stands in for this one's."""
    from fsdp_lint.entry.project import is_local

    aside = {name: mod for name, mod in list(sys.modules.items())
             if name != "__main__" and is_local(getattr(mod, "__file__", None) or "")}
    for name in aside:
        del sys.modules[name]
    try:
        yield
    finally:
        for name, mod in aside.items():
            sys.modules.setdefault(name, mod)


@contextlib.contextmanager
def own_folder_first(folder: Optional[str]):
    """`folder` searched before the installed packages (`python pkg/train.py`): it goes second on ``sys.path`` (after
    the entry's root), and a library this process imported whose top-level name a package or module of `folder`
    has (Hugging Face's ``datasets`` beside the project's ``datasets/``) is set aside for the replay, as a fresh
    ``python`` would not have it, and put back afterwards. None: nothing changes."""
    if folder is None:
        yield
        return
    names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(folder)
             if n.endswith(".py") or os.path.isfile(os.path.join(folder, n, "__init__.py"))}
    aside = {name: mod for name, mod in list(sys.modules.items())
             if name.split(".")[0] in names and not os.path.abspath(getattr(mod, "__file__", None) or "").startswith(
                 folder + os.sep)}
    for name in aside:
        del sys.modules[name]
    sys.path.insert(1, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        for name, mod in aside.items():
            sys.modules[name] = mod


def raised_by_a_project_module(exc: BaseException, is_project_file, importer: str) -> bool:
    """An ImportError a project module raised itself, with no module missing in its chain (a sibling `yaml.py`
    the script's folder puts before PyYAML), not a package that is not installed."""
    from fsdp_lint.replay.imports import missing_module_of as _missing_module_of

    if any(isinstance(e, ModuleNotFoundError) or _missing_module_of(e) for e in exception_chain(exc)):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    where = os.path.abspath(tb.tb_frame.f_code.co_filename)
    # (raised in the imported module's own code, not on the importing line: "cannot import name" is a version's)
    return where != os.path.abspath(importer) and is_project_file(where)


def _import_message(exc: BaseException) -> str:
    """The ImportError's first line without the path of the package's ``__init__.py``; when a package
    re-raised another ImportError as its own ("Please make sure to pip install ."), that one's too."""
    import re

    def first_line(e: BaseException) -> str:
        text = str(e).splitlines()[0] if str(e) else ""
        return re.sub(r" \((/|[A-Za-z]:\\)[^()]*\)$", "", text)

    inner, seen = exc, {id(exc)}
    while isinstance(inner.__cause__ or inner.__context__, ImportError) and id(inner.__cause__ or inner.__context__) not in seen:
        inner = inner.__cause__ or inner.__context__
        seen.add(id(inner))
    text = first_line(exc)
    return text if inner is exc or first_line(inner) in text else f"{text} (raised from: {first_line(inner)})"


def _names_absent_from_installed(module: Optional[str], names, globs, exc=None) -> List[str]:
    """For ``from pkg import a, b`` that failed with "cannot import name": bind in `globs` the names
    the imported (installed, not project) module has, and return those it lacks; [] when the failure
    is anything else."""
    if not module or module.startswith(".") or not isinstance(exc, ImportError) \
            or isinstance(exc, ModuleNotFoundError) or "cannot import name" not in str(exc):
        return []
    from fsdp_lint.entry.project import is_local

    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the module itself fails: described as before
        return []
    if is_local(getattr(mod, "__file__", None) or ""):
        return []
    absent = []
    for name in names:
        if name == "*":
            return []
        try:
            globs[name] = getattr(mod, name)
        except AttributeError:
            try:        # a submodule imported by name (`from pkg import sub`)
                globs[name] = importlib.import_module(f"{module}.{name}")
            except Exception:  # noqa: BLE001
                absent.append(name)
        except Exception:  # noqa: BLE001 - a lazy attribute whose own import fails
            absent.append(name)
    return absent


def _innermost_project_line(exc: BaseException) -> Optional[tuple]:
    """(path, line) of the innermost frame of the project's own code in `exc`'s traceback."""
    from fsdp_lint.entry.project import is_local

    found = None
    tb = exc.__traceback__
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if is_local(path) and not path.startswith(_FSDP_LINT_DIR):
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    return found
