"""`scan`: what a file's text alone says, for the quick screen (``entry.quick``): its import
statements and whether it parses, each answered only where the answer is certain.

Most plain files are decided without ``ast.parse``, by two checks that can only say "certainly":

* their import statements, read from the text (``import_candidates``): every occurrence of the word
  ``import`` must be the keyword of a line of a form read exactly (``import a.b as c, d``, ``from ..m
  import x``, ``from m import (x,`` ... ``y)``) or sit in a comment line, with no quote in what is read
  as a comment and no backslash continuing the line before. Such a line is that import statement if
  it is code at all: text from a string's inside that reads as one adds a candidate more (which can
  only send the file to the syntax tree), and a real statement cannot hide in it -- with no quote in
  it a string cannot end there, and inside brackets there are no statements. Anything else (``;
  import``, ``if x: import``, ``import`` in a docstring's prose, a non-ASCII name) answers None: the
  syntax tree decides;
* their syntax (``parses``): ``_symtable`` runs CPython's own parser (the one ``ast.parse`` runs) and
  then the symbol table, without building the tree's Python objects, which are most of what
  ``ast.parse`` costs. It raises every error ``ast.parse`` raises and a few more (``nonlocal`` at module
  level), so its success means ``ast.parse`` succeeds -- up to the recursion limit of building the
  objects, a few levels below the symbol table's: it is trusted only on a file whose tree cannot come
  near that depth (``_MAX_OWNING``), and not on one whose parse warns (the warning is then
  ``ast.parse``'s to show, once, as before).
"""
from __future__ import annotations

import re
from typing import List, Optional

from fsdp_lint.entry.source import ImportInfo

_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?![A-Za-z0-9_])"
_DOTTED = rf"{_NAME}(?:[ \t]*\.[ \t]*{_NAME})*"
_ALIASED = rf"{_DOTTED}(?:[ \t]+as[ \t]+{_NAME})?"
_END = r"[ \t]*(?:#[^\n]*)?(?:\n|\Z)"
_IMPORT_RE = re.compile(rf"[ \t]*(?P<kw>import)[ \t]+(?P<names>{_ALIASED}(?:[ \t]*,[ \t]*{_ALIASED})*){_END}")
_FROM_RE = re.compile(
    rf"[ \t]*from(?:[ \t]*(?P<dots>\.+)[ \t]*(?P<rel>{_DOTTED})?|[ \t]+(?P<abs>{_DOTTED}))[ \t]+(?P<kw>import)[ \t]*"
    rf"(?:(?P<star>\*)|(?P<names>{_NAME}(?:[ \t]+as[ \t]+{_NAME})?(?:[ \t]*,[ \t]*{_NAME}(?:[ \t]+as[ \t]+{_NAME})?)*)"
    rf"|\((?P<group>(?:[ \t\n,]|#[^\n]*|{_NAME})*)\)){_END}")
_WORD_CHAR = re.compile(r"\w")      # as ``\b`` sees a word
_COMMENT_LINE = re.compile(r"[ \t]*#[^\n]*")
_COMMENT = re.compile(r"#[^\n]*")
_AS = re.compile(r"\s+as\s+")
_SPACE = re.compile(r"\s+")


class Imports:
    """What ``project.Project.imports_of`` reads of a file (its ``imports``)."""

    def __init__(self, imports: List[ImportInfo]):
        self.imports = imports


def _names(text: str) -> List[str]:
    """``a . b as c, d`` -> [a.b, d]."""
    return [_SPACE.sub("", _AS.split(part)[0]) for part in text.split(",") if part.strip()]


def import_candidates(text: str) -> Optional[List[ImportInfo]]:
    """The file's import statements as ``ImportsOnly`` reads them from the syntax tree (module, level,
    names), read from its text, and maybe a few more; None when that cannot be certain. (Of a file
    that parses: the syntax is ``parses``'s to check.)"""
    out: List[ImportInfo] = []
    covered = 0           # the end of the last line read: an ``import`` before it is part of it
    pos = -1
    while True:
        pos = text.find("import", pos + 1)
        if pos < 0:
            break
        if pos < covered or (pos and _WORD_CHAR.match(text, pos - 1)) or _WORD_CHAR.match(text, pos + 6):
            continue                       # inside the last statement read, or part of a longer word
        start = text.rfind("\n", 0, pos) + 1
        if start >= 2 and text[start - 2] == "\\":
            return None                    # the line continues the one before
        m = _COMMENT_LINE.match(text, start)
        if m is None or m.end() <= pos:
            m = _IMPORT_RE.match(text, start) or _FROM_RE.match(text, start)
            if m is None or m.start("kw") != pos:
                return None
        read = m.group(0)
        if "'" in read or '"' in read:
            return None                    # a string may end in what reads as a comment
        covered = m.end()
        if m.re is _COMMENT_LINE:
            continue
        line = text.count("\n", 0, start) + 1
        if m.re is _IMPORT_RE:
            out += [ImportInfo(name, 0, [], line, False) for name in _names(m.group("names"))]
            continue
        if m.group("star"):
            names = ["*"]
        else:
            names = _names(m.group("names") if m.group("names") is not None else _COMMENT.sub("", m.group("group")))
        out.append(ImportInfo(_SPACE.sub("", m.group("rel") or m.group("abs") or ""), len(m.group("dots") or ""),
                              names, line, False))
    return out


# how deep ``ast.parse`` builds a tree before its recursion limit: CPython 3.11 about 2,980 levels, less
# three per Python frame of the caller; 3.12 about 2,990; 3.13 5,966 and more. A tree is at most about
# twice as deep as the tokens its nodes own on the way down (an operator, a bracket, a dot, a comma,
# a keyword), plus two per indentation level (at most 100): a file with at most this many of them
# cannot come near that limit, whichever module it is nested in (the count is of characters and words
# anywhere in the text, strings and comments included: more, never fewer, than the tokens)
_MAX_OWNING = 890
_NOT_OWNING = bytes(b for b in range(256) if chr(b) not in "()[]{}:,;.+-*/%@&|^~<>=!\"'")
# these words own the rest (counted anywhere, inside other words too: more, never fewer)
_OWNING_WORDS = ("and", "or", "not", "lambda", "if", "for", "await", "yield", "in", "is", "as", "from")


def parses(path: str, text: str) -> bool:
    """``ast.parse(text)`` certainly succeeds, and shows no warning (False: not certain)."""
    owning = len(text.encode("utf-8", "surrogatepass").translate(None, _NOT_OWNING))
    if owning > _MAX_OWNING or owning + sum(map(text.count, _OWNING_WORDS)) > _MAX_OWNING:
        return False
    import _symtable
    import warnings

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        try:
            _symtable.symtable(text, path, "exec")
        except Exception:  # noqa: BLE001 - SyntaxError, ValueError (a NUL byte), RecursionError, MemoryError
            return False
    return not shown
