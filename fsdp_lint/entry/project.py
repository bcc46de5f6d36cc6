"""`project`: a training entry point as Python sees it, read from syntax trees (no torch, no imports).

* how Python runs it: a standalone script (its folder on ``sys.path``) or a module of a package (a
  chain of ``__init__.py``, ``src/`` layouts included), run as ``pkg.sub.mod`` with the package root
  on ``sys.path`` so that relative imports work, as ``python -m`` does;
* which project-local modules it imports, transitively (modules that resolve to files of the
  repository, not of the standard library or site-packages), and what they hold: wrap calls and
  policies, model classes, frameworks that wrap on the script's behalf;
* which functions of all those modules wrap, freeze, cast or build optimizers (transitively, by
  name across modules): the replay's code transform needs them to know where setup ends.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from fsdp_lint.entry.relevance import instance_call_relevance, keyword_relevance
from fsdp_lint.entry.source import SourceError, SourceFacts, called_here, mark_relevance, parse_source, read_source, read_text

_REPO_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", ".hg")


@dataclass
class Entry:
    path: str                   # absolute path of the file
    module: str                 # import name: "train" for a script, "pkg.sub.train" in a package
    package: Optional[str]      # "pkg.sub" (None for a standalone script)
    root: str                   # what goes first on sys.path: the script's folder or the package root
    # a module of a namespace package (folders without __init__.py) that `python -m pkg.mod` runs from the
    # repository root: it imports its own folder by its dotted name, or relatively
    namespace: bool = False
    launched: bool = False      # the launch names the module (`torchrun -m training.run` from `gritlm/`)

    @property
    def is_package_module(self) -> bool:
        return self.package is not None


# `python -m training.run` from the folder holding `training/` (a launch script's `-m`): path -> (module, root)
_LAUNCHED: Dict[str, Tuple[str, str]] = {}


@contextlib.contextmanager
def launched_as(path: str, module_and_root):
    """While a launch that names its module (``-m MODULE`` from ROOT) is linted, `path` runs as it does."""
    path = os.path.abspath(path)
    if not module_and_root:
        yield
        return
    before = _LAUNCHED.get(path)
    _LAUNCHED[path] = tuple(module_and_root)
    try:
        yield
    finally:
        if before is None:
            _LAUNCHED.pop(path, None)
        else:
            _LAUNCHED[path] = before


def console_call(path: str) -> Optional[str]:
    """The function a console script calls after importing `path` (``pkg.train:main`` of a module with no
    ``if __name__ == "__main__"`` that calls it), while that launch is linted; None otherwise."""
    launched = _LAUNCHED.get(os.path.abspath(path)) or ()
    return launched[2] if len(launched) > 2 else None


def with_console_call(path: str, text: str) -> str:
    """The file's text as the console script runs it: its function called after its last line (as pip's
    wrapper does, ``sys.exit(main())``); the file's own lines keep their numbers."""
    call = console_call(path)
    if not call:
        return text
    return (f"{text.rstrip()}\n\n\nif __name__ == \"__main__\":    # the console script's call\n"
            f"    import sys as _fsdp_lint_console_sys\n    _fsdp_lint_console_sys.exit({call}())\n")


def entry_for(path: str, text: Optional[str] = None) -> Entry:
    """How ``python`` runs `path`: a file inside a package runs as its dotted module name, a module a launch
    names (``-m training.run``) as that module from the launch's folder. (`text`: the file's, when the
    caller has read it.)"""
    path = os.path.abspath(path)
    if path in _LAUNCHED:
        module, root = _LAUNCHED[path][:2]
        if os.path.basename(path) == "__main__.py" and not module.endswith(".__main__"):
            module += ".__main__"            # `python -m pkg` runs pkg/__main__.py
        package = module.rpartition(".")[0] or None
        namespace = package is not None and not os.path.isfile(os.path.join(root, *package.split("."), "__init__.py"))
        return Entry(path=path, module=module, package=package, root=root, namespace=namespace, launched=True)
    folder, name = os.path.split(path)
    stem = os.path.splitext(name)[0]
    parts: List[str] = []
    root = folder
    while os.path.isfile(os.path.join(root, "__init__.py")):
        parts.insert(0, os.path.basename(root))
        parent = os.path.dirname(root)
        if parent == root:
            break
        root = parent
    if not parts:
        return _namespace_module(path, text) or Entry(path=path, module=stem, package=None, root=folder)
    if not all(p.isidentifier() for p in parts):
        return Entry(path=path, module=stem, package=None, root=folder)
    package = ".".join(parts)
    module = package if stem == "__init__" else f"{package}.{stem}"
    return Entry(path=path, module=module, package=package, root=root)


def _namespace_module(path: str, text: Optional[str] = None) -> Optional[Entry]:
    """`path` as ``python -m`` runs it from the repository root when it is a module of a namespace
    package there (no ``__init__.py`` in its folder, dotted folders) that imports its own folder by its
    dotted name or relatively; else None."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if os.path.isfile(os.path.join(folder, "__init__.py")):
        return None
    if folder not in _REPO_ROOTS:     # the files of one folder share it (a walk screens hundreds)
        _REPO_ROOTS[folder] = repo_root(path)
    repo = _REPO_ROOTS[folder]
    if repo is None or folder == repo or not folder.startswith(repo + os.sep):
        return None
    parts = os.path.relpath(folder, repo).split(os.sep)
    if parts[0] == "src" and len(parts) > 1:
        parts, repo = parts[1:], os.path.join(repo, "src")
    if not all(p.isidentifier() for p in parts):
        return None
    package = ".".join(parts)

    def own(imports) -> bool:
        return any(i.level or i.module == package or (i.module or "").startswith(package + ".") for i in imports)

    from fsdp_lint.entry.scan import import_candidates

    try:
        # the imports read from the text, when that is certain, say "none of its folder" without the
        # syntax tree (a plain module of a namespace folder, the common case)
        found = import_candidates(text if text is not None else read_text(path))
    except Exception:  # noqa: BLE001 - unreadable: facts_for says so below
        found = None
    if found is not None and not own(found):
        return None
    try:
        imports = facts_for(path).imports
    except Exception:  # noqa: BLE001 - unreadable: the script launch reports it
        return None
    if not own(imports):
        return None
    stem = os.path.splitext(os.path.basename(path))[0]
    return Entry(path=path, module=f"{package}.{stem}", package=package, root=repo, namespace=True)


def repo_root(start: str) -> Optional[str]:
    """The nearest folder above `start` that looks like a repository root (.git, pyproject.toml, ...)."""
    d = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(start))
    while True:
        if any(os.path.exists(os.path.join(d, m)) for m in _REPO_MARKERS):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


_LIB_DIRS: Optional[Tuple[str, ...]] = None


def _library_dirs() -> Tuple[str, ...]:
    global _LIB_DIRS
    if _LIB_DIRS is None:
        dirs = set()
        for scheme_key in ("stdlib", "platstdlib", "purelib", "platlib"):
            p = sysconfig.get_paths().get(scheme_key)
            if p:
                dirs.add(os.path.realpath(p))
        for p in sys.path:
            if p and ("site-packages" in p or "dist-packages" in p or _holds_distributions(p)):
                # (as found too: a `--target` folder whose packages are links into a shared store)
                dirs.update((os.path.realpath(p), os.path.abspath(p)))
        dirs.add(os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))   # fsdp_lint itself
        _LIB_DIRS = tuple(sorted(dirs))
    return _LIB_DIRS


def _holds_distributions(folder: str) -> bool:
    """A folder on sys.path that pip installed packages into (``pip install --target DIR``, then
    ``PYTHONPATH=DIR``): it holds their ``*.dist-info`` metadata, so its modules are installed
    libraries, not the project's. A project's own folder holds none (an editable install keeps its
    metadata in site-packages; ``setup.py develop`` writes ``.egg-info``)."""
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(folder))
    except OSError:
        return False


def is_local(path: Optional[str]) -> bool:
    """A Python source file of the user's project (not the standard library, an installed package
    or fsdp-lint)."""
    if not path or not path.endswith(".py") or path.startswith("<"):
        return False
    local = _IS_LOCAL.get(path)
    if local is None:
        real = _realpath(path)
        norm = real.replace("\\", "/")
        local = not ("/site-packages/" in norm or "/dist-packages/" in norm) and \
            not any(found == d or found.startswith(d + os.sep) for d in _library_dirs()
                    for found in ((real, path) if os.path.isabs(path) else (real,)))
        _IS_LOCAL[path] = local
    return local


# path -> is_local: the replay asks it of every module in sys.modules (about 2,000 with torch) before
# each file; the fork server's warm-up fills it for the modules children inherit
_IS_LOCAL: Dict[str, bool] = {}
_REAL_DIRS: Dict[str, str] = {}


def _realpath(path: str) -> str:
    """``os.path.realpath(path)`` with the folders' real paths remembered: a module's folder is shared
    by its siblings (torch's 2,000 modules are in ~200 folders), so one lstat per file is left."""
    folder, name = os.path.split(path)
    if not os.path.isabs(folder):           # relative to the working folder, which the replay changes
        return os.path.realpath(path)
    real_folder = _REAL_DIRS.get(folder)
    if real_folder is None:
        real_folder = _REAL_DIRS[folder] = os.path.realpath(folder)
    joined = os.path.join(real_folder, name)
    return os.path.realpath(joined) if os.path.islink(joined) else joined


@dataclass
class Reach:
    """What an entry point reaches through its project-local imports."""
    entry: Entry
    modules: Dict[str, SourceFacts] = field(default_factory=dict)     # path -> facts (entry included)
    edges: Dict[str, List[Tuple[str, int]]] = field(default_factory=dict)  # path -> [(imported path, line)]
    unreadable: Dict[str, str] = field(default_factory=dict)          # path -> why (syntax error, ...)

    @property
    def wrap_paths(self) -> List[str]:
        """Modules holding FSDP wrap calls or auto-wrap policies."""
        return [p for p, f in self.modules.items() if f.uses_fsdp or f.sites_of("policy")]

    @property
    def model_paths(self) -> List[str]:
        return [p for p, f in self.modules.items() if f.defines_model]

    @property
    def framework_paths(self) -> List[str]:
        return [p for p, f in self.modules.items() if f.uses_framework]

    @property
    def reaches_fsdp(self) -> bool:
        return bool(self.wrap_paths or self.framework_paths)

    @property
    def reaches_model(self) -> bool:
        return bool(self.model_paths)

    def chain(self, target: str) -> List[str]:
        """The import chain from the entry to `target` (paths), for messages."""
        start = self.entry.path
        prev: Dict[str, Optional[str]] = {start: None}
        todo = [start]
        while todo:
            cur = todo.pop(0)
            if cur == target:
                break
            for nxt, _ in self.edges.get(cur, ()):
                if nxt not in prev:
                    prev[nxt] = cur
                    todo.append(nxt)
        if target not in prev:
            return [target]
        out = []
        node: Optional[str] = target
        while node is not None:
            out.insert(0, node)
            node = prev[node]
        return out

    def param_writers(self) -> Set[str]:
        """Names of the project's functions that write into an object they are given (`FunctionFacts.stores_into_params`):
        ``train_ds, train_dl = init_dataset_and_dataloader(configs, ...)`` sets ``configs["vocab_size"]`` the model
        is built from, though what it returns is not read."""
        return {f.name for facts in self.modules.values() for f in facts.functions.values()
                if f.stores_into_params and not f.is_method}

    def relevant_names(self) -> Tuple[Set[str], Set[str]]:
        """Names (functions, methods, classes whose constructor does so) that wrap, freeze, cast or
        build optimizers anywhere in the reached modules, and the subset that wraps: a call of one
        of them matters for the plan wherever it is written."""
        fns = [f for facts in self.modules.values() for f in facts.functions.values()]
        by_name: Dict[str, List] = {}
        for f in fns:
            by_name.setdefault(f.name, []).append(f)
        relevant: Set[str] = set()
        wraps: Set[str] = set()
        changed = True
        while changed:
            changed = False
            for facts in self.modules.values():
                mark_relevance(facts.functions, called_here(facts, relevant), called_here(facts, wraps))
                for f in facts.functions.values():
                    # a special method is called through its class (`Trainer(...)`), never by its name from another
                    # module: `super().__init__()` of every class elsewhere would count as a call of it
                    special = f.name.startswith("__") and f.name.endswith("__")
                    names = (set() if special else {f.name}) | (
                        {f.cls} if f.cls and f.name in ("__init__", "__post_init__") else set())
                    if f.relevant and not names <= relevant:
                        relevant |= names
                        changed = True
                    if f.wraps and not names <= wraps:
                        wraps |= names
                        changed = True
            # a relevant function handed over as a keyword in one module is called by that name in another
            modules = list(self.modules.values())
            for names in (relevant, wraps):
                found = keyword_relevance(modules, names) | instance_call_relevance(modules, names)
                if not found <= names:
                    names |= found
                    changed = True
        return relevant, wraps


# what import resolution found, shared by the entry points of one lint run (a directory of files in
# the same folders asks the same questions); ``forget()`` starts afresh (each run, as files may change)
_REPO_ROOTS: Dict[str, Optional[str]] = {}
_LOCAL_SYS_PATH: List[List[str]] = []
_SPECS: Dict[str, Optional[List[str]]] = {}
_RESOLVED: Dict[Tuple[Tuple[str, ...], str], Optional[str]] = {}


def forget() -> None:
    """Drop what import resolution remembered (a new lint run)."""
    _REPO_ROOTS.clear()
    _LOCAL_SYS_PATH.clear()
    _SPECS.clear()
    _RESOLVED.clear()


class Project:
    """Resolves imports to project files the way the replay's ``sys.path`` will."""

    def __init__(self, entry: Entry):
        self.entry = entry
        roots = [entry.root]
        folder = os.path.dirname(entry.path)
        if folder not in _REPO_ROOTS:
            _REPO_ROOTS[folder] = repo_root(entry.path)
        repo = _REPO_ROOTS[folder]
        # scripts in a repository often reach its package through sys.path tweaks or an editable
        # install: the repository root and its src/ are searched after the entry's own root
        if repo:
            roots += [repo, os.path.join(repo, "src")]
        if not _LOCAL_SYS_PATH:
            _LOCAL_SYS_PATH.append([p for p in sys.path if p and os.path.isdir(p) and is_local(os.path.join(p, "x.py"))])
        roots += _LOCAL_SYS_PATH[0]
        if entry.is_package_module and not entry.launched:
            # siblings imported as top-level modules (`python pkg/train.py`; `python -m pkg.train` adds no folder)
            roots.append(os.path.dirname(entry.path))
        seen: Set[str] = set()
        self.roots = [r for r in (os.path.abspath(r) for r in roots) if not (r in seen or seen.add(r))]
        self._roots_key = tuple(self.roots)
        self._spec_cache = _SPECS

    def module_name(self, path: str) -> Tuple[str, bool]:
        """(dotted name, is a package) of a project file, relative to the first root holding it."""
        path = os.path.abspath(path)
        if path == self.entry.path:
            return self.entry.module, os.path.basename(path) == "__init__.py"
        for root in self.roots:
            if path.startswith(root + os.sep):
                rel = os.path.relpath(path, root)[:-3].split(os.sep)
                is_pkg = rel[-1] == "__init__"
                if is_pkg:
                    rel = rel[:-1]
                return ".".join(rel), is_pkg
        return os.path.splitext(os.path.basename(path))[0], False

    def _search_dirs(self, top: str) -> List[str]:
        """Folders that may hold the top-level package/module `top`."""
        dirs = list(self.roots)
        if top not in self._spec_cache:
            found: Optional[List[str]] = None
            try:
                # an editable install of the repository maps its package through a finder: ask the
                # finders for the top-level name only (nothing is imported for a top-level spec)
                spec = importlib.util.find_spec(top) if top not in sys.modules else getattr(sys.modules[top], "__spec__", None)
            except (ImportError, ValueError, AttributeError):
                spec = None
            if spec is not None:
                locs = list(spec.submodule_search_locations or [])
                origin = spec.origin if spec.origin and spec.origin not in ("built-in", "frozen") else None
                if origin and is_local(origin):
                    found = [os.path.dirname(os.path.dirname(origin))] if locs else [os.path.dirname(origin)]
            self._spec_cache[top] = found
        return dirs + (self._spec_cache[top] or [])

    def resolve(self, dotted: str) -> Optional[str]:
        """The project file of module `dotted`, or None (not local, or not found)."""
        if not dotted:
            return None
        key = (self._roots_key, dotted)
        if key not in _RESOLVED:
            _RESOLVED[key] = self._resolve(dotted)
        return _RESOLVED[key]

    def _resolve(self, dotted: str) -> Optional[str]:
        parts = dotted.split(".")
        for base in self._search_dirs(parts[0]):
            d = os.path.join(base, *parts)
            for candidate in (d + ".py", os.path.join(d, "__init__.py")):
                if os.path.isfile(candidate) and is_local(candidate):
                    return os.path.abspath(candidate)
        return None

    def imports_of(self, path: str, facts: SourceFacts) -> List[Tuple[str, int]]:
        """Project files `path` imports: (file, line), packages' ``__init__`` included."""
        name, is_pkg = self.module_name(path)
        out: List[Tuple[str, int]] = []
        for imp in facts.imports:
            if imp.level:
                base_parts = name.split(".") if is_pkg else name.split(".")[:-1]
                if path == self.entry.path and self.entry.package is not None:
                    base_parts = self.entry.package.split(".")
                if imp.level - 1 > len(base_parts):
                    continue
                base_parts = base_parts[: len(base_parts) - (imp.level - 1)]
                base = ".".join(base_parts + ([imp.module] if imp.module else []))
            else:
                base = imp.module
            targets = []
            if base:
                # the packages on the way are imported too (their __init__ runs)
                pieces = base.split(".")
                targets += [".".join(pieces[:i]) for i in range(1, len(pieces) + 1)]
            for n in imp.names:
                if n != "*" and base:
                    targets.append(f"{base}.{n}")       # `from pkg import module`
            for t in targets:
                f = self.resolve(t)
                if f is not None and f != path:
                    out.append((f, imp.line))
        return out


_FACTS_CACHE: Dict[Tuple[str, float, int], SourceFacts] = {}


def facts_for(path: str) -> SourceFacts:
    """SourceFacts of a project file, cached per (path, mtime, size) in this process."""
    st = os.stat(path)
    key = (path, st.st_mtime, st.st_size)
    facts = _FACTS_CACHE.get(key)
    if console_call(path):          # (the entry of a console script: read as that script runs it)
        return parse_source(path, with_console_call(path, read_text(path)))
    if facts is None:
        facts = read_source(path)
        _FACTS_CACHE[key] = facts
    return facts


def reach(path: str, facts: Optional[SourceFacts] = None, limit: int = 2000) -> Reach:
    """The project-local modules `path` imports, transitively, with their facts."""
    entry = entry_for(path)
    project = Project(entry)
    out = Reach(entry=entry)
    out.modules[entry.path] = facts if facts is not None else facts_for(entry.path)
    todo = [entry.path]
    while todo and len(out.modules) < limit:
        cur = todo.pop(0)
        edges = project.imports_of(cur, out.modules[cur])
        out.edges[cur] = edges
        for nxt, _ in edges:
            if nxt in out.modules or nxt in out.unreadable:
                continue
            try:
                out.modules[nxt] = facts_for(nxt)
            except (SourceError, OSError) as exc:
                out.unreadable[nxt] = str(exc)
                continue
            todo.append(nxt)
    return out
