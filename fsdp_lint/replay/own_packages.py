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
    sub = _sub_project(top, here)
    if sub is not None:
        return sub
    folder = os.path.dirname(here)
    for _ in range(4):
        member = os.path.join(folder, top, "src", top, "__init__.py")
        if os.path.isfile(member) and not os.path.isfile(os.path.join(folder, top, "__init__.py")):
            # a workspace member (`mylib/src/mylib/`): its folder at the root is an empty namespace package
            return (f"`{top}` is the repository's own package {top}/src/{top} (in {folder}), which is not installed: "
                    f"its folder {top}/ at the root imports as an empty namespace package; install it "
                    f"(`pip install -e {top}`) or put {top}/src on PYTHONPATH")
        for cand in (os.path.join(folder, top, "__init__.py"), os.path.join(folder, top + ".py")):
            if os.path.isfile(cand):
                # (the folder written whole: the replay runs in the launch's folder, not where the user is)
                return (f"`{top}` is the repository's own package (in {folder}), which python does not find from "
                        f"the script's folder ({os.path.basename(here)}/): put that folder on PYTHONPATH (as a launch "
                        f"script's `cd {os.path.basename(folder)}; export PYTHONPATH=.` does) or install the repository")
        if any(os.path.exists(os.path.join(folder, m)) for m in _REPO_MARKS) or folder == os.path.dirname(folder):
            break
        folder = os.path.dirname(folder)
    return None


def _sub_project(top: str, here: str) -> Optional[str]:
    """`top` is a sub-project of the repository (a git submodule ``verl/`` holding ``verl/setup.py`` and its
    package ``verl/verl/``) that is not installed: from the repository its folder imports as an empty namespace
    package, and python stops at the first name imported from it."""
    folder = here
    for _ in range(4):
        project = os.path.join(folder, top)
        if os.path.isfile(os.path.join(project, top, "__init__.py")) and \
                not os.path.isfile(os.path.join(project, "__init__.py")) and \
                any(os.path.isfile(os.path.join(project, m)) for m in ("setup.py", "pyproject.toml")):
            shown = os.path.relpath(project) if not os.path.relpath(project).startswith("..") else project
            return (f"`{top}` is the repository's sub-project {shown}/ (its package {top}/{top}), which is not "
                    f"installed: its folder imports as an empty namespace package; install it "
                    f"(`pip install -e {shown}`, as the repository's setup does)")
        if any(os.path.exists(os.path.join(folder, m)) for m in _REPO_MARKS) or folder == os.path.dirname(folder):
            break
        folder = os.path.dirname(folder)
    return None
