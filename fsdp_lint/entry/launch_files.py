"""Where a launch script's launched file is: a file from the folder the script runs in (or the folders around
it), a module's file (``python -m pkg.train``), the project's console script's module, and the close names of a
file that is not there."""
from __future__ import annotations

import functools
import os
import re
from typing import Dict, Optional, Tuple

from fsdp_lint.entry.bash_words import ShellError
from fsdp_lint.entry.console_launch import top_level_names


def _resolve(name: str, script: str, cd: Optional[str]) -> Tuple[Optional[str], str]:
    """The launched file: from the folder the script `cd`s to, the current folder, the script's folder, or
    a folder above it (a script in scripts/ run from the repository root)."""
    here = os.path.dirname(os.path.abspath(script))
    bases = ([cd] if cd else []) + [os.getcwd(), here]
    up = here
    for _ in range(3):
        up = os.path.dirname(up)
        bases.append(up)
    for base in bases:
        cand = os.path.join(base, name) if not os.path.isabs(name) else name
        if os.path.isfile(cand):
            return os.path.abspath(cand), os.path.abspath(base)
    return None, os.getcwd()


def _near(name: str, script: str, cd: Optional[str]) -> str:
    """``; its folder has main_training_llama.py`` for a launched file that is not there (a script left
    behind by a rename): the files of that folder whose names are close to it, or ""."""
    import difflib

    here = os.path.dirname(os.path.abspath(script))
    for base in filter(None, (cd, os.getcwd(), here, os.path.dirname(here))):
        folder = os.path.normpath(os.path.join(base, os.path.dirname(name)))
        try:
            files = [f for f in os.listdir(folder) if f.endswith(".py")]
        except OSError:
            continue
        close = difflib.get_close_matches(os.path.basename(name), files, n=3, cutoff=0.6)
        if close:
            where = "the current folder" if folder == os.getcwd() else f"{os.path.relpath(folder)}/"
            return f"; {where} has {', '.join(sorted(close))}"
    return ""


def _module_file(module: str, script: str, cd: Optional[str]) -> Tuple[Optional[str], str]:
    """The file `python -m module` runs (``pkg/mod.py`` or ``pkg/mod/__main__.py``, also under ``src/``)."""
    rel = module.replace(".", os.sep)
    for cand in (rel + ".py", os.path.join(rel, "__main__.py"), os.path.join("src", rel + ".py"),
                 os.path.join("src", rel, "__main__.py")):
        path, base = _resolve(cand, script, cd)
        if path is not None:
            return path, (os.path.dirname(base) if base.endswith(os.sep + "src") else base)
    # the repository's sub-project (a git submodule `verl/` with its setup.py and package `verl/verl/`), which the
    # README installs with `pip install -e ./verl`: the module is its file, found from the sub-project's folder
    top = module.split(".")[0]
    for cand in (os.path.join(top, rel + ".py"), os.path.join(top, rel, "__main__.py")):
        path, base = _resolve(cand, script, cd)
        project = os.path.join(base, top)
        if path is not None and any(os.path.isfile(os.path.join(project, m)) for m in ("setup.py", "pyproject.toml")):
            return path, project
    return None, os.getcwd()


# packages whose modules launch or serve jobs (their command lines), never a job's training module
_LAUNCHER_PACKAGES = frozenset({"torch", "accelerate", "deepspeed", "lightning", "pytorch_lightning", "transformers",
                                "composer", "torchx", "ray", "pip", "pytest"})


def installed_module_file(module: str) -> Tuple[Optional[str], str]:
    """The file `python -m module` runs when the module is an installed package's, not the project's
    (``python -m verl.trainer.main_ppo`` with verl installed), found without importing anything: only a
    package built on torch (its requirements reach torch) is a training launch -- ``python -m pip install``,
    ``-m pytest`` are not."""
    import importlib.util

    top, *rest = module.split(".")
    if top in _LAUNCHER_PACKAGES:
        return None, os.getcwd()        # (`python -m accelerate.commands.launch ...`: a launcher, not the job)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None, os.getcwd()
    if spec is None or not spec.submodule_search_locations or not _built_on_torch(top):
        return None, os.getcwd()
    for location in spec.submodule_search_locations:
        base = os.path.join(location, *rest)
        for cand in (base + ".py", os.path.join(base, "__main__.py")):
            if os.path.isfile(cand):
                return os.path.abspath(cand), os.path.dirname(os.path.abspath(location))
    return None, os.getcwd()


@functools.lru_cache(maxsize=1)
def _packages():
    """import name -> distributions, read once (it walks every installed distribution's files)."""
    from importlib import metadata

    return metadata.packages_distributions()


def _built_on_torch(top: str, depth: int = 3) -> bool:
    """Whether the distribution of import name `top` requires torch, directly or through its requirements."""
    from importlib import metadata

    def name(requirement: str) -> str:
        return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")

    todo = list(_packages().get(top, []))
    seen = set()
    for _ in range(depth):
        nxt = []
        for dist in todo:
            key = dist.lower().replace("_", "-")
            if key in seen:
                continue
            seen.add(key)
            try:
                requires = metadata.requires(dist) or []
            except metadata.PackageNotFoundError:
                continue
            needed = [name(r) for r in requires if "extra ==" not in r]
            if "torch" in needed:
                return True
            nxt.extend(needed)
        todo = nxt
    return False


def _module_root(path: str, module: str) -> str:
    """The folder `module` resolves from, `path` being its file (``.../gritlm/training/run.py`` of
    ``training.run``: ``.../gritlm``)."""
    depth = len(module.split(".")) - (0 if os.path.basename(path) == "__main__.py" else 1)
    root = os.path.dirname(path)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def _console_commands(script: str, cd: Optional[str]) -> Dict[str, str]:
    """The console scripts of the repository the script is in (or runs in): command -> "module:function"."""
    from fsdp_lint.entry.launches import console_scripts
    from fsdp_lint.entry.project import repo_root

    out: Dict[str, str] = {}
    for start in filter(None, (cd, os.path.dirname(os.path.abspath(script)), os.getcwd())):
        root = repo_root(start)
        if root:
            for name, target in console_scripts(root):
                out.setdefault(name, target)
    return out


def _console_file(command: str, target: str, script: str, cd: Optional[str], line: int) -> Tuple[str, str, Optional[str]]:
    """The file a console script runs, its folder, and the function the script calls after importing it when
    running the file as a script does not call it (None when it does)."""
    module, _, function = target.partition(":")
    path, base = _module_file(module, script, cd)
    if path is None:
        raise ShellError(f"line {line} runs `{command}`, the project's command ({target}), whose module is "
                         f"not in this checkout")
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    name = function.split(".")[0]
    defined = top_level_names(text)
    if defined is not None and name not in defined:
        raise ShellError(f"line {line} runs `{command}`, the project's command ({target}), but {os.path.relpath(path)} "
                         f"defines no `{name}`: the command fails there on a node too (ImportError: cannot import name "
                         f"'{name}'); lint the file as `python {os.path.relpath(path)}` runs it, or fix the entry point")
    main = re.search(r"^if\s+__name__\s*==\s*[\"']__main__[\"']\s*:(.*?)(?=^\S|\Z)", text, re.S | re.M)
    if not main or not re.search(rf"\b{re.escape(function.split('.')[-1])}\s*\(", main.group(1)):
        # pip's wrapper imports the module and calls the function (``sys.exit(main())``): so does the replay
        return path, base, function
    return path, base, None
