"""What bash computes inside a launch line before it runs it: arithmetic and the command substitutions a
launch script uses for numbers and folders.

* ``$((16 / nproc_per_node))``, ``$(( 2 * $N ))``: integer arithmetic on the script's variables (``/``
  truncates, as bash's does);
* ``$(expr 16 / $nproc_per_node)``: the same through ``expr``;
* ``$(cd "${SCRIPT_DIR}/.." && pwd)``: the folder, where it exists (from the folder the script runs in);
* ``$(basename PATH)``, ``$(dirname PATH)`` (``$(basename $(dirname $0))``: the script's folder's name);
* ``$(which COMMAND)``: the installed command (a console script, whose file `fsdp_lint.entry.shell` reads);
* ``$(grep -oP 'PATTERN' <<< "$params")``: grep run on the here-string (a pure text command);
* a pipeline of text commands -- ``$(basename "$0" | cut -f 1 -d '.')``, ``$(basename "$0" .sh)``,
  ``$(date +"%Y%m%d%H%M%S")``, ``$(echo "$MODEL" | tr '/' '_')``, ``$(echo $X | sed 's/a/b/')`` -- run as bash
  runs it (``basename``, ``dirname``, ``cut``, ``tr``, ``date``, ``echo``, ``printf``, ``head``, ``tail``, ``grep``,
  ``wc``, ``sed`` with a substitution only and ``awk`` with a program that only prints: commands that read nothing
  of the node's and change nothing; ``$(echo $CUDA_VISIBLE_DEVICES | awk -F , '{print NF}')`` counts the GPUs the
  script gives itself);
* ``nvidia-smi`` at the head of such a pipeline answers as the simulated node's tool (`fsdp_lint.smi`):
  ``$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)`` is the node's GPU count; ``hostname`` (``-i``:
  the loopback address of one node), ``shuf -i 30000-31000 -n 1`` (a port for a helper server) and ``mktemp`` (a
  scratch name, nothing made) too.

Anything else (a variable the script does not set, another command) is left as written, as before.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Callable, Optional

_CD_PWD = re.compile(r'^\s*cd\s+(?:"([^"$`]*)"|([^\s"$`;&]+))\s*(?:&&|;)\s*pwd(?:\s+-[PL])?\s*$')


def closing(text: str, i: int, open_: str = "(", close: str = ")") -> Optional[int]:
    """The index of the `close` that matches the `open_` at `i` (quotes respected), or None."""
    depth, quote = 0, None
    for j in range(i, len(text)):
        c = text[j]
        if quote:
            if c == quote:
                quote = None
            continue
        if c in "'\"":
            quote = c
        elif c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
    return None


def substitute(inner: str, expand: Callable[[str], str]) -> Optional[str]:
    """The value of ``$(INNER)`` (``$((...))`` when INNER is ``(...)``), or None when it is not computed here.
    `expand` expands the script's variables in a text."""
    if inner.startswith("(") and inner.endswith(")"):
        return arithmetic(inner[1:-1], expand)
    if "'" in inner and "$" in inner:       # (`awk -F, '{print $2}'`: bash expands nothing in single quotes)
        outer = expand
        expand = lambda text: "".join(part if part.startswith("'") else outer(part)  # noqa: E731
                                      for part in re.split(r"('[^']*')", text))
    if re.fullmatch(r"\s*pwd(\s+-[PL])?\s*", inner):       # the folder the script is in now (its `cd`s)
        here = expand("${PWD}")
        return here if "$" not in here and os.path.isdir(here) else os.getcwd()
    here = _here_string_grep(expand(inner))
    if here is not None:
        return here
    piped = _text_pipeline(expand(inner))
    if piped is not None:
        return piped
    words = expand(inner).split()
    if words[:1] == ["expr"] and len(words) >= 4 and len(words) % 2 == 0:     # `expr $A + $B + 1000`
        return arithmetic(" ".join(w.replace("\\*", "*") for w in words[1:]), lambda s: s)
    if len(words) == 2 and words[0] in ("basename", "dirname") and "$" not in words[1]:
        return (os.path.basename if words[0] == "basename" else os.path.dirname)(words[1].rstrip("/")) or "."
    if len(words) == 2 and words[0] in ("which", "command -v"):
        import shutil

        found = shutil.which(words[1])      # `torchrun $(which lerobot-train)`: the node's installed command
        return found
    m = _CD_PWD.match(expand(inner))
    if m:
        folder = m.group(1) if m.group(1) is not None else m.group(2)
        if os.path.isdir(folder):
            return os.path.abspath(folder)
    return None


# the simulated node's GPUs while a launch script is read: (the `--gpu` profile's name, GPUs per node), or None
NODE_SMI: list = [None]
_GREP_OPTIONS = re.compile(r"^-[oPEFiwxvc]+$")
_TEXT_COMMANDS = {"basename", "dirname", "cut", "tr", "date", "echo", "printf", "head", "tail", "grep", "sed", "awk", "wc",
                  "seq"}
# an awk program that only reads its input and prints (`awk -F "," '{print NF}'`): no system(), getline, output
# redirection or pipe
_AWK_UNSAFE = re.compile(r"system|getline|[>|]|close|fflush|ENVIRON")
_SED_SUBSTITUTION = re.compile(r"^s(.).*\1.*\1[gIi0-9]*$", re.S)


def _safe(words) -> bool:
    """A text command that reads nothing of the node's (no file operands) and changes nothing."""
    name, args = words[0], words[1:]
    # (an awk program's fields, `'{print $2}'`, are awk's, not the script's variables)
    if name not in _TEXT_COMMANDS or any("$" in (re.sub(r"\$(\d+|NF)\b", "", a) if name == "awk" else a) or "`" in a
                                         for a in args):
        return False
    if name == "date":
        return all(a.startswith("+") or a in ("-u", "--utc") for a in args)
    if name == "sed":
        exprs = [a for a in args if not re.fullmatch(r"-[nE]+|-e", a)]
        return len(exprs) == 1 and bool(_SED_SUBSTITUTION.match(exprs[0]))
    if name == "awk":
        rest = list(args)
        while rest[:1] and (rest[0] in ("-F", "-v") and len(rest) > 1 or re.fullmatch(r"-F.+|-v\w+=.*", rest[0])):
            rest = rest[2:] if rest[0] in ("-F", "-v") else rest[1:]       # (`-F','`: bash's word `-F,`)
        return len(rest) == 1 and not _AWK_UNSAFE.search(rest[0])      # the program, reading its input only
    if name == "wc":
        return all(a in ("-l", "-w", "-c") for a in args)
    if name == "seq":       # `seq -s, 0 7`: numbers only
        return all(re.fullmatch(r"-?\d+|-w|-s.?|-f%[0-9.]*[gfe]", a) for a in args)
    if name in ("cut", "tr", "head", "tail", "grep"):
        return not words[-1].startswith("/") or name == "tr"      # (a path operand: a file of the node's)
    return True


def _node_answer(words) -> Optional[str]:
    """What a command about the node prints there: its ``nvidia-smi`` (`$(nvidia-smi --query-gpu=name
    --format=csv,noheader | wc -l)`: the node's GPUs), ``hostname`` (``-i``/``-I``: its address, the loopback one of a
    single node), ``shuf -i LO-HI -n N`` (a free port drawn for a server: the range's first, so a lint is
    repeatable); None for another command."""
    import socket

    name, args = words[0], words[1:]
    if name == "nvidia-smi" and NODE_SMI[0] is not None:
        from fsdp_lint import gpus, smi

        return smi.answer(gpus.profile(NODE_SMI[0][0]), NODE_SMI[0][1], args)
    if name == "hostname" and all(a in ("-i", "-I", "-s", "-f", "--ip-address", "--all-ip-addresses", "--short")
                                  for a in args):
        if any(a in ("-i", "-I", "--ip-address", "--all-ip-addresses") for a in args):
            return "127.0.0.1\n"
        host = socket.gethostname()
        return (host.split(".")[0] if any(a in ("-s", "--short") for a in args) else host) + "\n"
    if name == "mktemp" and all(re.fullmatch(r"-[dtuq]+|[\w./-]*X{3,}[\w.-]*", a) for a in args):
        # a scratch file or folder of the node's (`TMP=$(mktemp -d)`): its name, the template's X's as mktemp fills them
        template = next((a for a in args if "XXX" in a), "tmp.XXXXXXXXXX")
        folder = "" if "/" in template else os.environ.get("TMPDIR", "/tmp").rstrip("/") + "/"
        return folder + re.sub("X{3,}", lambda m: "0" * len(m.group(0)), template) + "\n"
    m = re.fullmatch(r"-i\s+(\d+)-(\d+)\s+-n\s+(\d+)|-n\s+(\d+)\s+-i\s+(\d+)-(\d+)", " ".join(args)) \
        if name == "shuf" else None
    if m:
        low, high, count = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m.group(1) else \
            (int(m.group(5)), int(m.group(6)), int(m.group(4)))
        return "".join(f"{n}\n" for n in range(low, min(high, low + count - 1) + 1))
    return None


def _text_pipeline(text: str) -> Optional[str]:
    """The output of a pipeline of text commands (`_TEXT_COMMANDS`), its last newlines dropped, or None."""
    import shlex
    import subprocess

    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars="|;&<>()")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return None
    commands, current = [], []
    for token in tokens:
        if token == "|":
            commands.append(current)
            current = []
        elif set(token) <= set(";&<>()"):
            return None         # anything but a plain pipeline
        else:
            current.append(token)
    commands.append(current)
    output = _node_answer(commands[0]) if not any("$" in w or "`" in w for w in commands[0]) else None
    if output is not None:
        commands.pop(0)
    if not all(commands) or not all(_safe(c) for c in commands) or output is None and commands[0][0] in (
            "cut", "tr", "head", "tail", "grep", "sed", "awk", "wc"):
        return None             # (a first command that reads its input would read the node's terminal)
    for command in commands:
        try:
            done = subprocess.run(command, input=output, capture_output=True, text=True, timeout=10,
                                  stdin=None if output is not None else subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        output = done.stdout
    return output.rstrip("\n")


def _here_string_grep(text: str) -> Optional[str]:
    """``grep -oP 'PATTERN' <<< "$params"`` (a flag read back from the script's own arguments): grep run on the
    here-string, as bash runs it (a pure text command: nothing of the node's), its output's last newlines
    dropped; None for any other command."""
    import shlex
    import subprocess

    try:
        words = shlex.split(text)
    except ValueError:
        return None
    if len(words) < 4 or words[0] != "grep" or words[-2] != "<<<" or "$" in words[-1]:
        return None
    options, pattern = words[1:-3], words[-3]
    if not all(_GREP_OPTIONS.match(o) for o in options) or pattern.startswith("-"):
        return None
    try:
        done = subprocess.run(["grep", *options, "--", pattern], input=words[-1] + "\n", capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.rstrip("\n") if done.returncode in (0, 1) else None


def arithmetic(text: str, expand: Callable[[str], str]) -> Optional[str]:
    """``$((TEXT))``: bash's integer arithmetic, names read as the script's variables."""
    text = expand(text)
    # bash arithmetic reads bare names as variables too
    text = re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: expand("$" + m.group(0)), text)
    if "$" in text or re.search(r"[A-Za-z_]", text):
        return None                     # a variable nothing sets here
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    try:
        result = _evaluate(tree.body)
    except (ValueError, ZeroDivisionError):
        return None
    return None if result is None else str(result)


def _evaluate(node) -> Optional[int]:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _evaluate(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp):
        a, b = _evaluate(node.left), _evaluate(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            return int(a / b) if b else None         # truncates toward zero, as bash
        if isinstance(node.op, ast.Mod):
            return a - b * int(a / b) if b else None
    return None
