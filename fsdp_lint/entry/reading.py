"""`reading`: a Python file's text as Python reads it, and the one-line error when it cannot be read."""
from __future__ import annotations

import os


class SourceError(Exception):
    """The file cannot be read or parsed (message is one line)."""


def read_text(path: str) -> str:
    """A Python file's text as Python reads it: UTF-8 (a byte-order mark is not part of the code), or
    the encoding its ``# -*- coding: ... -*-`` line declares."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None
    # the common case, decoded as tokenize.open decodes it (UTF-8, universal newlines): no byte-order
    # mark, no ``coding`` in the first two lines (where a coding line may be), valid UTF-8
    if not data.startswith(b"\xef\xbb\xbf") and b"coding" not in b"\n".join(data.split(b"\n", 2)[:2]):
        try:
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError:
            pass                      # tokenize.open says what is wrong, as before
    import tokenize

    try:
        with tokenize.open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:   # SyntaxError: an unknown encoding
        raise SourceError(f"cannot read {path}: {exc}") from None


def python_requirement_note(path: str) -> str:
    """" (pyproject.toml asks for requires-python >=3.12; fsdp-lint runs on Python 3.11.7)" when the nearest
    pyproject.toml above `path` asks for a Python this one is not (its syntax is newer: PEP 695's ``type`` and
    ``def f[T]()``), else ""."""
    import platform

    folder = os.path.dirname(os.path.abspath(path))
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            break
        parent = os.path.dirname(folder)
        if parent == folder:
            return ""
        folder = parent
    try:
        import tomllib

        with open(candidate, "rb") as fh:
            wanted = ((tomllib.load(fh).get("project") or {}).get("requires-python") or "").strip()
    except Exception:  # noqa: BLE001  (Python < 3.11, an unreadable file: no note)
        return ""
    if not wanted:
        return ""
    here = platform.python_version()
    try:
        from packaging.specifiers import SpecifierSet

        fits = here in SpecifierSet(wanted)
    except Exception:  # noqa: BLE001  (no packaging, a spec it refuses: no note)
        return ""
    return "" if fits else (f" ({os.path.relpath(candidate)} asks for requires-python {wanted}; fsdp-lint runs on "
                            f"Python {here}: run it with the project's Python)")
