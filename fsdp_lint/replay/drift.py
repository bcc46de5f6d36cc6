"""Library drift, named: when the setup code fails in (or on) an installed library whose version the
repository asks for differently, the one-line error says so.

A training repository pins the libraries it was written against (``transformers==4.45.2`` in the
example's ``requirements.txt``); run with today's libraries its launch fails where the API moved
(an argument the ``HfArgumentParser`` no longer knows, a keyword ``Trainer`` dropped, a name gone from
``accelerate.utils``), on a GPU node as here. The error is right, but its cause is the environment, and
the user's fix is the repository's pin: `note` adds ``(examples/sft/requirements.txt asks for
transformers==4.45.2; installed here: 5.25.0)``.

Which libraries the failure is in: the innermost frame of the traceback that is neither the project's
nor fsdp-lint's (the library that raised), the module of a failed ``from X import name``, and, when the
project's own line raised (a ``TypeError`` for a keyword the callee no longer takes), the libraries of the
objects that line names. Only a pin the installed version does not satisfy is named; the requirement
files are those of the entry's folder and each folder above it up to the repository root (nearest
first: an example's own requirements win over the root's)."""
from __future__ import annotations

import os
import re
import sys
import types
from typing import List, Optional, Tuple

from fsdp_lint.entry.project import is_local, repo_root
from fsdp_lint.replay.line_values import called_on_line
from fsdp_lint.replay.records import traceback_frames

_FSDP_LINT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CANNOT_IMPORT = re.compile(r"cannot import name '[^']+' from '([^']+)'")
_NO_MODULE = re.compile(r"No module named '([^']+)'")


def note(exc: BaseException, entry_path: Optional[str]) -> str:
    """`` (requirements.txt asks for transformers==4.45.2; installed here: 5.25.0)`` for each library
    behind `exc` whose installed version the repository's pins exclude, or ''. Not for what is not
    downloaded, nor for a missing file or path (``$model_path/llm_config.json``, a hub id that is not here): what
    is not here is the cause, whatever the versions."""
    from fsdp_lint.replay.missing_inputs import missing_input

    if missing_input(exc):
        return ""
    try:
        # (not torch: the simulated node's torch is fsdp-lint's own, >= 2.6, whatever an old checkout pins;
        # a failure of a torch API that moved names it)
        texts = [f"{where} asks for {spec}; installed here: {version}" for where, spec, version in
                 _unmet([d for d in _implicated(exc) if d != "torch"], entry_path)]
    except Exception:  # noqa: BLE001  a note never costs the error its one line (odd metadata, a version
        return ""      # packaging cannot parse)
    return f" ({'; '.join(texts)})" if texts else ""


def lacking(module: str, entry_path: Optional[str], message: str = "") -> str:
    """What lacks the names imported from `module`: the repository's own package or sub-project not installed
    (`own_packages`), else ``the installed accelerate 1.16.0`` (with the repository's pin)."""
    from fsdp_lint.replay.own_packages import own_package

    top = module.lstrip(".").split(".")[0]
    if "<fsdp-lint simulated" in message:      # the simulated node's Ray: a name it does not have
        return "the Ray fsdp-lint simulates in the replay's process does not have it"
    own = own_package(top, entry_path) if not module.startswith(".") else None
    return own or f"the installed {installed(module, entry_path)}"


def installed(module: str, entry_path: Optional[str]) -> str:
    """``accelerate 1.16.0`` -- and ``; setup.py asks for accelerate==0.27.2`` where the repository's pin
    excludes it: the installed version of an import that lacks a name the project imports."""
    from fsdp_lint.replay.imports import installed_version

    try:
        dist = _distribution(module)
        pins = "".join(f"; {where} asks for {spec}" for where, spec, _ in _unmet([dist] if dist else [], entry_path))
    except Exception:  # noqa: BLE001  as in `note`
        pins = ""
    return installed_version(module) + pins


def failed_inside(missing: str, imp, entry_path: Optional[str]) -> Optional[str]:
    """Why module `missing`, which is installed, could not be imported when its import failed inside it
    (llmfoundry importing composer, whose ``from torch.cuda.amp.grad_scaler import ...`` the installed
    torch lacks, or a module of a package not installed): that failure, named."""
    from fsdp_lint.replay.imports import distribution_of

    message = getattr(imp, "message", "") or ""
    found = _CANNOT_IMPORT.search(message) or _NO_MODULE.search(message)
    if found is None or found.group(1) == missing or found.group(1).startswith(missing + "."):
        return None
    if found.re is _NO_MODULE:
        top = found.group(1).split(".")[0]
        return f"importing it failed inside: {message} (`{top}` is not installed here: pip install {distribution_of(top)})"
    return (f"importing it failed inside: {message} (the installed {installed(found.group(1), entry_path)}; "
            f"the training repository needs other versions)")


def _unmet(dists: List[str], entry_path: Optional[str]) -> List[Tuple[str, str, str]]:
    """(requirement file, requirement, installed version) of each of `dists` the nearest pin excludes."""
    pins = _pins(entry_path) if entry_path else []
    texts = []
    for dist in dict.fromkeys(dists) if pins else ():
        for where, spec in pins:
            req = _requirement(spec)
            if req is None or _normal(req.name) != dist:
                continue
            version = _version(dist)
            if version is not None and req.specifier and not req.specifier.contains(version, prereleases=True):
                texts.append((os.path.relpath(where), str(req), version))
            break               # the nearest file that names the distribution decides
    return list(dict.fromkeys(texts))


def _pins(entry_path: str) -> List[Tuple[str, str]]:
    """(requirement file, requirement text) of each folder from the entry's own up to its repository
    root, nearest first."""
    folder = os.path.dirname(os.path.abspath(entry_path))
    # (read each time: asked only when a failure or a note names a library; a file may change between lints
    # of one process)
    from fsdp_lint.replay.requirements import requirement_files

    root = repo_root(entry_path) or folder
    out: List[Tuple[str, str]] = []
    d = folder
    while True:
        for path, text in requirement_files(d):
            out.append((path, text))
        if d == root or os.path.dirname(d) == d or not d.startswith(root):
            break
        d = os.path.dirname(d)
    return out


def _implicated(exc: BaseException) -> List[str]:
    """The distributions (normalised names) the failure is in, most direct first."""
    modules: List[str] = []
    name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    found = _CANNOT_IMPORT.search(str(exc)) if isinstance(exc, ImportError) else None
    if found or (name and not isinstance(exc, ModuleNotFoundError)):
        modules.append(found.group(1) if found else name)
    frames = traceback_frames(exc)
    last = next((i for i in range(len(frames) - 1, -1, -1) if is_local(frames[i][0].f_code.co_filename)), None)
    # the library the project's last line called into (not one that called the project: Hydra's app around main)
    inner = frames[last + 1:] if last is not None else frames
    library = next((f for f, _ in reversed(inner) if not _ours(f.f_code.co_filename)), None)
    if library is not None:
        modules.append(library.f_globals.get("__name__") or "")
    if last is not None and all(_ours(f.f_code.co_filename) for f, _ in frames[last:]):
        # the project's line raised, or fsdp-lint's hook of the library call it makes (the hooked
        # `Trainer.__init__` binding a keyword the installed Trainer no longer takes)
        modules += [m for m in (_library_module(obj) for obj in called_on_line(*frames[last])) if m]
    dists = [d for d in (_distribution(m) for m in modules if m) if d]
    return list(dict.fromkeys(dists))


def _ours(fname: str) -> bool:
    """A project file, fsdp-lint's own, or code without a file (``<string>``)."""
    return (is_local(fname) or fname.startswith("<")
            or os.path.abspath(fname).startswith(_FSDP_LINT_DIR + os.sep))


def _library_module(obj) -> Optional[str]:
    """The module of the first class of `obj` (itself if a class, else its type) or of the function
    `obj` that is an installed library's."""
    if obj is None:
        return None
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, type):
        kinds = obj.__mro__
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        kinds = (obj,)
    else:
        kinds = type(obj).__mro__
    for kind in kinds:
        module = getattr(kind, "__module__", None) or ""
        fname = getattr(sys.modules.get(module), "__file__", None) or ""
        if module not in ("builtins", "abc", "typing") and fname and not _ours(fname):
            return module
    return None


def _distribution(module: str) -> Optional[str]:
    from importlib import metadata

    top = module.split(".")[0]
    try:
        dists = metadata.packages_distributions().get(top)
    except Exception:  # noqa: BLE001  broken metadata of some installed package
        return None
    return _normal(dists[0]) if dists else None


def _version(dist: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except Exception:  # noqa: BLE001
        return None


def _requirement(text: str):
    """A PEP 508 requirement whose markers hold here, or None (no `packaging`: nothing is claimed)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        return None
    try:
        req = Requirement(text.split(" #")[0].strip())
    except InvalidRequirement:
        return None
    try:
        if req.marker is not None and not req.marker.evaluate():
            return None
    except Exception:  # noqa: BLE001  a marker naming an extra
        return None
    return req


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
