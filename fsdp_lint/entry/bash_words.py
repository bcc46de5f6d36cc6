"""How bash reads a launch script, without running it: logical lines (``\\`` continuations, quoted words
over several lines, arrays over several lines), comments, quotes, and the expansions it makes before
splitting words (``$VAR``, ``${VAR:-default}``, ``"$@"``, ``"${args[@]}"``). `fsdp_lint.entry.shell` finds
the launches in what this reads."""
from __future__ import annotations

import os
import re
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from fsdp_lint.entry.bash_substitutions import closing, substitute


class ShellError(Exception):
    """A launch script that cannot be read (or whose launch cannot be found): one line, exit 2."""


# $NAME, ${NAME}, ${NAME:-default} (also `-`, `:?`/`?` message, `:=`/`=`, `:+`/`+`), the pattern removals
# ${NAME#glob}/${NAME##glob}/${NAME%glob}/${NAME%%glob} (`${arg#*=}`: the value of `--opt=value`), ${NAME[@]}
# (an array's elements), ${NAME[0]}, $1, $@; a default holding another expansion (`${1:-${DIR}/x}`) matches once
# that is made
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*])(?:\[([@*]|[0-9]+)\])?"
                  r"((:?)([-?=+]|##?|%%?)([^{}]*)|:\s*(-?[0-9]+)(?::\s*(-?[0-9]+))?)?\}"
                  r"|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])")
_NAME = 9       # the group of `$NAME` without braces (groups 7 and 8: a slice's offset and length)


class UnsetError(ShellError):
    """``${NAME:?message}`` of a variable the script does not set: bash stops there."""
# `args=(` ... `)`: a bash array, its elements over several lines
_ARRAY = re.compile(r"^(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=\((.*)\)$", re.S)
_ARRAY_OPEN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?[A-Za-z_][A-Za-z0-9_]*\+?=\(")


# the script's own path, as bash runs it (`bash examples/run.sh`: $0 is examples/run.sh): `$0`, `${0}`,
# `${BASH_SOURCE[0]}`, and the folder idioms `$(dirname "$0")`, `$(cd "$(dirname "$0")" && pwd)`
_SELF = r'(?:"?\$\{?0\}?"?|"?\$\{BASH_SOURCE(?:\[0\])?\}"?)'
_SCRIPT_DIR_ABS = re.compile(r'\$\(\s*cd\s+"?\$\(\s*dirname\s+' + _SELF + r'\s*\)"?\s*(?:&&|;)\s*pwd(?:\s+-P)?\s*\)')
_SCRIPT_DIR = re.compile(r'\$\(\s*dirname\s+' + _SELF + r'\s*\)|`\s*dirname\s+' + _SELF + r'\s*`')
_SCRIPT_PATH = re.compile(r'\$\{BASH_SOURCE(?:\[0\])?\}|\$\{0\}|\$0(?![0-9])')


def with_script_path(text: str, script: str) -> str:
    """`text` with the script's own path and folder written in where bash computes them (a path with a
    space or quote is left as written)."""
    if any(c in script for c in " '\"$`\\"):
        return text
    folder = os.path.dirname(script) or "."
    text = _SCRIPT_DIR_ABS.sub(os.path.abspath(folder), text)
    text = _SCRIPT_DIR.sub(folder, text)
    return _SCRIPT_PATH.sub(script, text)


def _after(c: str, quote: Optional[str]) -> Optional[str]:
    """The quote open after the character `c` (not a backslash) read with `quote` open."""
    if quote is not None:
        return None if c == quote else quote
    return c if c in "'\"" else None


def _comment_at(text: str, i: int, quote: Optional[str]) -> bool:
    return quote is None and text[i] == "#" and (i == 0 or text[i - 1].isspace())


def _open_quote(line: str, quote: Optional[str]) -> Tuple[Optional[str], bool]:
    """The quote still open at the end of `line` (bash's rules: nothing escapes inside '...'; a
    backslash escapes the next character elsewhere; an unquoted ``#`` at a word's start is a comment),
    and whether the line ends in a comment (whose final backslash continues nothing)."""
    quote, i = _scan(line, quote)
    return quote, i < len(line)


def _scan(line: str, quote: Optional[str] = None) -> Tuple[Optional[str], int]:
    """The quote open at the end of `line`, or where its comment starts, and that position."""
    i = 0
    while i < len(line) and not _comment_at(line, i, quote):
        if line[i] == "\\" and quote != "'":
            i += 2
            continue
        quote = _after(line[i], quote)
        i += 1
    return quote, i


def _logical_lines(text: str) -> List[Tuple[int, List[Tuple[int, str]]]]:
    """(first line, [(line, text)] of its physical lines): a command with its `\\` continuations, and a
    quoted word over several lines (``ARGS="\\n--lr 1\\n--fsdp\\n"``: its newlines kept, as bash keeps them;
    each such piece but the last ends in a newline)."""
    out, pieces = [], []
    quote: Optional[str] = None
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw if quote else raw.rstrip()
        quote, commented = _open_quote(line, quote)
        cont = quote != "'" and line.endswith("\\") and not line.endswith("\\\\") and not commented
        if not cont and not quote and (pieces or _ARRAY_OPEN.match(line)) and _array_open(pieces, line):
            pieces.append((no, _uncommented(line) + "\n"))    # `args=(` ... `)`: one element or more a line
            continue
        if cont:     # inside double quotes bash drops the backslash-newline, words and all
            # (and outside them too where no blank ends the line: `val=[a,\` then `b]` is one word, `[a,b]`)
            glued = quote == '"' or (line[:-1][-1:] not in ("", " ", "\t") and not commented)
            pieces.append((no, line[:-1] + (_JOIN if glued else "")))
        elif quote:
            pieces.append((no, line + "\n"))
        else:
            pieces.append((no, line))
        if not cont and not quote:
            out.append((pieces[0][0], pieces))
            pieces = []
    if pieces:
        out.append((pieces[0][0], pieces))
    return out


def _uncommented(line: str) -> str:
    """`line` without its comment (a ``#`` at a word's start outside quotes)."""
    return line[:_scan(line)[1]].rstrip()


def _array_open(pieces, line: str) -> bool:
    """Whether the array assignment that `pieces` + `line` start is still open after `line` (its `(` not
    yet closed outside quotes)."""
    text = "".join(t for _, t in pieces) + _uncommented(line)
    if not _ARRAY_OPEN.match(text):
        return False
    depth = 0
    for _, _, depth in _unquoted(text, "(", ")"):
        pass
    return depth > 0


def _unquoted(text: str, opens: str, closes: str):
    """(index, character, nesting depth after it) of each character of `text` outside quotes and escapes, the
    depth counted over `opens`/`closes` (``(``/``)``: an array's elements; ``$(...)``, ``${...}``)."""
    depth, quote, i = 0, None, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and c in opens + closes:
            depth += 1 if c in opens else -1
        if quote is None and c not in "'\"":
            yield i, c, depth
        quote = _after(c, quote)
        i += 1


_JOIN = "\x1f"       # a continued line inside double quotes: joined to the next with nothing between


def _joined(pieces) -> str:
    """The command's text: continued lines joined by a space, a quoted word's lines by their newlines."""
    return "".join(t[:-1] if t.endswith(_JOIN) else t if t.endswith("\n") else t + " " for _, t in pieces).strip()


# what the simulated node's shell holds where neither the script nor the environment fsdp-lint runs in sets it: no
# CUDA_VISIBLE_DEVICES (a node shows its processes every GPU), so `[ -z "$CUDA_VISIBLE_DEVICES" ]` is true there
# (`CUDA_VISIBLE_DEVICES=0,1,2,3 fsdp-lint run.sh` gives the script four, as `... bash run.sh` does)
NODE_UNSET = {"CUDA_VISIBLE_DEVICES": ""}


def _value_of(m, env: Dict[str, str], positional: Sequence[str]):
    """What one expansion gives: a string, the script's arguments (a list, for ``$@``/``$*``), or None
    (a variable neither the script nor the environment sets: kept as written)."""
    name = m.group(1) or m.group(_NAME)
    if m.group(7) is not None:      # `${@:2}`, `${ARGS[@]:1:3}`, `${NAME:0:4}`: a slice
        return _slice(name, m, env, positional)
    if name in "@*":
        return list(positional)
    if name == "#":
        return str(len(positional))
    if name.isdigit():       # the script's own arguments ($0 is the script)
        index = int(name)
        value = positional[index - 1] if 0 < index <= len(positional) else None
    else:
        value = env.get(name, os.environ.get(name, NODE_UNSET.get(name)))
    if isinstance(value, list):     # an array: "${NAME[@]}" its elements, ${NAME[k]} one, $NAME the first
        sub = m.group(2)
        if sub in ("@", "*"):
            return list(value)
        index = int(sub) if sub else 0
        value = value[index] if index < len(value) else ""
    if m.group(3) is not None:
        unset = value is None or (value == "" and m.group(4) == ":")
        op, word = m.group(5), _expand(m.group(6), env, positional)
        if op[0] in "#%":
            return None if value is None else _removed(value, op, word)
        if op == "?" and unset:
            raise UnsetError(f"{name}: {word or 'parameter null or not set'}")
        if op in "-=" and unset:
            return word
        if op == "+":
            return "" if unset else word
    if value is None:
        return "" if name.isdigit() else None
    return value


def _slice(name: str, m, env: Dict[str, str], positional: Sequence[str]):
    """bash's slices: ``${@:N:L}`` the arguments from the N-th ($0 is the 0th), ``${ARR[@]:N:L}`` elements,
    ``${NAME:N:L}`` characters (a negative offset counts from the end)."""
    offset, length = int(m.group(7)), (int(m.group(8)) if m.group(8) is not None else None)
    if name in "@*":
        items = [None] + list(positional)       # (`$0` first: the script; `${@:1}` is every argument)
    else:
        value = env.get(name, os.environ.get(name))
        if value is None:
            return None
        items = list(value) if isinstance(value, list) and m.group(2) in ("@", "*") else None
        if items is None:
            text = value[0] if isinstance(value, list) else value
            start = offset if offset >= 0 else max(len(text) + offset, 0)
            return text[start:] if length is None else text[start:start + length] if length >= 0 else \
                text[start:len(text) + length]
    start = offset if offset >= 0 else max(len(items) + offset, 0)
    picked = items[start:] if length is None else items[start:start + length]
    return [item for item in picked if item is not None]


def _removed(value: str, op: str, pattern: str) -> str:
    """bash's ``${NAME#pattern}`` (the shortest matching prefix removed), ``##`` (the longest), ``%``/``%%``
    (suffixes): `pattern` is a glob."""
    import fnmatch

    shortest = len(op) == 1
    for cut in (range(len(value) + 1) if shortest else range(len(value), -1, -1)):
        piece = value[:cut] if op[0] == "#" else value[len(value) - cut:]
        if fnmatch.fnmatchcase(piece, pattern):
            return value[cut:] if op[0] == "#" else value[:len(value) - cut]
    return value


def _expand(text: str, env: Dict[str, str], positional: Sequence[str] = ()) -> str:
    def sub(m):
        value = _value_of(m, env, positional)
        if value is None:
            return m.group(0)
        return " ".join(value) if isinstance(value, list) else value
    text = _lengths(text, env, positional)
    for _ in range(4):      # (a default holding an expansion: the inner one first)
        expanded = _outside_single_quotes(text, lambda part: _VAR.sub(sub, part))
        if expanded == text:
            break
        text = expanded
    return _substituted(text, lambda t: _expand(t, env, positional))


def _outside_single_quotes(text: str, fn) -> str:
    """`text` with `fn` applied to what is not single-quoted (bash expands nothing in ``'...'``: an awk program's
    ``'{print $2}'`` inside a command substitution keeps its fields)."""
    if "'" not in text:
        return fn(text)
    out, start, i, double = [], 0, 0, False
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            i += 2
            continue
        if c == '"':
            double = not double
        elif c == "'" and not double:
            end = text.find("'", i + 1)
            if end < 0:
                break
            out += [fn(text[start:i]), text[i:end + 1]]
            start = i = end + 1
            continue
        i += 1
    return "".join(out) + fn(text[start:])


def _substituted(text: str, expand) -> str:
    """`text` with the ``$((...))``/``$(expr ...)``/``$(cd DIR && pwd)`` bash computes written in."""
    out, i = [], 0
    while True:
        j = text.find("$(", i)
        if j < 0:
            return "".join(out) + text[i:]
        end = closing(text, j + 1)
        value = substitute(text[j + 2:end], expand) if end is not None else None
        if value is None:
            out.append(text[i:j + 2])
            i = j + 2
            continue
        out.append(text[i:j] + value)
        i = end + 1


def _split(text: str) -> List[str]:
    """bash's words of `text` (not expanded); a command substitution is part of its word, its own quotes
    its command's (``RUN="exp$(suffix "$@")"`` is one word)."""
    spans: List[str] = []
    out, i, quote = [], 0, None
    while i < len(text):
        c = text[i]
        end = closing(text, i + 1) if c == "$" and quote != "'" and text.startswith("$(", i) else \
            closing(text, i + 1, "{", "}") if c == "$" and quote != "'" and text.startswith("${#", i) else None
        if end is not None:         # (`${#ARR[@]}`: its `#` is no comment)
            spans.append(text[i:end + 1])
            out.append(f"\x00{len(spans) - 1}\x00")
            i = end + 1
            continue
        if c == "\\" and quote != "'":
            out.append(text[i:i + 2])
            i += 2
            continue
        quote = (None if c == quote else quote) if quote else (c if c in "'\"" else None)
        out.append(c)
        i += 1
    words = shlex.split("".join(out), comments=True)
    if not spans:
        return words
    return [re.sub("\x00(\\d+)\x00", lambda m: spans[int(m.group(1))], w) for w in words]


def _value_words(value: str) -> List[str]:
    """An unquoted value split on whitespace, as bash splits it; a command substitution it holds that was not
    computed here stays one word (bash splits its output, which a suffix or a name rarely has spaces in: not its
    command's text)."""
    if "$(" not in value:
        return value.split()
    words, current, i = [], "", 0
    while i < len(value):
        end = closing(value, i + 1) if value.startswith("$(", i) else None
        if end is not None:
            current, i = current + value[i:end + 1], end + 1
            continue
        if value[i].isspace():
            if current:
                words.append(current)
            current = ""
        else:
            current += value[i]
        i += 1
    return words + ([current] if current else [])


def _expanded_words(text: str, env: Dict[str, str], positional: Sequence[str]) -> List[str]:
    """bash's words of `text`: expansions are made before the words are split, as bash makes them --
    one inside double quotes stays in its word, an unquoted one is split on whitespace (``$ARGS`` of
    ``ARGS="--lr 1 --fsdp"`` is three words), ``"$@"`` is each argument as a word; nothing in a value
    is read as quotes. Single-quoted text is not expanded."""
    text = _lengths(text, env, positional)
    out: List[str] = []
    quote: Optional[str] = None
    i = 0
    while i < len(text) and not _comment_at(text, i, quote):
        c = text[i]
        if c == "\\" and quote != "'":
            out.append(text[i:i + 2])
            i += 2
            continue
        if c == "$" and quote != "'" and text.startswith("$(", i):
            end = closing(text, i + 1)
            value = substitute(text[i + 2:end], lambda t: _expand(t, env, positional)) if end is not None else None
            if value is not None:       # `$((16 / n))`, `$(expr 16 / $n)`, `$(cd "$DIR/.." && pwd)`
                out.append(value.replace('"', '\\"') if quote == '"' else shlex.quote(value))
                i = end + 1
                continue
            if end is not None:         # not computed here: kept as written, one word (its own quotes are its
                raw = text[i:end + 1]   # command's, `"exp$(suffix "$@")"`, not the word's)
                out.append(raw.replace('"', '\\"') if quote == '"' else shlex.quote(raw))
                i = end + 1
                continue
        if c == "$" and quote != "'":
            m = _VAR.match(text, i)
            if m is None and text.startswith("${", i):      # `${1:-${DIR}/x}`: the inner expansion first
                end = closing(text, i + 1, "{", "}")
                if end is not None:
                    m = _VAR.fullmatch("${" + _expand(text[i + 2:end], env, positional) + "}")
                    if m is not None:
                        value = _value_of(m, env, positional)
                        if value is not None:
                            text = text[:i] + m.group(0) + text[end + 1:]
                            m = _VAR.match(text, i)
            value = _value_of(m, env, positional) if m else None
            if m and value is None and (m.group(1) or m.group(_NAME) or "").isidentifier():
                # a variable neither the script nor the environment sets: bash expands it to nothing; marked,
                # so the launcher's options keep its name (`unset_literal`) and the script's arguments lose it
                # (`settled`); an unset array's "${A[@]}" is no word at all
                name = m.group(1) or m.group(_NAME)
                value = [] if m.group(2) in ("@", "*") else (_UNSET_QUOTED if quote == '"' else _UNSET) + name + _UNSET
            if m and value is not None:
                if quote == '"' and isinstance(value, list):   # "$@": each argument its own word
                    out.append('"' + " ".join(shlex.quote(a) for a in value) + '"' if value else _NO_WORD)
                elif quote == '"':
                    out.append(value.replace("\\", "\\\\").replace('"', '\\"'))
                else:                                       # word splitting
                    words = value if isinstance(value, list) else _value_words(value)
                    out.append(" ".join(shlex.quote(w) for w in words))
                i = m.end()
                continue
        out.append(c)
        quote = _after(c, quote)
        i += 1
    # `"$@"` alone with no arguments gives no word at all (not an empty one)
    return [w.replace(_NO_WORD, "") for w in shlex.split("".join(out)) if w != _NO_WORD]


_UNSET, _UNSET_QUOTED, _NO_WORD = "\x01", "\x02", "\x03"
_MARKED = re.compile("[\x01\x02]([A-Za-z_][A-Za-z0-9_]*)\x01")


def unset_literal(word: str) -> str:
    """`word` with each unset variable written back as ``$NAME`` (what a launcher option's note names)."""
    return _MARKED.sub(lambda m: "$" + m.group(1), word)


def settled(words: Sequence[str]) -> Tuple[List[int], List[str], List[str]]:
    """The words bash passes, of `words` with unset variables marked: (the indices kept, their text, the unset
    names). An unquoted unset variable alone is no word; inside quotes or a word it is the empty text."""
    kept, text, names = [], [], []
    for n, word in enumerate(words):
        for m in _MARKED.finditer(word):
            if m.group(1) not in names:
                names.append(m.group(1))
        bare = _MARKED.sub("", word)
        if bare == "" and "\x02" not in word and _MARKED.search(word):
            continue
        kept.append(n)
        text.append(bare)
    return kept, text, names


def _tokens(pieces, env: Dict[str, str], positional: Sequence[str] = ()) -> List[Tuple[str, int]]:
    """The command's words after expansion, each with the script line it is written on (a quoted word
    over several lines: the command's first line)."""
    if not any(text.endswith(_JOIN) for _, text in pieces):
        try:
            return [(w, no) for no, text in pieces for w in _expanded_words(text, env, positional)]
        except ValueError:
            pass
    try:
        return [(w, pieces[0][0]) for w in _expanded_words(_joined(pieces), env, positional)]
    except ValueError as exc:
        raise ShellError(f"line {pieces[0][0]}: cannot read the command: {exc}") from None




_SIMPLE_HEAD = re.compile(r"^(?:(?:export|local|readonly)\s+)?[A-Za-z_][A-Za-z0-9_]*\+?=|^(?:export\s+[A-Za-z_]\w*\s*$|cd\s)")


def leading_simple_command(text: str) -> Optional[Tuple[str, str]]:
    """(the assignment or `cd`, the rest) of a list that starts with one -- ``NUM_GPUS=8; torchrun ...``,
    ``cd repo && python train.py``: bash runs the first, then the rest (an assignment always succeeds) -- or None."""
    if not _SIMPLE_HEAD.match(text):
        return None
    for i, c, depth in _unquoted(text, "({", ")}"):
        if depth == 0 and (c == ";" and text[i + 1:i + 2] != ";" or text.startswith("&&", i)):
            head, rest = text[:i].strip(), text[i + (1 if c == ";" else 2):].strip()
            return (head, rest) if head and rest and not rest.startswith("#") else None
    return None


_LENGTH = re.compile(r"\$\{#([A-Za-z_][A-Za-z0-9_]*|@|\*)(\[[@*]\])?\}")


def _lengths(text: str, env: Dict[str, str], positional: Sequence[str]) -> str:
    """`text` with bash's lengths written in: ``${#ARR[@]}`` an array's elements, ``${#NAME}`` a value's
    characters, ``${#@}`` the arguments (a variable nothing sets is left as written)."""
    def length(m):
        name, all_of = m.group(1), m.group(2)
        if name in "@*":
            return str(len(positional))
        value = env.get(name, os.environ.get(name, NODE_UNSET.get(name)))
        if value is None:
            return m.group(0)
        if isinstance(value, list):
            return str(len(value) if all_of else len(value[0]) if value else 0)
        return str(1 if all_of else len(value))
    return _LENGTH.sub(length, text) if "${#" in text else text


_READ_ARRAY = re.compile(r"^(?:IFS=(?:'([^']*)'|\"([^\"]*)\"|(\S*))\s+)?read\s+(?:-[rs]*a[rs]*|-r\s+-a|-a)\s+"
                         r"([A-Za-z_]\w*)\s*<<<\s*(.+)$")


def read_array(text: str, env: Dict[str, str], positional: Sequence[str]) -> Optional[Tuple[str, List[str]]]:
    """``IFS=',' read -ra ARR <<< "$LIST"``: (the array's name, its elements, split at IFS as bash splits), or None
    for another line or a value not known here."""
    m = _READ_ARRAY.match(text.strip())
    if not m:
        return None
    ifs = next((g for g in m.groups()[:3] if g is not None), " \t\n")
    try:
        words = _expanded_words(m.group(5), env, positional)
    except ValueError:          # (an unbalanced quote: not read here, as any such line)
        return None
    if len(words) != 1 or "$" in words[0]:
        return None
    parts = re.split("[" + re.escape(ifs) + "]", words[0]) if ifs else [words[0]]
    if parts and parts[-1] == "":
        parts = parts[:-1]          # (bash drops one empty field at the end)
    if ifs.strip() != ifs or not ifs:
        parts = [p for p in parts if p]     # whitespace in IFS: runs of it are one separator
    return m.group(4), parts
