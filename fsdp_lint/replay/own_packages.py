"""A module the replay could not import that is the repository's own package (``mylib/`` next to ``scripts/``,
imported by ``scripts/train.py``): python does not find it from the launched script's folder, and the repository
is not installed. The cause is the search path (the launch script's PYTHONPATH, an editable install), never a
package to `pip install` from the index."""
from __future__ import annotations

import os
from typing import Optional

_REPO_MARKS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def own_package(top: str, entry_path: Optional[str]) -> Optional[str]:
    """Why `top` is not importable when it is a package of the entry's repository, or None."""
    if not entry_path or not top.isidentifier():
        return None
    here = os.path.dirname(os.path.abspath(entry_path))
    folder = here
    for _ in range(5):
        member = _member_package(folder, top)
        if member is not None and member.endswith(os.sep + "src"):
            # a workspace member (`mylib/src/mylib/`): its folder at the root is an empty namespace package
            return (f"`{top}` is the repository's own package {top}/src/{top} (in {folder}), which is not installed: "
                    f"its folder {top}/ at the root imports as an empty namespace package; install it "
                    f"(`pip install -e {top}`) or put {top}/src on PYTHONPATH")
        if member is not None:
            # a git submodule with its own setup (`verl/` holding `verl/verl/`): the same, from the repository
            shown = os.path.relpath(member)
            shown = member if shown.startswith("..") else shown
            return (f"`{top}` is the repository's sub-project {shown}/ (its package {top}/{top}), which is not "
                    f"installed: its folder imports as an empty namespace package; install it "
                    f"(`pip install -e {shown}`, as the repository's setup does)")
        for cand in (os.path.join(folder, top, "__init__.py"), os.path.join(folder, top + ".py")):
            if folder != here and os.path.isfile(cand):
                # (the folder written whole: the replay runs in the launch's folder, not where the user is)
                return (f"`{top}` is the repository's own package (in {folder}), which python does not find from "
                        f"the script's folder ({os.path.basename(here)}/): put that folder on PYTHONPATH (as a launch "
                        f"script's `cd {os.path.basename(folder)}; export PYTHONPATH=.` does) or install the repository")
        if any(os.path.exists(os.path.join(folder, m)) for m in _REPO_MARKS) or folder == os.path.dirname(folder):
            break
        folder = os.path.dirname(folder)
    return None


def _member_package(folder: str, top: str) -> Optional[str]:
    """The folder holding package `top` of a sub-project `folder/top/` that is no package itself: ``top/src`` (a
    workspace member) or ``top`` with its setup.py/pyproject.toml (a git submodule), else None."""
    project = os.path.join(folder, top)
    if os.path.isfile(os.path.join(project, "__init__.py")):
        return None
    if os.path.isfile(os.path.join(project, "src", top, "__init__.py")):
        return os.path.join(project, "src")
    if os.path.isfile(os.path.join(project, top, "__init__.py")) and \
            any(os.path.isfile(os.path.join(project, m)) for m in ("setup.py", "pyproject.toml")):
        return project
    return None
