"""Launch lines of a shell script (``fsdp-lint scripts/train.sh``), read without running it.

Real repositories launch through a script: ``torchrun --nproc_per_node 8 train.py --fsdp ... \\`` over
several lines, with ``VAR=...`` assignments above it. Each line that runs ``torchrun``,
``python -m torch.distributed.run``/``.launch``, ``accelerate launch``, ``deepspeed`` or ``python`` on
a ``.py`` file is one launch: the file, the script's arguments after it, the world size the launcher
asks for (``--nproc_per_node`` x ``--nnodes``, ``--num_processes``, ``--num_gpus`` x ``--num_nodes``),
accelerate's ``--config_file``, and the script line each argument is written on. ``$VAR``, ``${VAR}``
and ``${VAR:-default}`` of simple assignments (and of the environment) are expanded, and so are the
script's positional parameters (``$1``, ``${2:-4}``, ``"$@"``) from the arguments it is given (none:
``bash run.sh``, so a default stands); anything else a shell would compute (``$(...)``, arithmetic) is
left as written, and a launch whose file cannot be found says so.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fsdp_lint.entry.bash_arguments import argument_block, kaldi_options
from fsdp_lint.entry.bash_functions import CALL_BEGIN, CALL_END, function_call, inline_functions, with_outputs
from fsdp_lint.entry.bash_loops import loop_header, sourced_script
from fsdp_lint.entry.launch_files import (  # noqa: F401 - _module_root: also shell.*
    _console_commands, _console_file, _module_file, _module_root, _near, _resolve, installed_module_file)
from fsdp_lint.entry.bash_branches import Branches, alternatives
from fsdp_lint.entry.bash_substitutions import closing
from fsdp_lint.entry.console_launch import console_wrapper
from fsdp_lint.entry import slurm
from fsdp_lint.entry.dora_launch import dora_launch, dora_module, is_dora
from fsdp_lint.entry.bash_words import (  # noqa: F401 - ShellError: this module's error too
    _ARRAY, ShellError, UnsetError, leading_simple_command, read_array, settled, unset_literal, with_script_path, _expand,
    _expanded_words, _joined, _logical_lines, _split, _tokens)

_ASSIGN = re.compile(r"^(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
# what a node's shell counts its GPUs with (`--nproc_per_node=$(nvidia-smi -L | wc -l)`): read as torchrun's
# own "gpu" (every GPU of the node), which the simulated node's --gpus-per-node answers
_APPEND = re.compile(r"^(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*\+=(.*)$", re.S)      # `cmd+=" --flag x"`
_GPU_COUNT = re.compile(r"\$\((?:nvidia-smi\s+(?:-L|--list-gpus)\s*\|\s*wc\s+-l|python3?\s+-c\s+(['\"])import torch;?\s*"
                        r"print\(torch\.cuda\.device_count\(\)\)\1)\s*\)")
_LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "python", "python3", "lightning", "fabric", "composer", "dora")
# what the environment a launch line exports holds that is about the processes or this machine, not the job,
# and what keeps a lint offline (`export HF_HUB_OFFLINE=0`, `WANDB_MODE=online` stay the lint's)
_COMPUTED_ASSIGN = re.compile(r"^(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)=\"?(\$\(.*\))\"?$", re.S)
_NOT_PASSED = re.compile(r"^(CUDA_VISIBLE_DEVICES|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|NODE_RANK|"
                         r"LOCAL_WORLD_SIZE|OMP_NUM_THREADS|PATH|PYTHONPATH|LD_LIBRARY_PATH|HOME|USER|TMPDIR|SHELL|"
                         r"HF_HOME|HF_HUB_CACHE|HF_DATASETS_CACHE|TRANSFORMERS_CACHE|TORCH_HOME|.*_DIR|.*_PATH|.*_ROOT|"
                         r"HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|HF_DATASETS_OFFLINE|HF_HUB_DISABLE_TELEMETRY|WANDB_MODE|"
                         r"WANDB_DISABLED)$")

_NAME_BEFORE_QUOTE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)(?=[\"'])")
# the GPUs of the simulated node (`--gpus-per-node`) a count of them in the script is (`$(nvidia-smi -L | wc -l)`,
# then `$(seq -s, 0 $((num_gpus-1)))`); unset: torchrun's own "gpu", which the plan reads as the node's
NODE_GPUS: List[Optional[int]] = [None]
_PLAIN_PYTHON_GETS = re.compile(r"^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|NODE_RANK|LOCAL_WORLD_SIZE)$")


@dataclass
class ShellLaunch:
    script: str                     # the shell script (as given)
    line: int                       # the line the command starts on
    path: str                       # the launched Python file (absolute)
    args: List[str]                 # its own arguments
    cwd: str                        # the folder the command's relative paths are read from
    world_size: Optional[int] = None
    accelerate_config: Optional[str] = None
    arg_lines: List[int] = field(default_factory=list)   # the script line of each of `args`
    # what the process finds in its environment from the script (`export VAR=...`, `VAR=... torchrun ...`)
    # and from the launcher (Lightning's CLI: `LT_DEVICES`, `LT_PRECISION`, ...)
    env: Dict[str, str] = field(default_factory=dict)
    module: Optional[Tuple[str, str]] = None        # `-m training.run`: (the module, the folder it resolves from)
    every_gpu_of: Optional[int] = None              # `--nproc_per_node gpu` on this many nodes
    unset_world: Optional[str] = None               # `--nproc_per_node=$nproc_per_node` of a variable nothing sets
    # torchrun's words from its first option to the end (`torchrun` or `python -m torch.distributed.run`:
    # "run"; `python -m torch.distributed.launch`: "launch"), for torch's own parser (`launcher_refusal`)
    torchrun: Optional[Tuple[str, List[str]]] = None
    plain: bool = False                             # `python FILE` itself: one process, no launcher's variables
    accelerate_args: Tuple[str, ...] = ()           # `accelerate launch`'s own options, before the file
    unset: Tuple[str, ...] = ()                     # the variables in `args` the script never sets (bash: empty)
    loops: Tuple[str, ...] = ()                     # `for FOLD in {0..4}` around it: each loop's first run, in words


_CONTROL = {"|", "||", "&&", ";", "&", "|&"}
_REDIRECT = re.compile(r"^(\d*|&)(>>?|<|>\|)(&?\d+|&-)?$")         # `>`, `2>>`, `2>&1`, `&>`: a target may follow
_REDIRECT_TO = re.compile(r"^(\d*|&)(>>?|<)(?!&?\d+$)\S+$")       # `>out.log`, `2>/dev/null`


def _commands(tokens) -> List[List[Tuple[str, int]]]:
    """The simple commands of a list or pipeline (split at ``|``, ``&&``, ``;``, ...), each without its
    redirections."""
    out: List[List[Tuple[str, int]]] = [[]]
    skip_target = False
    inside = 0          # the words of a process substitution (`> >(tee train.log)`: the redirection's target)
    for word, line in tokens:
        if inside > 0 or word.startswith((">(", "<(")):
            inside = (inside if inside > 0 else 0) + word.count("(") - word.count(")")
            skip_target = False
            continue
        if skip_target:
            skip_target = False
            continue
        if word in _CONTROL:
            out.append([])
        elif _REDIRECT.match(word):
            skip_target = not re.search(r"&(\d+|-)$", word)     # `2>&1` names its target itself
        elif word.endswith(";") and not word.endswith(("\\;", ";;")):     # `... --bs 16; cd ..`: the list goes on
            out[-1].append((word[:-1], line))
            out.append([])
        elif not _REDIRECT_TO.match(word):
            out[-1].append((word, line))
    return [c for c in out if c]


def _value(tokens, i) -> Tuple[Optional[str], int]:
    word = tokens[i][0]
    if "=" in word:
        return word.split("=", 1)[1], i + 1
    return (tokens[i + 1][0] if i + 1 < len(tokens) else None), i + 2


def _int(text) -> Optional[int]:
    return int(text) if isinstance(text, str) and text.isdigit() else None


# `uv run [options] CMD`, `poetry run CMD`, `conda run -n ENV CMD`: CMD runs in the project's environment;
# the options of theirs that take a value (the next word, unless written `--opt=value`)
_RUNNERS = ("uv", "poetry", "pipenv", "pdm", "rye", "pixi", "conda", "mamba", "micromamba")
_RUNNER_VALUES = {"--with", "--with-editable", "--with-requirements", "--extra", "--group", "--only-group",
                  "--no-group", "--project", "--directory", "--python", "-p", "--env-file", "--package", "--index",
                  "--default-index", "--index-url", "--extra-index-url", "--find-links", "-f", "--config-file",
                  "--cache-dir", "-n", "--name", "--prefix", "--cwd", "-e", "--environment", "--manifest-path"}


def _command_start(tokens, i: int = 0) -> int:
    """Where the command itself starts: after ``VAR=value`` words, ``exec``/``env``/``time``/``nohup``/
    ``srun``, and an environment runner with its options (``uv run --extra gpu``)."""
    while i < len(tokens):
        word = tokens[i][0]
        if os.path.basename(word) in ("srun", "mpirun", "mpiexec"):
            # the cluster's launcher and its options (`srun --nodes 2 --ntasks-per-node=1 torchrun ...`)
            later = [j for j in range(i + 1, len(tokens)) if _is_head(tokens[j][0])]
            i = later[0] if later else i + 1
        elif _ASSIGN.match(word) or os.path.basename(word) in ("exec", "env", "time", "nohup"):
            i += 1
        elif os.path.basename(word) in _RUNNERS and i + 1 < len(tokens) and tokens[i + 1][0] == "run":
            i += 2
            while i < len(tokens) and tokens[i][0].startswith("-") and tokens[i][0] not in ("-m", "--module"):
                i += 2 if tokens[i][0] in _RUNNER_VALUES else 1
        else:
            return i
    return i


def _is_head(word: str) -> bool:
    head = os.path.basename(word)
    return head in _LAUNCHERS or bool(re.fullmatch(r"python3(\.\d+)?", head))


def _is_launcher(tokens, i: int) -> bool:
    i = _command_start(tokens, i)
    return i < len(tokens) and _is_head(tokens[i][0])


def _nested(tokens):
    """The command a job-submission tool is given after ``--`` (``python mason.py --gpus 8 -- torchrun
    ... train.py``, ``gantry run ... -- torchrun ...``): that is what runs on the node, not the tool."""
    for k, (word, _) in enumerate(tokens):
        if word == "--" and _is_launcher(tokens, k + 1):
            return _nested(tokens[k + 1:])
    return tokens


def _slurm(tokens, i: int, found: Optional[dict], batch: Dict[str, int]) -> Optional[dict]:
    """`found` (a launch) started by ``srun`` (before `i`) of a python file: srun's tasks are the world, with the
    variables srun sets for rank 0's task (`entry.slurm`)."""
    words = [t[0] for t in tokens]
    at = next((k for k in range(i) if os.path.basename(words[k]) == "srun"), None)
    if found is None or at is None or found.get("torchrun") or i >= len(words) or \
            not re.fullmatch(r"python[0-9.]*", os.path.basename(words[i])):
        return found        # a launcher under srun (torchrun, accelerate launch, deepspeed): its own world wins
    found["plain"] = False
    counts = slurm.world(words[at + 1:i], batch)
    if counts is not None:
        found["world_size"] = counts["world"]
        found["env"] = dict(found.get("env") or {}, **slurm.environment(counts))
    return found


def _launch(tokens, env, console: Dict[str, str]) -> Optional[dict]:
    """The launched file (or module: ``-m pkg.mod``; or the project's console script, `console`: command ->
    "module:function"), its arguments (from `tokens` index) and the launcher's settings, or None."""
    i = _command_start(tokens)
    if i >= len(tokens):
        return None
    head = os.path.basename(tokens[i][0])
    words = [t[0] for t in tokens]
    after = is_dora(words, i)
    if after is not None:              # `dora run -d ARGS`: the package's train module (entry.dora_launch)
        dora = dora_launch(words, after, env)
        if dora is not None and "refused" in dora:
            raise ShellError(f"`dora run` refuses `{dora['refused']}` (dora: unrecognized arguments; the job's own "
                             f"flags go after --), on a node too")
        return None if dora is None else {
            "dora": dora, "file": None, "first_arg": len(words), "argv": dora["argv"], "world_size": dora["world_size"],
            "every_gpu_of": dora["every_gpu_of"], "module": True, "accelerate_config": None,
            "env": {k: v for k, v in (tokens[n][0].split("=", 1) for n in range(i) if _ASSIGN.match(tokens[n][0]))}}
    # python without the word: `uv run -m pkg.train`, `uv run train.py`, an executable `./train.py`
    implicit = words[i] in ("-m", "--module") or words[i].endswith(".py")
    head = "python" if implicit else head
    if not (head in _LAUNCHERS or re.fullmatch(r"python3(\.\d+)?", head)):
        target = console.get(tokens[i][0])     # the project's own command (`litgpt pretrain ...`)
        if target is None:
            return None
        return {"file": target, "first_arg": i + 1, "world_size": None, "accelerate_config": None,
                "console": tokens[i][0], "plain": True,      # the project's command: one process, as `python`
                "env": {k: v for k, v in (tokens[n][0].split("=", 1) for n in range(i) if _ASSIGN.match(tokens[n][0]))}}
    if head == "accelerate" and (i + 1 >= len(words) or words[i + 1] != "launch"):
        return None
    # Lightning's launcher: `lightning run model [OPTIONS] FILE` (2.0), `fabric run [OPTIONS] FILE` (2.1+)
    lightning = (head == "lightning" and words[i + 1:i + 3] == ["run", "model"]) or \
        (head == "fabric" and words[i + 1:i + 2] == ["run"])
    if head in ("lightning", "fabric") and not lightning:
        return None
    opts: Dict[str, Optional[str]] = {}
    j = i if implicit else i + (2 if head == "accelerate" else 3 if head == "lightning" else 2 if head == "fabric" else 1)
    module = None
    torchrun = ("run", j) if head == "torchrun" else None
    while j < len(words):
        w = words[j]
        if w.endswith(".py") and not w.startswith("-"):
            break
        if w == "-c" and head.startswith("python"):
            return None         # `python -c CODE [ARGS]` runs CODE: its words are arguments, not a file
        wrapper = console_wrapper(w) if head in ("torchrun", "accelerate") or torchrun else None
        if wrapper:      # `torchrun $(which lerobot-train) ...`: an installed console script's file
            return {"file": wrapper, "first_arg": j + 1, "world_size": _world_of(opts, head),
                    "accelerate_config": opts.get("config_file") if head == "accelerate" else None,
                    "console": os.path.basename(w), "torchrun": (torchrun[0], words[torchrun[1]:]) if torchrun else None}
        if w in ("-m",) and head.startswith("python") and j + 1 < len(words) and \
                words[j + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            torchrun = (words[j + 1].rsplit(".", 1)[1], j + 2)
            j += 2
            continue
        if w in ("-m", "--module") and j + 1 < len(words):    # `torchrun ... -m pkg.train`, `python -m pkg.train`
            module = j + 1
            break
        if head == "composer" and w in ("-n", "--nproc") and j + 1 < len(words):    # composer's launcher
            opts["nproc"], j = _value(tokens, j)
            continue
        if w.startswith("--"):
            name = w[2:].split("=", 1)[0].replace("-", "_")
            if "=" in w or j + 1 < len(words) and not words[j + 1].startswith("-") and not words[j + 1].endswith(".py"):
                opts[name], j = _value(tokens, j)
                continue
            opts[name] = None
        j += 1
    if j >= len(words):
        return None
    raw = opts.get("nproc_per_node") or opts.get("num_processes") or opts.get("num_gpus") or \
        (opts.get("devices") if lightning else None) or (opts.get("world_size") or opts.get("nproc") or "gpu"
                                                         if head == "composer" else None)
    nproc = _int(raw)
    nodes = _int(opts.get("nnodes") or opts.get("num_nodes") or opts.get("num_machines")) or 1
    if "num_processes" in opts or head == "composer" and "world_size" in opts:   # the total over all machines
        nodes = 1
    env = {k: v for k, v in (tokens[n][0].split("=", 1) for n in range(i) if _ASSIGN.match(tokens[n][0]))}
    if lightning:
        env.update(_lightning_cli_env(opts))
    first = (module or j) + 1
    if first < len(words) and words[first] == "--" and (torchrun is not None or head in ("accelerate", "deepspeed")):
        first += 1      # `torchrun ... train.py -- ARGS`: their parsers (argparse's REMAINDER) drop the separator
    return {"file": words[module] if module else words[j], "first_arg": first,
            "world_size": nproc * nodes if nproc else None, "module": bool(module), "env": env,
            # torchrun's `--nproc_per_node gpu` (or auto): every GPU of each of the nodes
            # (composer's launcher without -n: every GPU of this node)
            "every_gpu_of": nodes if raw in ("gpu", "auto") and head != "accelerate" else None,
            "unset_world": next((v for v in (raw, opts.get("nnodes") or opts.get("num_nodes"))
                                 if isinstance(v, str) and "$" in v), None),
            "accelerate_config": opts.get("config_file") if head == "accelerate" else None,
            # accelerate's own options (`--use_fsdp --fsdp_sharding_strategy=2 ...`): its parser reads them
            "accelerate_args": tuple(words[i + 2:module - 1 if module else j]) if head == "accelerate" else (),
            "plain": head.startswith("python") and torchrun is None,      # one process, no launcher's variables
            "torchrun": (torchrun[0], words[torchrun[1]:]) if torchrun else None}


def launcher_refusal(launch: ShellLaunch) -> Optional[str]:
    """torchrun's own refusal of the launch line (``unrecognized arguments: --nodes=1``), or None: its words
    parsed by torch's parser, as torchrun parses them before it starts anything. A value from a variable the
    script does not set stands in as ``1``; a word with one inside it is not judged."""
    if launch.torchrun is None:
        return None
    kind, words = launch.torchrun
    given = []
    for w in words:
        name, eq, value = w.partition("=") if w.startswith("-") else ("", "", w)
        if re.fullmatch(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", value):
            w = f"{name}=1" if eq else "1"
        elif "$" in w or "`" in w:
            return None
        given.append(w)
    import argparse
    import contextlib
    import io

    try:
        from torch.distributed.run import get_args_parser
    except ImportError:         # (a torch without torchrun's module: nothing to judge by)
        return None
    parser = get_args_parser()
    parser.prog = "torchrun" if kind == "run" else "python -m torch.distributed.launch"
    if kind == "launch":        # what torch.distributed.launch.parse_args adds to torchrun's parser
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parser.parse_args(given)
    except SystemExit:
        lines = [ln for ln in said.getvalue().strip().splitlines() if ln.strip()]
        return lines[-1] if lines else "its arguments are refused"
    except argparse.ArgumentError as exc:
        return str(exc)
    return None


def _lightning_cli_env(opts: Dict[str, Optional[str]]) -> Dict[str, str]:
    """What Lightning's launcher sets for the processes it starts (its `_set_env_variables`): Fabric reads
    the accelerator, strategy, devices, nodes and precision from there, over the script's own arguments."""
    env = {"LT_CLI_USED": "1", "LT_DEVICES": opts.get("devices") or "1", "LT_NUM_NODES": opts.get("num_nodes") or "1"}
    for key in ("accelerator", "strategy", "precision"):
        if opts.get(key):
            env[f"LT_{key.upper()}"] = opts[key]
    return env


def _world_of(opts, head) -> Optional[int]:
    nproc = _int(opts.get("nproc_per_node") or opts.get("num_processes"))
    nodes = _int(opts.get("nnodes") or opts.get("num_machines")) or 1
    return nproc * (1 if "num_processes" in opts else nodes) if nproc else None


def _unset_stops(line: int, fn, *args):
    """`fn(*args)`, where ``${NAME:?message}`` of a variable the script does not set stops bash: one line."""
    try:
        return fn(*args)
    except UnsetError as exc:
        raise ShellError(f"line {line}: {exc}: bash stops there (set it before the launch: {exc.args[0].split(':')[0]}=...)") \
            from None


def _is_launcher_word(word: str) -> bool:
    return os.path.basename(word) in _LAUNCHERS or word.endswith(".py")


def _called_script(marked, env: Dict, exported: set, script: str, cd: Optional[str], depth: int) -> Optional[list]:
    """The launches of another launch script this command runs (``NGPU=4 bash train.sh ARGS``, ``sh x.sh``,
    ``./x.sh ARGS``), as bash runs it: with its arguments, the exported variables and the command's own
    assignments; None when the command runs no script that is here."""
    words = [w for w, _ in marked]
    i = _command_start(marked)
    at = i + 1 if i < len(words) and os.path.basename(words[i]) in ("bash", "sh") else i
    while at < len(words) and os.path.basename(words[i]) in ("bash", "sh") and words[at].startswith("-"):
        at += 1                 # `bash -x train.sh`
    if at >= len(words) or not (at > i or words[at].endswith(".sh")) or depth >= 4:
        return None
    path, _ = _resolve(unset_literal(words[at]), script, cd)
    if path is None or not path.endswith((".sh", ".bash")) and at == i:
        return None
    inherited = {name: env[name] for name in exported if name in env}
    inherited.update(w.split("=", 1) for w in settled(words[:i])[1] if _ASSIGN.match(w))
    called = os.path.relpath(path) if not os.path.isabs(words[at]) else path
    return shell_launches(called, settled(words[at + 1:])[1], inherited, cd, depth + 1)


def shell_launches(script: str, positional: Sequence[str] = (), inherited: Optional[Dict[str, str]] = None,
                   cd: Optional[str] = None, depth: int = 0, shared: Optional[Tuple[Dict, set]] = None
                   ) -> List[ShellLaunch]:
    """Every launch of a Python file in the shell script, in order, the script run with the arguments
    ``positional`` (``bash SCRIPT ARGS``); a script another one runs gets its exported variables
    (`inherited`) and starts in its folder (`cd`); a script another one sources (``source env.sh``) reads
    and sets that one's variables (`shared`: its environment and exported names)."""
    try:
        with open(script, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ShellError(f"cannot read it: {exc}") from None
    batch = slurm.batch_directives(text)      # `#SBATCH --nodes=4 --ntasks-per-node=8`
    count = str(NODE_GPUS[0]) if NODE_GPUS[0] else "gpu"
    text = slurm.VISIBLE_GPU_COUNT.sub(str(batch.get("gpus_per_node", count)), text)
    text = with_script_path(_GPU_COUNT.sub(count, text), script)
    env: Dict[str, str] = dict(slurm.batch_environment(batch), **(inherited or {}))   # (SLURM's batch shell)
    env.setdefault("PWD", cd or os.getcwd())       # bash's own: where the script runs (`$(pwd)`, `$PWD`)
    exported: set = set(inherited or ())
    if shared is not None:
        env, exported = shared
    console: Optional[Dict[str, str]] = None        # the repository's console scripts, read when needed
    out: List[ShellLaunch] = []
    in_case = 0
    loops: List[Tuple[int, str]] = []      # the `for` loops open around the line: (line, note)
    branches = Branches()                  # the open `if` statements, and whether bash runs the line
    where: List[Tuple[Tuple[int, int], ...]] = []      # each launch's branches
    functions: Dict[str, list] = {}
    logical = inline_functions(_logical_lines(text), functions)     # a function's body runs where it is called

    def read(path, given, shared):          # a function's body, read as this script's lines (`$(name ARGS)`)
        if depth >= 4:
            raise ShellError("functions nested too deep to read")      # (one that calls itself: left as written)
        return shell_launches(path, given, None, cd or os.path.dirname(os.path.abspath(script)), depth + 1, shared)
    calls: List[Sequence[str]] = []        # the arguments around each function call being run
    k = 0
    while k < len(logical):
        start, pieces = logical[k]
        k += 1
        stripped = _joined(pieces)
        if not stripped or stripped.startswith("#"):
            continue
        listed = leading_simple_command(stripped)
        if listed is not None:      # `NUM_GPUS=8; torchrun ...`: the assignment, then the rest of the list
            logical.insert(k, (start, [(start, listed[1])]))
            stripped, pieces = listed[0], [(start, listed[0])]
        if stripped.split(None, 1)[0] in (CALL_BEGIN, CALL_END):
            positional = function_call(stripped, calls, positional, env, branches.runs())
            continue
        loop = argument_block(logical, k - 1, env, positional, script) if branches.runs() and not in_case else None
        if loop is not None:     # `while [[ $# -gt 0 ]]; do case "$1" in ...`: run for the arguments given
            k, positional = loop
            continue
        arm = branches.arm(stripped)         # a decided `case`'s arm: its pattern read, its first command goes on
        if arm is not None and (not arm or not branches.runs()):
            continue
        stripped, pieces = (arm, [(start, arm)]) if arm is not None else (stripped, pieces)
        try:
            # `cfg=configs/"$size"_mp"$mp".json`: a name ends at the quote (bash reads `$size`, then `_mp`), which
            # the words without their quotes would no longer show
            words = _split(_NAME_BEFORE_QUOTE.sub(r"${\1}", stripped))
        except ValueError:
            words = []
        # a `case` not run above nor decided (`case $MODEL in llama) torchrun ...`): each arm's launch is followed
        decided = [branches.decided_case(), branches.follow(words, env, positional), branches.decided_case()]
        decided = decided[0] or decided[2]
        opened = in_case > 0 or "case" in words[:1] and not decided
        in_case += 0 if decided else sum(w == "case" for w in words) - sum(w in ("esac", "esac;") for w in words)
        if not branches.runs():
            continue                # a branch bash does not take (`if [ "$BACKEND" == "accelerate" ]`)
        if words[:1] == ["eval"] and branches.runs():
            # `eval $cmd`, `eval "$cmd"` of a command built in a string: its words joined, read again as a line
            try:
                stripped = " ".join(_expanded_words(stripped[4:], env, positional))
                pieces, words = [(start, stripped)], _split(stripped)
            except ValueError:
                continue
        if (opened or in_case > 0) and not any(_is_launcher_word(w) for w in words):
            continue
        exporting = bool(words) and words[0] == "export"
        if words and words[0] in ("export", "local", "readonly"):
            words = words[1:]
        if exporting and words and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", w) for w in words):
            exported.update(words)              # `export MODEL` of a variable set before
            continue
        into = read_array(stripped, env, positional)
        if into is not None:                     # `IFS=',' read -ra DATASETS <<< "$LIST"`: its elements
            env[into[0]] = into[1]
            continue
        array = _ARRAY.match(stripped.replace("\n", " "))
        if array:                                # `args=(--lr 1 "$X")`, `args+=(--fsdp)`: its elements' words
            name, append, inner = array.groups()
            try:
                elements = _expanded_words(inner, env, positional)
            except ValueError:
                elements = []
            before = env.get(name) if append else None
            env[name] = (before if isinstance(before, list) else [before] if before else []) + elements
            continue
        computed = _COMPUTED_ASSIGN.match(stripped)
        if computed and closing(computed.group(2), 1) == len(computed.group(2)) - 1:
            # `CONFIG=$(basename $(dirname $0))`, `N=$((8 / 2))`: one word however it is spaced inside
            name, value = computed.group(1), with_outputs(computed.group(2), functions, env, exported, positional, read)
            env[name] = _unset_stops(start, _expand, value, env, positional)
            if exporting:
                exported.add(name)
            continue
        if words and all(_ASSIGN.match(w) or _APPEND.match(w) for w in words):     # `MODEL=...`, `cmd+=" --x 1"`
            for w in words:
                name, _, value = w.partition("=")
                value = with_outputs(value, functions, env, exported, positional, read)    # `"exp$(suffix "$@")"`
                value = _unset_stops(start, _expand, value, env, positional)
                if name.endswith("+"):
                    name = name[:-1]
                    before = env.get(name, os.environ.get(name, ""))
                    value = (before if isinstance(before, str) else " ".join(before)) + value
                env[name] = value
                if exporting:
                    exported.add(name)
            continue
        if words and words[0] == "shift":     # `shift`, `shift 2`, `shift 2 || true`: drop leading arguments
            count = _int(_expand(words[1], env, positional)) if len(words) > 1 else None
            count = 1 if count is None else count
            if count <= len(positional):       # bash does not shift past the last argument (it fails)
                positional = tuple(positional)[count:]
            continue
        if stripped.startswith("cd "):
            target = _expand(stripped[3:].strip().strip("\"'"), env, positional)
            if "$" not in target and "`" not in target:
                # from the folder the script is in now: the one it cd'd to, else its own folder (run from there,
                # `cd ..`), else where `bash scripts/run.sh` runs it (the current folder), else the one above it
                here = os.path.dirname(os.path.abspath(script))
                bases = [cd] if cd else [here, os.getcwd(), os.path.dirname(here)]
                cd = next((os.path.normpath(os.path.join(b, target)) for b in bases
                           if os.path.isdir(os.path.join(b, target))), os.path.normpath(os.path.join(bases[0], target)))
                env["PWD"] = cd                 # (`export PYTHONPATH=$PWD` after it)
            continue
        looped = loop_header(stripped, env, positional)
        if looped is not None:      # `for FOLD in {0..4}; do` around a launch: its first run is linted
            name, first, count = looped
            env[name] = first
            loops.append((start, f"{os.path.basename(script)} line {start} runs it in a loop (`for {name}`, "
                                 f"{count} runs): linted for its first, {name}={first}"))
            continue
        if words[:1] == ["done"] and loops:
            loops.pop()
            continue
        sourced = sourced_script(words, env, positional, script, cd, depth)
        if sourced is not None and os.path.basename(sourced) == "parse_options.sh":
            positional = kaldi_options(positional, env, script, start)     # Kaldi's `. utils/parse_options.sh`
            continue
        if sourced is not None:     # `source configs/env.sh`, `. ./common.sh`: its variables are this script's
            out.extend(shell_launches(sourced, positional, None, cd, depth + 1, (env, exported)))
            continue
        if console is None:
            console = _console_commands(script, cd)
        # the first command of the line's list or pipeline that is a launch (`mkdir -p out && torchrun ...
        # 2>&1 | tee out/log`), its redirections left out: bash gives the program none of them
        found = None
        for command in _commands(_unset_stops(start, _tokens, pieces, env, positional)):
            marked = _nested(command)          # (unset variables marked: the script's arguments drop them)
            tokens = [(unset_literal(w), n) for w, n in marked]
            found = _slurm(tokens, _command_start(tokens), _launch(tokens, env, console), batch)
            if found is not None:
                break
            called = _called_script(marked, env, exported, script, cd, depth)
            if called:
                out.extend(called)
        if found is None:
            continue
        if found.get("dora"):
            found["file"] = dora_module(found["dora"], cd, start)
            path, base, call = _console_file("dora run", found["file"] + ":main", script, cd, start)
            module = (found["file"], _module_root(path, found["file"])) + ((call,) if call else ())
        elif found.get("console"):
            path, base, call = _console_file(found["console"], found["file"], script, cd, start)
            name = found["file"].partition(":")[0]      # imported as its module, as the console script does
            module, found["module"] = (name, _module_root(path, name)) + ((call,) if call else ()), True
        elif found.get("module"):
            path, base = _module_file(found["file"], script, cd)
            if path is None:    # an installed package's training module (`python -m verl.trainer.main_ppo`)
                path, base = installed_module_file(found["file"])
            if path is None:
                continue        # a module that is not a training job's (`python -m pip install ...`, `-m pytest`)
            module = (found["file"], _module_root(path, found["file"]))
        else:
            path, base = _resolve(found["file"], script, cd)
        if path is None:
            raise ShellError(f"{f'{os.path.relpath(script)} ' if depth else ''}line {start} launches {found['file']}, "
                             f"which is not there (from the current folder, "
                             f"the script's folder or the folders above it){_near(found['file'], script, cd)}")
        given = list(found.get("argv", range(found["first_arg"], len(tokens))))    # (dora: its words)
        kept, args, unset = settled([marked[n][0] for n in given])     # bash passes nothing for an unset one
        lines = [tokens[given[n]][1] for n in kept]
        acc = found["accelerate_config"]
        if acc and not os.path.isabs(acc):
            acc = os.path.join(base, acc)
        passed = {name: env[name] for name in exported if name in env}
        passed.update(found.get("env") or {})
        passed = {k: v for k, v in passed.items() if isinstance(v, str) and "$" not in v and "`" not in v and
                  not (_NOT_PASSED.match(k) and not (found.get("plain") and _PLAIN_PYTHON_GETS.match(k)))}
        search = _search_path(exported, env, found.get("env") or {}, cd)
        if search:          # `cd repo; export PYTHONPATH=.`: the folders the launched process imports from
            passed["PYTHONPATH"] = search
        if found.get("plain") and found["world_size"] is None and passed.get("WORLD_SIZE", "").isdigit():
            found["world_size"] = int(passed["WORLD_SIZE"])     # `export WORLD_SIZE=1; python driver.py`
        launch = ShellLaunch(script, start, path, args, base, found["world_size"], acc, lines, passed,
                             module if found.get("module") else None, found.get("every_gpu_of"),
                             found.get("unset_world"), found.get("torchrun"), bool(found.get("plain")),
                             tuple(found.get("accelerate_args") or ()), tuple(unset), tuple(n for _, n in loops))
        at = branches.at()
        if not any(alternatives(launch, at, other, other_at) for other, other_at in zip(out, where)):
            out.append(launch)
            where.append(at)
    return out


def _search_path(exported: set, env: Dict, command_env: Dict, cd: Optional[str]) -> Optional[str]:
    """The PYTHONPATH the script gives the launched process, each folder made absolute from the folder the
    process starts in (the one the script cd'd to); entries of a variable not set here are left out."""
    value = command_env.get("PYTHONPATH", env.get("PYTHONPATH") if "PYTHONPATH" in exported else None)
    if not isinstance(value, str):
        return None
    folders = [os.path.abspath(os.path.join(cd or os.getcwd(), f)) for f in value.split(os.pathsep)
               if f and "$" not in f and "`" not in f and "\x01" not in f and "\x02" not in f]
    return os.pathsep.join(folders) or None

