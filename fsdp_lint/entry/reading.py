"""`reading`: a Python file's text as Python reads it, and the one-line error when it cannot be read."""
from __future__ import annotations


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
