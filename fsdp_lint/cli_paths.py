"""The files a command line names and its two halves (fsdp-lint's own arguments, the script's after
``--``), and the lines it prints about them, without click: shared by the command line (``cli``) and
the fast paths that print before click is imported (``fastpath``), so that both see the same files
and say the same."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".tox", ".nox", "node_modules",
              "site-packages", "build", "dist", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".eggs"}


class BadInput(Exception):
    pass


def collect_files(paths, missing: Optional[List[str]] = None) -> List[Tuple[str, bool]]:
    """(file, named on the command line) for every file to lint: directories are walked for *.py.
    A path that does not exist raises BadInput, or goes to `missing`."""
    files: List[Tuple[str, bool]] = []
    for p in paths:
        if os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
                for name in sorted(filenames):
                    # regular files only: opening a FIFO (or a device) in a walked folder blocks for ever
                    if name.endswith(".py") and os.path.isfile(os.path.join(dirpath, name)):
                        files.append((os.path.join(dirpath, name), False))
        elif os.path.isfile(p):
            files.append((p, True))
        elif missing is not None:
            missing.append(p)
        else:
            raise BadInput(missing_message(p))
    return files


def missing_message(path: str) -> str:
    """Why `path` (named on the command line, neither a folder nor a regular file) is not linted."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return f"{path}: no such file or directory"
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"{path}: {kind}, not a regular file: fsdp-lint reads regular files only"


def split_script_args(argv: List[str]) -> Tuple[List[str], Optional[List[str]]]:
    """fsdp-lint's own arguments and the script's (after ``--``). A leading ``--`` is dropped:
    ``torchrun -m fsdp_lint -- train.py --run`` passes it to keep torchrun's parser off the rest."""
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def not_python(path: str) -> bool:
    """A file named on the command line that is not Python source (a config, a notebook, data)."""
    if path.endswith((".py", ".pyw")):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(128)
    except OSError:
        return True
    return not (head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0])


def with_path(path: str, msg: str) -> str:
    """`msg` prefixed with the file as the user named it (engine messages may start with the basename)."""
    from fsdp_lint.humanize import display_path

    shown = display_path(path)
    msg = msg.strip().splitlines()[0] if msg.strip() else "unknown error"
    for prefix in (path, os.path.abspath(path), shown):
        if msg.startswith(prefix + ":"):
            return shown + msg[len(prefix):]
    base = os.path.basename(path)
    if msg.startswith(base + ":"):
        return shown + msg[len(base):]
    if msg.startswith("--model"):
        return msg
    return f"{shown}: {msg}"


def skipped_note(path: str, reason: str) -> str:
    """The line on stderr for a file named on the command line that is not linted."""
    return (f"fsdp-lint: {with_path(path, 'not linted: ' + reason)} "
            f"(to lint a model built elsewhere, pass --model path.py:Class or path.py:factory)")


def use_color(output) -> bool:
    """Colour on a terminal; NO_COLOR (no-color.org) turns it off, FORCE_COLOR on (a CI log)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    import sys

    return output is None and sys.stdout.isatty()
