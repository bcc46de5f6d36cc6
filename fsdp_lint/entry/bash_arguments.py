"""A launch script's own argument loop, run as bash runs it on the arguments it is given:

    while [[ $# -gt 0 ]]; do
      case "$1" in
        --script_path) script_path="$2"; shift 2 ;;
        --nproc) nproc="$2"; shift 2 ;;
        *) FORWARD_ARGS=("$@"); break ;;
      esac
    done

a ``for arg in "$@"; do case "$arg" in --model=*) model="${arg#*=}" ;; esac; done`` over the arguments
(``for arg; do`` too), and a lone ``case "$1" in ... esac``. The arm whose pattern matches runs: its assignments (arrays too), its
``shift``, ``break``/``continue``, and an ``exit`` (bash stops: the script refuses its arguments). Other
commands in an arm (``echo``, ``usage``) change nothing a launch reads. A loop or case this cannot decide (a
test on something the script does not set, a launch inside an arm) is left to the line-by-line reader."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from fsdp_lint.entry.bash_branches import condition
from fsdp_lint.entry.bash_words import (_ARRAY, ShellError, _expand, _expanded_words, _joined, _uncommented, settled,
                                        unset_literal)

_SCALAR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
# a launch in a block's arms, a script it runs (`bash sub.sh`, `./run.sh`) or a function call (inlined): the
# line-by-line reader follows those
_LAUNCHING = re.compile(r"\b(torchrun|accelerate|deepspeed|python3?|srun)\b|\.py\b|__fsdp_lint_call__|"
                        r"(?:^|[;&|(]|\)|\n)\s*(?:(?:ba)?sh\s+[\w./$\"{}-]+\.sh\b|\./[\w./-]+\.sh\b)", re.M)
_ARGUMENTS_LEFT = re.compile(r'^\(\(\s*"?\$#"?\s*(>\s*0\s*)?\)\)$')    # `(( $# ))`, `(( "$#" > 0 ))`
_MAX_ROUNDS = 256


class _Exit(Exception):
    pass


def _first_words(pieces) -> List[str]:
    try:
        return shlex.split(_uncommented(_joined(pieces)))
    except ValueError:
        return []


def _block_end(lines, k: int, opener: Tuple[str, ...], closer: str) -> Optional[int]:
    """The index after the line that closes the block `lines[k]` opens (nested blocks counted)."""
    depth = 0
    for n in range(k, len(lines)):
        words = [w.rstrip(";") for w in _first_words(lines[n][1])]
        depth += sum(1 for i, w in enumerate(words) if w in opener and (i == 0 or words[i - 1] in ("do", "then", "else")))
        depth -= words.count(closer)
        if depth <= 0:
            return n + 1
    return None


def _statements(text: str) -> List[str]:
    """`text` split at `;` and newlines outside quotes and parentheses (an array's `(...)` stays one)."""
    out, cur, quote, depth, i = [], [], None, 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if quote is None and depth == 0 and c in ";\n":
            out.append("".join(cur).strip())
            cur = []
        else:
            if quote is None and c in "()":
                depth += 1 if c == "(" else -1
            if c in "'\"" and quote in (None, c):
                quote = None if quote else c
            cur.append(c)
        i += 1
    out.append("".join(cur).strip())
    return [s for s in out if s]


def _arms(body: str) -> Optional[List[Tuple[List[str], str]]]:
    """The (patterns, commands) of a case statement's arms (``a|b) cmds ;;``)."""
    arms, rest = [], body
    while rest.strip():
        rest = rest.lstrip()
        m = re.match(r"\(?\s*((?:[^()\s|]+\s*\|\s*)*[^()\s|]+)\s*\)", rest)
        if not m:
            return None
        end = _top_level(rest, ";;", m.end())
        arms.append(([p.strip() for p in m.group(1).split("|")], rest[m.end():end]))
        rest = rest[end + 2:] if end < len(rest) else ""
    return arms


def _top_level(text: str, mark: str, i: int) -> int:
    quote = None
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote is None and text.startswith(mark, i):
            return i
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        i += 1
    return len(text)


def _case(text: str, env: Dict, positional: Sequence[str]):
    """(the word, its arms, the commands after ``esac``) of ``case WORD in ARMS esac; CMDS`` text, or None."""
    m = re.match(r"\s*case\s+(\S+)\s+in\b(.*?)\besac\b\s*;?(.*)$", text, re.S)
    if not m:
        return None
    words = _expanded_words(m.group(1), env, positional)
    word = words[0] if len(words) == 1 else "" if not words else None
    arms = _arms(m.group(2))
    if word is None or arms is None or "$" in unset_literal(word):
        return None
    return word, arms, m.group(3)


def _run_arm(commands: str, env: Dict, positional: List[str], line: int, script: str, word: str) -> Optional[str]:
    """Run one arm on (env, positional), both changed in place: "break", "continue" or None."""
    for statement in _statements(commands):
        array = _ARRAY.match(statement)
        if array:
            name, append, inner = array.groups()
            elements = _expanded_words(inner, env, positional)
            before = env.get(name) if append else None
            env[name] = (before if isinstance(before, list) else [before] if before else []) + elements
            continue
        words = _expanded_words(statement, env, positional)
        if not words:
            continue
        if all(_SCALAR.match(w) for w in words):
            for w in words:
                name, append, value = _SCALAR.match(w).groups()
                value = settled([value])[1][0] if settled([value])[1] else ""      # an unset variable: empty
                env[name] = (env.get(name, "") if append and isinstance(env.get(name), str) else "") + value
        elif words[0] == "shift":
            count = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
            if count <= len(positional):
                del positional[:count]
        elif words[0] in ("break", "continue"):
            return words[0]
        elif words[0] == "exit" and (words[1:2] or ["0"])[0] != "0":
            raise ShellError(f"line {line}: {os.path.basename(script)}'s argument loop exits for `{word}` "
                             f"(its arm for it runs `{statement}`): bash stops there, before the launch")
        elif words[0] == "exit":
            raise _Exit()
    return None


_UNDECIDED = object()


def _run_case(text: str, state: Dict, left: List[str], line: int, script: str):
    """Run ``case WORD in ARMS esac; CMDS`` once: the arm WORD matches, then the commands after it ("break",
    "continue" or None), or `_UNDECIDED` when the case cannot be read."""
    parsed = _case(text, state, left)
    if parsed is None:
        return _UNDECIDED
    word, arms, after = parsed
    arm = next((cmds for patterns, cmds in arms if any(fnmatch.fnmatchcase(word, _pattern(p, state, left))
                                                         for p in patterns)), None)
    outcome = _run_arm(arm, state, left, line, script, word) if arm is not None else None
    return _run_arm(after, state, left, line, script, word) if outcome is None else outcome


def argument_block(lines, k: int, env: Dict, positional: Sequence[str], script: str):
    """(the index after the block, the arguments left) when `lines[k]` opens an argument loop (``while`` on
    ``$#``/``$1`` around a ``case``) or a ``case`` this runs, its assignments made in `env`; else None."""
    words = _first_words(lines[k][1])
    if not words or words[0] not in ("while", "case", "for"):
        return None
    if words[0] == "case":
        end, header = _block_end(lines, k, ("case",), "esac"), None
    elif words[0] == "for":
        return _for_block(lines, k, env, positional, script)
    else:
        end = _block_end(lines, k, ("while", "until", "for"), "done")
        header = words[:words.index("do")] if "do" in words else words
    if end is None or words[0] == "while" and (header[1:2] == ["["] or header[1:2] == ["[["]) is False and \
            not _ARGUMENTS_LEFT.match(" ".join(header[1:])):
        return None
    body = "\n".join(_uncommented(_joined(p)) for _, p in lines[k:end])
    if header is not None:
        inner = re.search(r"\bdo\b(.*)\bdone\s*;?\s*$", body, re.S)
        if inner is None:
            return None
        body = inner.group(1).strip()
    if _LAUNCHING.search(body):
        return None             # a launch in an arm: the line-by-line reader follows it

    def run(state: Dict, left: List[str]) -> bool:
        rounds = 0
        while True:
            if header is not None:
                test = " ".join(header[1:])
                go = bool(left) if _ARGUMENTS_LEFT.match(test) else condition(["if", *header[1:]], state, left)
                if go is None:
                    return False
                if not go:
                    return True
            before = len(left)
            outcome = _run_case(body, state, left, lines[k][0], script)
            if outcome is _UNDECIDED:
                return False
            rounds += 1
            if header is None or outcome == "break":
                return True
            if len(left) == before and outcome != "continue" or rounds > _MAX_ROUNDS:
                return False     # an arm that shifts nothing would loop forever in bash: not followed
    return _ran(run, env, positional, end, lines[k][0], script)


def _ran(run, env: Dict, positional: Sequence[str], end: int, line: int, script: str):
    """(`end`, the arguments left) after `run(state, left)` ran the block on copies of the script's variables
    and arguments (and they are made the script's), or None when it could not be decided."""
    state, left = dict(env), list(positional)
    try:
        if not run(state, left):
            return None
    except _Exit:
        raise ShellError(f"line {line}: {os.path.basename(script)}'s argument loop exits for the arguments given "
                         f"(`exit 0`): bash launches nothing") from None
    except ValueError:
        return None
    env.clear()
    env.update(state)
    return end, tuple(left)


def _for_block(lines, k: int, env: Dict, positional: Sequence[str], script: str):
    """``for NAME in WORDS; do case ... esac; done`` (``for NAME; do``: over "$@"): the case run once per
    word with NAME set to it, as `argument_block` runs a ``while`` loop's."""
    end = _block_end(lines, k, ("while", "until", "for"), "done")
    if end is None:
        return None
    body = "\n".join(_uncommented(_joined(p)) for _, p in lines[k:end])
    m = re.match(r"\s*for\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?:\bin\b(.*?))?\s*(?:;|\n)\s*do\b(.*)\bdone\s*;?\s*$", body, re.S)
    if m is None or _LAUNCHING.search(m.group(3)):
        return None
    name, listed, inner = m.group(1), m.group(2), m.group(3).strip()

    def run(state: Dict, left: List[str]) -> bool:
        for item in (_expanded_words(listed, state, left) if listed is not None else list(left)):
            state[name] = item
            outcome = _run_case(inner, state, left, lines[k][0], script)
            if outcome is _UNDECIDED:
                return False
            if outcome == "break":
                break
        return True
    return _ran(run, env, positional, end, lines[k][0], script)


def _pattern(pattern: str, env: Dict, positional: Sequence[str]) -> str:
    if len(pattern) >= 2 and pattern[0] == pattern[-1] and pattern[0] in "'\"":
        return re.sub(r"([*?\[])", r"[\1]", _expand(pattern[1:-1], env, positional))
    return _expand(pattern, env, positional)


def kaldi_options(positional: Sequence[str], env: Dict, script: str, line: int) -> Tuple[str, ...]:
    """What Kaldi's ``. utils/parse_options.sh`` does -- the option parser the speech recipes of Kaldi, ESPnet,
    WeNet and icefall copy verbatim: each leading ``--name value`` sets the script's variable ``name`` (dashes
    read as underscores), which the script must have set before (else it stops: "invalid option"); what
    follows the options is left as the script's arguments."""
    left = list(positional)
    while left and left[0].startswith("--"):
        option = left[0]
        if "=" in option:
            raise ShellError(f"line {line}: {os.path.basename(script)}'s parse_options.sh refuses `{option}` (options are "
                             f"`--name value`): bash stops there")
        name = option[2:].replace("-", "_")
        if name not in env and name not in os.environ:
            raise ShellError(f"line {line}: {os.path.basename(script)}'s parse_options.sh refuses `{option}` (invalid "
                             f"option: the script sets no `{name}` before it): bash stops there")
        if len(left) < 2:
            break
        env[name] = left[1]
        left = left[2:]
    return tuple(left)
