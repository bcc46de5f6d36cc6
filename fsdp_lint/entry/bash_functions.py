"""A launch script's shell functions, as bash runs them: a definition (``name() { ... }``, ``function name {
... }``) runs nothing where it stands; a call of it (``name ARGS`` as a command) runs its body there, with ``$1``,
``$@`` ... the call's arguments and the script's own back after it. (A function body read as top-level code ran
its argument loop over the script's arguments and changed them: a wrong plan.)"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from fsdp_lint.entry.bash_words import _expanded_words

Logical = List[Tuple[int, List[Tuple[int, str]]]]

# the markers of a call the shell reader runs: positional arguments set to the call's, then put back
CALL_BEGIN = "__fsdp_lint_call__"
CALL_END = "__fsdp_lint_return__"

_DEFINITION = re.compile(r"^\s*(?:function\s+([A-Za-z_][\w:-]*)\s*(?:\(\s*\))?|([A-Za-z_][\w:-]*)\s*\(\s*\))"
                         r"\s*(\{)?\s*$")
_OPENS = re.compile(r"(?:^|\s)\{\s*$")


def inline_functions(logical: Logical, functions: Dict[str, Logical] = None) -> Logical:
    """`logical` with the definitions taken out and each call of a defined function replaced by its body,
    between a `CALL_BEGIN ARGS` and a `CALL_END` line; `functions` (given) receives the definitions."""
    functions = {} if functions is None else functions
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


# `$(name ARGS)` of a defined function (`SUFFIX=$(generate_suffix "$@")`, `RUN="exp$(suffix "$@")"`)
_SUBSTITUTED_CALL = re.compile(r"^\$\(\s*([A-Za-z_][\w:-]*)(\s[^()]*)?\)$")
_CALL_START = re.compile(r"\$\(\s*([A-Za-z_][\w:-]*)")
_ECHO = re.compile(r"^(\s*)echo\s+(?:-[neE]+\s+)?(.*)$")
OUTPUT = "__fsdp_lint_output__"


def substituted_call(value: str, functions: Dict[str, Logical]):
    """(the function's body as script text, its arguments' text) when `value` is ``$(name ARGS)`` of a function
    the script defines, else None. The body's ``echo`` lines append to `OUTPUT`: what the substitution gives."""
    m = _SUBSTITUTED_CALL.match(value)
    if m is None or m.group(1) not in functions:
        return None
    lines = []
    for _, pieces in functions[m.group(1)]:
        text = "\\\n".join(t for _, t in pieces) if len(pieces) > 1 else pieces[0][1]
        echo = _ECHO.match(text)
        lines.append(f'{echo.group(1)}{OUTPUT}+={echo.group(2)}' if echo and "$(" not in echo.group(2) else text)
    return "\n".join(lines) + "\n", (m.group(2) or "").strip()


def function_output(called, env, exported, positional, read) -> Optional[str]:
    """What ``$(name ARGS)`` of a function the script defines gives: its body (`substituted_call`) read as the
    script's lines are read (`read(path, arguments, (environment, exported))`: its argument loop over ARGS, its
    assignments, nothing run), its ``echo`` collected; None where that cannot be read."""
    import os
    import tempfile

    from fsdp_lint.entry.bash_words import ShellError

    body, args = called
    try:
        given = tuple(_expanded_words(args, env, positional))
    except ValueError:
        return None
    scratch = {k: v for k, v in env.items() if k != OUTPUT}       # (its `local` variables stay its own)
    with tempfile.TemporaryDirectory(prefix="fsdp-lint-fn-") as folder:
        path = os.path.join(folder, "function.sh")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(body)
        try:
            read(path, given, (scratch, set(exported)))
        except (ShellError, OSError, ValueError, RecursionError):
            return None         # (what cannot be read is left as written, and named where it fails)
    out = scratch.get(OUTPUT)
    return out if isinstance(out, str) else None


def with_outputs(value: str, functions: Dict[str, Logical], env, exported, positional, read) -> str:
    """`value` with each ``$(name ARGS)`` of a function the script defines replaced by what it gives
    (`function_output`); any other substitution, and one that cannot be read, left as written."""
    if not functions or "$(" not in value:
        return value
    from fsdp_lint.entry.bash_substitutions import closing

    out, i = "", 0
    while i < len(value):
        m = _CALL_START.match(value, i)
        end = closing(value, i + 1) if m and m.group(1) in functions else None
        called = substituted_call(value[i:end + 1], functions) if end is not None else None
        output = function_output(called, env, exported, positional, read) if called else None
        if output is not None:
            out, i = out + output, end + 1
            continue
        out, i = out + value[i], i + 1
    return out
