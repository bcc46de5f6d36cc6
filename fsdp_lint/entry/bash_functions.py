"""A launch script's shell functions, as bash runs them: a definition (``name() { ... }``, ``function name {
... }``) runs nothing where it stands; a call of it (``name ARGS`` as a command) runs its body there, with ``$1``,
``$@`` ... the call's arguments and the script's own back after it. (A function body read as top-level code ran
its argument loop over the script's arguments and changed them: a wrong plan.)"""
from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

from fsdp_lint.entry.bash_words import _expanded_words

Logical = List[Tuple[int, List[Tuple[int, str]]]]

# the markers of a call the shell reader runs: positional arguments set to the call's, then put back
CALL_BEGIN = "__fsdp_lint_call__"
CALL_END = "__fsdp_lint_return__"

_DEFINITION = re.compile(r"^\s*(?:function\s+([A-Za-z_][\w:-]*)\s*(?:\(\s*\))?|([A-Za-z_][\w:-]*)\s*\(\s*\))\s*(\{)?\s*$")
_OPENS = re.compile(r"(?:^|\s)\{\s*$")


def inline_functions(logical: Logical) -> Logical:
    """`logical` with the definitions taken out and each call of a defined function replaced by its body,
    between a `CALL_BEGIN ARGS` and a `CALL_END` line."""
    functions: Dict[str, Logical] = {}
    kept: Logical = []
    k = 0
    while k < len(logical):
        start, pieces = logical[k]
        text = " ".join(t for _, t in pieces).strip()
        m = _DEFINITION.match(text)
        if m is None:
            kept.append(logical[k])
            k += 1
            continue
        name = m.group(1) or m.group(2)
        body, k = _body(logical, k + 1, opened=m.group(3) is not None)
        functions[name] = body
    if not functions:
        return logical
    return _calls_inlined(kept, functions, depth=0)


def _body(logical: Logical, k: int, opened: bool) -> Tuple[Logical, int]:
    """The lines of a function's body from `k` (its `{` on the definition's line if `opened`), and the index
    after its closing `}`."""
    if not opened:              # `name()` then `{` on a line of its own
        if k < len(logical) and " ".join(t for _, t in logical[k][1]).strip() == "{":
            k += 1
    depth, body = 1, []
    while k < len(logical):
        text = " ".join(t for _, t in logical[k][1]).strip()
        if text in ("}", "};") or text.startswith("} ") and not text.startswith("} ;"):
            depth -= 1
            if depth == 0:
                return body, k + 1
        elif _OPENS.search(text) or _DEFINITION.match(text):
            depth += 1
        body.append(logical[k])
        k += 1
    return body, k


def _calls_inlined(lines: Logical, functions: Dict[str, Logical], depth: int) -> Logical:
    out: Logical = []
    for start, pieces in lines:
        text = " ".join(t for _, t in pieces).strip()
        word = text.split(None, 1)[0] if text else ""
        if word in functions and depth < 8:
            args = text[len(word):].strip()
            for operator in (" && ", " || ", " | ", ";", " > ", " >> ", " 2>"):
                args = args.split(operator, 1)[0]       # (`train_stage 1 2>&1 | tee log`: the call's own words)
            out.append((start, [(start, f"{CALL_BEGIN} {args}".rstrip())]))
            out.extend(_calls_inlined(functions[word], functions, depth + 1))
            out.append((start, [(start, CALL_END)]))
            continue
        out.append((start, pieces))
    return out


def function_call(line: str, calls: List[Sequence[str]], positional: Sequence[str], env, runs: bool) -> Sequence[str]:
    """The script's arguments after a `CALL_BEGIN ARGS` line (the call's, expanded with the caller's) or a
    `CALL_END` line (the caller's again); a call in a branch bash does not take changes nothing."""
    if line.split(None, 1)[0] == CALL_END:
        return calls.pop() if calls else positional
    calls.append(positional)
    if not runs:
        return positional
    try:
        return tuple(_expanded_words(line[len(CALL_BEGIN):], env, positional))
    except ValueError:
        return ()
