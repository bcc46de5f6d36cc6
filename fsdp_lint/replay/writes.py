"""What the setup code writes does not outlive the replay.

A training script writes as it sets up: a run folder with its log and a copy of its arguments
(``logs/<name>/out.log``, ``params.txt``), a checkpoints folder, a data set's cache. Left behind, they are
the user's tree changed by a lint -- and the next lint of the same file reads them (open_lm refuses to start:
"Experiment logs/<name>/out.log already exists"). While a file is replayed, the files and folders that
did not exist are noted as they are created (``open`` for writing, ``os.mkdir``, which ``os.makedirs``,
``pathlib.Path.mkdir`` and ``tempfile`` use), and an existing file opened for writing keeps its content;
when the replay ends, the new ones are removed and the rewritten ones get their content back.
"""
from __future__ import annotations

import builtins
import io
import os
import shutil
from typing import Any, Callable, Dict, List

Patch = Callable[[Any, str, Any], None]

# an existing file larger than this that the setup rewrites is not kept (a lint does not copy a data set)
_KEEP_AT_MOST = 64 << 20


def install(rec, patch: Patch) -> None:
    created: List[str] = []             # paths that did not exist, in the order they were made
    kept: Dict[str, bytes] = {}         # path -> the content of an existing file opened for writing
    real_open, real_mkdir = builtins.open, os.mkdir

    def tracking_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and isinstance(mode, str) and any(c in mode for c in "wax+"):
            path = os.path.abspath(os.fsdecode(file))
            if not os.path.lexists(path):
                created.append(path)
            elif path not in kept and os.path.isfile(path):
                try:
                    if os.path.getsize(path) <= _KEEP_AT_MOST:
                        with real_open(path, "rb") as fh:
                            kept[path] = fh.read()
                except OSError:
                    pass        # unreadable here: the open below says what it says
        return real_open(file, mode, *args, **kwargs)

    def tracking_mkdir(path, mode=0o777, *, dir_fd=None):
        full = os.path.abspath(os.fsdecode(path)) if dir_fd is None else None
        existed = full is None or os.path.lexists(full)
        if dir_fd is None:
            real_mkdir(path, mode)
        else:
            real_mkdir(path, mode, dir_fd=dir_fd)
        if not existed:
            created.append(full)

    def undo() -> None:
        for path, content in kept.items():
            try:
                with real_open(path, "wb") as fh:
                    fh.write(content)
            except OSError:
                pass
        for path in reversed(created):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)     # made by the replay, with all it holds
                elif os.path.lexists(path):
                    os.remove(path)
            except OSError:
                pass
        created.clear()
        kept.clear()

    patch(builtins, "open", tracking_open)
    patch(io, "open", tracking_open)
    patch(os, "mkdir", tracking_mkdir)
    rec.__dict__.setdefault("after_replay", []).append(undo)
