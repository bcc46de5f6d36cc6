"""Dora's launcher: ``dora run [-d] [--ddp_workers N] ARGS`` (audiocraft, demucs, and other projects on
facebookresearch/dora).

``dora [-P PKG] [--main_module MOD] run [-f SIG] [-d] [--ddp_workers N] [--git_save] [--clear] ARGS`` imports
``PKG.MOD`` -- PKG from ``-P``, else ``$DORA_PACKAGE``, else the one folder of the current folder with an
``__init__.py`` and a ``MOD.py``; MOD from ``--main_module``, else ``$DORA_MAIN_MODULE``, else ``train`` --
and calls its ``main`` (a ``@dora.main``/``@hydra_main``-decorated function) with ``sys.argv[1:] = ARGS``.
``-d`` starts one worker per GPU of the node (``--ddp_workers N``: N); without it the job is one process
(``WORLD_SIZE=1``). As a launch to lint: ``python -m PKG.MOD ARGS``, whose ``__main__`` block calls ``main()``
as dora does (`fsdp_lint.entry.shell` checks it).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from fsdp_lint.entry.bash_words import ShellError

# dora's own options (global, then `run`'s) that take a value
_GLOBAL_VALUES = {"-P", "--package", "--main_module"}
_RUN_VALUES = {"-f", "--from_sig", "--ddp_workers"}


def is_dora(words: List[str], i: int) -> Optional[int]:
    """The index after ``dora`` (``dora ...``, ``python -m dora ...``) when the command at `i` is dora's
    launcher, else None."""
    head = os.path.basename(words[i]) if i < len(words) else ""
    if head == "dora":
        return i + 1
    if head.startswith("python") and words[i + 1:i + 3] == ["-m", "dora"]:
        return i + 3
    return None


def dora_launch(words: List[str], start: int, env: Dict[str, str]) -> Optional[dict]:
    """What ``dora ... run ...`` from `start` launches: {"package", "main_module", "argv" (the indexes of the
    job's own words), "world_size", "every_gpu_of"}, or {"refused": word} for an option dora's parser refuses;
    None for dora's other commands (grid, info, launch: a cluster's scheduler)."""
    opts: Dict[str, Optional[str]] = {}
    j = start
    while j < len(words) and words[j] != "run":
        w = words[j]
        if w in _GLOBAL_VALUES and j + 1 < len(words):
            opts[w.lstrip("-")], j = words[j + 1], j + 2
            continue
        if w.startswith("--") and "=" in w:
            name, _, value = w.partition("=")
            opts[name.lstrip("-")] = value
        elif not w.startswith("-"):
            return None             # `dora grid ...`, `dora info ...`
        j += 1
    if j >= len(words):
        return None
    ddp, workers, argv, j = False, None, [], j + 1
    while j < len(words):          # argparse's: options anywhere until `--`, the rest is the job's ARGS
        w = words[j]
        name, eq, value = w.partition("=")
        if w == "--":
            argv += range(j + 1, len(words))
            break
        if name in _RUN_VALUES:
            if not eq:
                value, j = (words[j + 1] if j + 1 < len(words) else ""), j + 1
            if name == "--ddp_workers":
                workers = value
        elif name in ("-d", "--ddp"):
            ddp = True
        elif w in ("--git_save", "--clear"):
            pass
        elif w.startswith("-"):
            return {"refused": w}   # dora's parser: `unrecognized arguments` (the job's own flags go after --)
        else:
            argv.append(j)
        j += 1
    package = opts.get("P") or opts.get("package") or env.get("DORA_PACKAGE") or os.environ.get("DORA_PACKAGE")
    module = opts.get("main_module") or env.get("DORA_MAIN_MODULE") or os.environ.get("DORA_MAIN_MODULE") or "train"
    count = int(workers) if workers and workers.isdigit() else None
    return {"package": package, "main_module": module, "argv": argv,
            "world_size": (count if ddp and count else None if ddp else 1),
            "every_gpu_of": 1 if ddp and not count else None}


def find_package(main_module: str, folder: str) -> List[str]:
    """dora's search: the folders of `folder` with an ``__init__.py`` and a ``MAIN_MODULE.py``."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(folder, n, "__init__.py"))
            and os.path.isfile(os.path.join(folder, n, main_module + ".py"))]


def dora_module(dora: dict, cd: Optional[str], line: int) -> str:
    """``PKG.MOD`` that `dora run` imports (its package found as dora finds it, in the folder it runs in)."""
    package = dora["package"]
    if package is None:
        folder = cd or os.getcwd()
        found = find_package(dora["main_module"], folder)
        if len(found) != 1:
            what = "no package" if not found else f"several packages ({', '.join(found)})"
            raise ShellError(f"line {line} runs `dora run`, which finds {what} with an __init__.py and a "
                             f"{dora['main_module']}.py in {os.path.relpath(folder)}: dora stops there too (use -P, "
                             f"or set DORA_PACKAGE)")
        package = found[0]
    return f"{package}.{dora['main_module']}"
