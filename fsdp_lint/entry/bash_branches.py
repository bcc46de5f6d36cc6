"""Which branch of a launch script's `if` runs: the tests bash can decide from the script's own variables.

Launch scripts pick their launcher, GPU count or config with an `if` chain on a variable they set above:

    BACKEND="ptd"; NUM_GPUS=2
    if [ "$BACKEND" == "accelerate" ]; then accelerate launch --config_file multi_gpu.yaml train.py
    elif [ "$BACKEND" == "ptd" ]; then torchrun --nproc_per_node=$NUM_GPUS train.py
    fi

bash runs one branch; its assignments are made, the others' are not, and only its launch runs. A test
whose words all expand from what the script set (``[ A == B ]``, ``=``, ``!=``, ``-eq -ne -gt -ge -lt
-le``, ``-z``, ``-n``, a lone word, ``!``; ``[[ ]]`` alike) is decided, and so are such tests joined by ``&&`` and ``||``; any other condition (a command's
status, a file test, a variable set outside the script) leaves every branch of its `if` as it was: each
is followed, as before.
"""
from __future__ import annotations

import fnmatch
import re
from typing import Dict, List, Optional, Sequence

from fsdp_lint.entry.bash_words import _expand

_ARM = re.compile(r"^\(?\s*([^()]+?)\s*\)(?!\))(.*)$", re.S)      # `train|fit)`, `"eval")`, `*) exit 2`
_INT_OPS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-gt": lambda a, b: a > b,
            "-ge": lambda a, b: a >= b, "-lt": lambda a, b: a < b, "-le": lambda a, b: a <= b}


def condition(words: Sequence[str], env: Dict[str, str], positional: Sequence[str]) -> Optional[bool]:
    """The truth of an `if`/`elif` line's test (`words` from ``if`` up to ``then``), or None if bash's
    answer depends on something not in the script."""
    test = []
    for w in words[1:]:
        if w in ("then", ";"):
            break
        test.append(w[:-1] if w.endswith(";") else w)
    # `[ $stage -le 4 ] && [ $stop_stage -ge 4 ]` (Kaldi-style stage recipes), `||`: left to right, as bash
    for i, w in enumerate(test):
        if w in ("&&", "||"):
            left = condition(["if", *test[:i]], env, positional)
            if left is not None and (left is False if w == "&&" else left is True):
                return left     # bash does not run the rest
            right = condition(["if", *test[i + 1:]], env, positional)
            return right if left is not None else (right if right is not None and
                                                    right is (w == "||") else None)
    negate = bool(test) and test[0] == "!"
    test = test[1:] if negate else test
    probe = [w for w in test if not re.fullmatch(r"\d*(&?>>?|<)(&\d+|/dev/null)?|/dev/null", w)]
    if probe in (["command", "-v", "nvidia-smi"], ["which", "nvidia-smi"], ["hash", "nvidia-smi"],
                 ["type", "nvidia-smi"], ["type", "-P", "nvidia-smi"]):
        return not negate       # `if command -v nvidia-smi &> /dev/null`: the simulated node is a GPU node
    if len(test) < 2 or (test[0], test[-1]) not in (("[", "]"), ("[[", "]]")):
        return None
    inner = [_expand(w, env, positional) for w in test[1:-1]]
    if any("$" in v or "`" in v for v in inner):
        return None             # a variable not set here, a command substitution
    if len(inner) == 3 and any(c in inner[2] for c in "*?["):
        return None             # a pattern (`[[ $x == a* ]]`) or a file glob
    result = _test(inner)
    if result is None:
        return None
    return not result if negate else result


def _test(inner: List[str]) -> Optional[bool]:
    if len(inner) == 1:
        return inner[0] != ""
    if len(inner) == 2 and inner[0] in ("-z", "-n"):
        return (inner[1] == "") == (inner[0] == "-z")
    if len(inner) == 3:
        a, op, b = inner
        if op in ("=", "=="):
            return a == b
        if op == "!=":
            return a != b
        if op in _INT_OPS and re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
            return _INT_OPS[op](int(a), int(b))
    return None


class Branches:
    """The open `if` statements of a script read line by line (one `if`/`elif`/`else`/`fi` on a line; a
    one-line `if ...; fi` opens nothing): their numbers, the branch each is in, and whether bash runs it."""

    def __init__(self) -> None:
        self.blocks: List[dict] = []
        self._counter = 0

    def arm(self, line: str) -> Optional[str]:
        """A `case` arm's pattern line of a decided `case` (``train|fit)`` then maybe its first command): the
        arm is entered -- live where its pattern matches the word and no arm before did -- and the rest of the line
        returned (its trailing ``;;`` ends the arm); ``;;`` alone ends one; None for any other line."""
        block = self.blocks[-1] if self.blocks and self.blocks[-1].get("case") is not None else None
        if block is None:
            return None
        text = line.strip()
        ends = text.endswith(";;") and not text.endswith("\\;;")
        text = text[:-2].rstrip() if ends else text
        if block["expect"]:
            m = _ARM.match(text)
            if not m:
                return None
            block["branch"] += 1
            patterns = [p.strip().strip("'\"") for p in m.group(1).split("|")]
            self._enter(block, any(fnmatch.fnmatchcase(block["case"], p) for p in patterns))
            block["expect"], text = ends, m.group(2).strip()
            return text
        if ends:
            block["expect"] = True
            return text
        return None

    def decided_case(self) -> bool:
        """Whether the line is inside a `case` bash's choice of arm is known for."""
        return any(b.get("case") is not None for b in self.blocks)

    def follow(self, words: List[str], env: Dict[str, str], positional: Sequence[str]) -> None:
        if not words:
            return
        head = words[0].rstrip(";")
        if head == "case" and len(words) == 3 and words[2] == "in":
            # `case "$ACTION" in` of a word the script's variables give: only the arm it matches runs
            word = None if any(b.get("live") is False for b in self.blocks) else _expand(words[1], env, positional)
            if word is not None and "$" not in word and "`" not in word:
                self._counter += 1
                self.blocks.append({"n": self._counter, "branch": 0, "taken": False, "decided": True, "live": False,
                                    "case": word, "expect": True})
            elif self.decided_case():       # (one not decided inside a decided one: its `esac` is its own)
                self.blocks.append({"n": 0, "branch": 0, "taken": False, "decided": False, "inner_case": True})
        elif head == "esac" and self.blocks and (self.blocks[-1].get("case") is not None or
                                                 self.blocks[-1].get("inner_case")):
            self.blocks.pop()
        elif head == "if" and "fi" not in words and "fi;" not in words:
            self._counter += 1
            truth = self._decide(self.blocks, words, env, positional)
            block = {"n": self._counter, "branch": 0, "taken": False, "decided": True}
            self.blocks.append(block)
            self._enter(block, truth)
        elif head in ("elif", "else") and self.blocks:
            block = self.blocks[-1]
            block["branch"] += 1
            self._enter(block, True if head == "else" else self._decide(self.blocks[:-1], words, env, positional))
        elif head == "fi" and self.blocks and self.blocks[-1].get("case") is None and \
                not self.blocks[-1].get("inner_case"):
            self.blocks.pop()

    @staticmethod
    def _decide(enclosing, words, env, positional) -> Optional[bool]:
        if any(b.get("live") is False for b in enclosing):
            return None         # inside a branch bash skips: nothing in it is evaluated
        return condition(words, env, positional)

    @staticmethod
    def _enter(block: dict, truth: Optional[bool]) -> None:
        if block["taken"]:
            block["live"] = False                      # an earlier branch ran
        elif truth is None or not block["decided"]:
            block["live"] = None                       # bash's choice is not known here
            block["decided"] = False
        else:
            block["live"] = truth
            block["taken"] = truth

    def runs(self) -> bool:
        """Whether bash runs the current line (False only where a decided test rules its branch out)."""
        return all(b.get("live") is not False for b in self.blocks)

    def at(self):
        """The (if, branch) pairs the current line is in."""
        return tuple((b["n"], b["branch"]) for b in self.blocks)


def alternatives(a, a_at, b, b_at) -> bool:
    """The same launch in two branches of one `if` (`if [ "$NUM_GPUS" -gt 1 ]; then ... python train.py ... &
    else python train.py ...`): only one of them runs."""
    same = (a.path, a.args, a.cwd, a.world_size, a.accelerate_config, a.env, a.module) == \
        (b.path, b.args, b.cwd, b.world_size, b.accelerate_config, b.env, b.module)
    return same and any(x[0] == y[0] and x[1] != y[1] for x in a_at for y in b_at)

