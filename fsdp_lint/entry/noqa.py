"""``# noqa`` comments, read from a module's text: the line and the codes each one suppresses.

Two kinds, as ruff has them: a line's ``# noqa`` / ``# noqa: FSD201, FSD3`` at the end of the reported
line, and a file's ``# fsdp-lint: noqa`` / ``# fsdp-lint: noqa: FSD301`` on a line of its own (ruff's
``# ruff: noqa``), which suppresses those codes (all, when bare) anywhere in the file. Only real
comments count: ``# noqa`` inside a string (a docstring that explains it) suppresses nothing.
"""
from __future__ import annotations

import io
import re
import tokenize
from typing import Dict, Iterator, List, Optional, Set, Tuple

_NOQA = re.compile(r"#\s*noqa\b(?P<colon>\s*:)?(?P<rest>.*)", re.IGNORECASE)
_FILE_NOQA = re.compile(r"#\s*fsdp-lint\s*:\s*noqa\b(?P<colon>\s*:)?(?P<rest>.*)", re.IGNORECASE)
_NOQA_CODE = re.compile(r"[A-Za-z]+[0-9]+")


def _comments(text: str) -> Iterator[Tuple[int, int, str]]:
    """(line, column, text) of each comment; every ``#`` of a line when the text does not tokenize."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.start[1], tok.string
        return
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    for i, line in enumerate(text.splitlines(), start=1):
        at = line.find("#")
        if at >= 0:
            yield i, at, line[at:]


def _codes(m) -> Optional[List[Tuple[str, int]]]:
    """The codes after ``noqa:`` with their columns in the match's string (None: a bare noqa, all;
    []: ``# noqa:`` not followed by codes, which suppresses nothing, as in ruff)."""
    if not m.group("colon"):
        return None
    out: List[Tuple[str, int]] = []
    for token in re.finditer(r"[^\s,]+", m.group("rest")):
        if not _NOQA_CODE.fullmatch(token.group()):
            break                       # the codes end where the explanation starts
        out.append((token.group().upper(), m.start("rest") + token.start()))
    return out


def noqa_comments(text: str) -> Iterator[dict]:
    """Every noqa comment: {"line", "col" (1-based, of the ``#``), "file" (a file-level one), "codes"
    (None: bare; else [(code, 1-based column)]), "end" (1-based column after the comment)}."""
    if "noqa" not in text.lower():
        return
    lines = text.splitlines()
    for line, col, comment in _comments(text):
        own_line = not lines[line - 1][:col].strip() if line <= len(lines) else False
        m = _FILE_NOQA.match(comment) if own_line else None
        is_file = m is not None
        m = m or _NOQA.search(comment)
        if m is None:
            continue
        codes = _codes(m)
        if codes is not None:
            codes = [(c, col + at + 1) for c, at in codes]
        yield {"line": line, "col": col + m.start() + 1, "file": is_file, "codes": codes,
               "end": col + len(comment.rstrip()) + 1}


def _as_map(text: str, file_level: bool) -> Dict[int, Optional[Set[str]]]:
    out: Dict[int, Optional[Set[str]]] = {}
    for c in noqa_comments(text):
        if c["file"] != file_level:
            continue
        if c["codes"] is None:
            out[c["line"]] = None
        elif c["codes"]:
            out[c["line"]] = {code for code, _ in c["codes"]}
    return out


def _noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    """line -> the codes its ``# noqa: FSD201, FSD3`` suppresses (None: a bare ``# noqa``, all).
    As ruff does, a ``# noqa:`` not followed by codes (letters then digits: ``# noqa: see below``,
    ``# noqa:``) suppresses nothing."""
    return _as_map(text, file_level=False)


def file_noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    """line -> the codes a ``# fsdp-lint: noqa: FSD301`` there suppresses in the whole file (None: all)."""
    return _as_map(text, file_level=True)
