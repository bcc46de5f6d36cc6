"""What the entry's repository declares it depends on: pyproject.toml, requirements*.txt, setup.py.

Install hints name the distribution a repository declares (``ai2-olmo-core`` for ``olmo_core``), and
the drift note names the pin the installed version misses (``fsdp_lint.replay.drift``)."""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

_PROJECT: List[Optional[str]] = [None]          # the entry file of the replay running here
_DECLARED: Dict[str, Tuple[str, ...]] = {}      # repository root -> the distributions it depends on


def set_project(entry_path: Optional[str]) -> None:
    _PROJECT[0] = entry_path


def declared_distributions() -> Tuple[str, ...]:
    """The distributions the entry's repository depends on, normalised (``ai2_olmo_core`` ->
    ``ai2-olmo-core``): pyproject.toml's ``[project]`` dependencies and extras and Poetry's dependency
    tables, the requirement lines of ``requirements*.txt``, the quoted requirements of ``setup.py``."""
    if not _PROJECT[0]:
        return ()
    folder = os.path.dirname(os.path.abspath(_PROJECT[0]))
    if folder not in _DECLARED:
        _DECLARED[folder] = tuple(dict.fromkeys(_normalised(r) for r in _project_requirements() if _normalised(r)))
    return _DECLARED[folder]


def requires(name: str) -> bool:
    """Whether the entry's repository requires distribution `name` itself (not only as an extra): a node set up
    as its README says has it installed."""
    key = (os.path.dirname(os.path.abspath(_PROJECT[0])) if _PROJECT[0] else "", name)
    if key not in _REQUIRES:
        _REQUIRES[key] = _requires(name)
    return _REQUIRES[key]


_REQUIRES: Dict[Tuple[str, str], bool] = {}     # (the entry's folder, distribution) -> requires()


def _requires(name: str) -> bool:
    if any(_normalised(r) == name for r in _project_requirements(extras=False)):
        return True
    from importlib import metadata

    for dist in _installed_distributions_of(_PROJECT[0]):     # an installed package's module launched (`-m`)
        try:
            needed = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        if any(_normalised(r) == name for r in needed if "extra ==" not in r):
            return True
    return False


def _installed_distributions_of(path: Optional[str]) -> List[str]:
    """The installed distributions that hold the file `path` (a module of an installed package)."""
    import sys
    from importlib import metadata

    from fsdp_lint.entry.project import _holds_distributions

    if not path:
        return []
    path = os.path.abspath(path)
    for entry in sys.path:
        base = os.path.abspath(entry or ".")
        if path.startswith(base + os.sep) and _holds_distributions(base):   # (a project's folder holds none)
            top = os.path.relpath(path, base).split(os.sep)[0].removesuffix(".py")
            found = metadata.packages_distributions().get(top)
            if found:
                return list(found)
    return []


def _project_requirements(extras: bool = True) -> List[str]:
    """The requirement texts of each folder from the entry's own up to its repository root (the entry's folder
    alone where nothing marks a root: a checkout's requirements.txt beside its train.py), nearest first."""
    from fsdp_lint.entry.project import repo_root

    folder = os.path.dirname(os.path.abspath(_PROJECT[0])) if _PROJECT[0] else None
    if folder is None:
        return []
    root = repo_root(_PROJECT[0]) or folder
    out, d = [], folder
    while True:
        out += _requirements(d, extras)
        if d == root or os.path.dirname(d) == d or not d.startswith(root):
            return out
        d = os.path.dirname(d)


def declared_from_url(name: str) -> Optional[str]:
    """The requirement the repository declares for distribution `name` when it names where to get it
    (``pydantic_config @ git+https://github.com/...``: a package not on PyPI, or another one of that name)."""
    for text in _project_requirements():
        if _normalised(text) == name and re.match(r"^\s*[A-Za-z0-9._-]+(\[[^]]*\])?\s*@\s*\S", text):
            return text.split(" #")[0].strip()
    return None


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normalised(requirement: str) -> str:
    """PEP 508's name of a requirement, as PEP 503 compares them ("Foo_Bar>=1" -> "foo-bar")."""
    found = _REQUIREMENT_NAME.match(requirement)
    return re.sub(r"[-_.]+", "-", found.group(1)).lower() if found else ""


def _requirements(root: str, extras: bool = True) -> List[str]:
    return [text for _, text in requirement_files(root, extras)]


def requirement_files(folder: str, extras: bool = True) -> List[Tuple[str, str]]:
    """(file, requirement text) of the requirements `folder` declares: pyproject.toml's ``[project]``
    dependencies and extras and Poetry's dependency tables (``name`` or ``name<spec>``), each line of
    ``requirements*.txt``, the quoted requirements of setup.py's install_requires/extras_require."""
    out: List[Tuple[str, str]] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        if not (name in ("pyproject.toml", "setup.py") or name.startswith("requirements") and name.endswith(".txt")):
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read(500_000)
        except OSError:
            continue
        if name == "pyproject.toml":
            try:
                import tomllib
            except ImportError:  # Python < 3.11
                continue
            try:
                doc = tomllib.loads(data.decode("utf-8", "replace"))
            except ValueError:      # tomllib.TOMLDecodeError
                continue
            project = doc.get("project") or {}
            texts = [r for r in project.get("dependencies") or [] if isinstance(r, str)]
            for extra in (project.get("optional-dependencies") or {}).values() if extras else ():
                texts += [r for r in extra if isinstance(r, str)] if isinstance(extra, list) else []
            poetry = (doc.get("tool") or {}).get("poetry") or {}
            texts += [k for k in poetry.get("dependencies") or {} if k != "python"]
        elif name == "setup.py":            # the literal lists of install_requires= and extras_require=
            text = data.decode("utf-8", "replace")
            texts = []
            starts = r"(?:install_requires\s*=\s*\[|extras_require\s*=\s*\{)" if extras else r"install_requires\s*=\s*\["
            for block in re.findall(starts + r"(.*?)[\]}]\s*,?\s*\n", text, re.S):
                texts += re.findall(r"""["']([A-Za-z0-9][^"']*)["']""", block)
        else:
            texts = [line for line in data.decode("utf-8", "replace").splitlines()
                     if line.strip() and not line.lstrip().startswith(("#", "-"))]
        out += [(path, t) for t in texts]
    return out
