"""A launcher that starts the training processes itself: ``subprocess.run(["torchrun", ...])``.

Project command lines (ms-swift's ``swift sft``, LLaMA-Factory's ``llamafactory-cli train``, cosmos-rl's
``cosmos-rl``) build a launch -- ``python -m torch.distributed.run --nproc_per_node 8 pkg/train.py ARGS``,
``torchrun ...``, ``accelerate launch ...``, ``bash launch_replica.sh`` -- and run it with `subprocess`. The
model is built in those processes, not in the launcher, and a lint never starts processes (the real torchrun
ran until the replay's deadline). During a replay a subprocess that is such a launch ends the replay with
one line naming the command and the lint of it (``fsdp-lint pkg/train.py -n 8 -- ARGS``); any other
subprocess (``git rev-parse``, ``nvidia-smi``) runs as before.
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Callable, List, Optional, Tuple

from fsdp_lint.replay.network import _asker

Patch = Callable[[Any, str, Any], None]


class LaunchElsewhere(BaseException):
    """The setup starts the training launch in a subprocess (a BaseException: launchers wrap their Popen in
    ``except Exception`` and go on to the next process); the message is the one line to report, `launch`
    what that launch runs (``path``, ``args``, ``world_size``, ``cwd``, ``env``, ``module``,
    ``accelerate_config``, ``shown``), which the lint follows (``engine.lint_facts``), or None."""

    def __init__(self, message: str, launch: Optional[dict] = None):
        super().__init__(message)
        self.launch = launch


def install(rec, patch: Patch) -> None:
    import subprocess

    real_init = subprocess.Popen.__init__

    def init(self, args, *rest, **kwargs):
        words = _words(args)
        if words:
            try:
                hint, launch = _launch_hint(words, kwargs.get("cwd"), kwargs.get("env"))
            except Exception:  # noqa: BLE001  (a command the launch reader refuses: run as the script wrote it)
                hint = None
            if hint is not None and _another_rank_of_this_job(launch, kwargs.get("env"), rec):
                # Lightning's launcher re-runs the script for local ranks 1..N-1 (LOCAL_RANK in their
                # environment) and goes on as rank 0: the replay is rank 0; the others are a process that does
                # nothing (they would build what rank 0 builds)
                return real_init(self, [sys.executable, "-c", "pass"], *rest, **kwargs)
            if hint is not None:
                raise LaunchElsewhere(hint, launch)
        return real_init(self, args, *rest, **kwargs)

    patch(subprocess.Popen, "__init__", init)

    real_system = os.system

    def system(command):
        # `os.system("accelerate launch ... train.py")`: a launcher's command line run by the shell
        try:
            hint, launch = _launch_hint(_words(command), None, None)
        except Exception:  # noqa: BLE001  (a command the launch reader refuses: run as the script wrote it)
            hint = None
        if hint is not None:
            raise LaunchElsewhere(hint, launch)
        return real_system(command)

    patch(os, "system", system)
    try:
        import torch.distributed.run as torchrun
    except ImportError:
        return

    def run(args):
        # torchrun inside the project's own process (`forge run`, `tune run`: `get_args_parser().parse_args(...)`
        # then `run(args)`): the same launch as its command line
        words = ["torchrun", f"--nproc_per_node={args.nproc_per_node}", f"--nnodes={args.nnodes}"]
        words += (["-m"] if getattr(args, "module", False) else []) + [args.training_script]
        hint, launch = _launch_hint(words + list(args.training_script_args or []), None, None)
        hint = hint and hint.replace("` in a subprocess:", "` in its own process (torch.distributed.run.run):")
        raise LaunchElsewhere(hint or f"the setup runs torchrun in its own process (`{' '.join(words)}`): a lint "
                                      f"never starts processes; lint that launch", launch)

    patch(torchrun, "run", run)


def _words(args) -> List[str]:
    if isinstance(args, (str, bytes)):
        try:
            return shlex.split(os.fsdecode(args))
        except ValueError:
            return []
    try:
        return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    except TypeError:
        return []


def _launch_hint(words: List[str], cwd, env) -> Tuple[Optional[str], Optional[dict]]:
    """The one line for a subprocess that launches training (None for any other command), and the launch."""
    from fsdp_lint.entry.shell import _launch, _module_root

    where = _asker(3)
    where = f"{where}: " if where else ""
    shown = " ".join(shlex.quote(w) for w in words)
    if len(shown) > 160:
        shown = shown[:157] + "..."
    head = os.path.basename(words[0])
    at = 1 if head in ("bash", "sh") and len(words) > 1 else 0
    script = words[at]
    if script.endswith(".sh") and os.path.isfile(script):
        inside, launch = _launches_in(script, words[at + 1:], shown, env)
        given = " ".join(shlex.quote(w) for w in words[at + 1:])
        return (f"{where}the setup starts `{shown}` in a subprocess{inside}: the training processes are that "
                f"launch script's; lint it (`fsdp-lint {os.path.relpath(script)}{' -- ' + given if given else ''}`, "
                f"with the environment the launcher gives it) -- a lint never starts processes"), launch
    found = _launch([(w, 0) for w in (["python"] + words[1:] if _is_python(words[0]) else words)], {}, {})
    if not found or not found.get("file"):
        return None, None
    target = found["file"]
    base = os.fsdecode(cwd) if cwd else os.getcwd()
    module = None
    if found.get("module"):
        module_file = os.path.join(base, *target.split(".")) + ".py"
        if not os.path.isfile(module_file) and not target.startswith("torch."):
            spec = _find_spec(target)
            if spec is None:
                return None, None
            module_file = spec
        module = (target, _module_root(module_file, target))
        target = module_file
    path = target if os.path.isabs(target) else os.path.join(base, target)
    if not os.path.isfile(path):
        return None, None
    if found.get("plain") and not _may_train(path):
        return None, None       # `python helper.py --json` whose output the setup reads: a probe, not the training
    rel = os.path.relpath(path)
    world = f" -n {found['world_size']}" if found.get("world_size") else ""
    args = words[found["first_arg"]:]
    rest = f" -- {' '.join(shlex.quote(a) for a in args)}" if args else ""
    launch = {"path": os.path.abspath(path), "args": list(args), "world_size": found.get("world_size"),
              "every_gpu_of": found.get("every_gpu_of"), "cwd": base, "env": _given_env(env), "module": module,
              "accelerate_config": found.get("accelerate_config"), "shown": shown, "plain": bool(found.get("plain")),
              "accelerate_args": tuple(found.get("accelerate_args") or ())}
    return (f"{where}the setup starts `{shown}` in a subprocess: the model is built in that launch's processes, "
            f"not in this one; lint the launch: `fsdp-lint {rel}{world}{rest}` -- a lint never starts processes"), launch


def _another_rank_of_this_job(launch: Optional[dict], env, rec) -> bool:
    """The subprocess runs the linted script itself again for another local rank (a framework's own launcher)."""
    return bool(launch) and isinstance(env, dict) and str(env.get("LOCAL_RANK", "0")) not in ("", "0") and \
        os.path.abspath(launch["path"]) == os.path.abspath(rec.path)


def _given_env(env) -> dict:
    """What the launch's own environment (Popen's ``env=``) sets beyond this process's, less what a launcher or
    this machine decides (`entry.shell`'s rule for what a launch line passes)."""
    from fsdp_lint.entry.shell import _NOT_PASSED

    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items()
            if isinstance(v, str) and os.environ.get(str(k)) != v and not _NOT_PASSED.match(str(k))}


def _launches_in(script: str, args, shown: str, env) -> Tuple[str, Optional[dict]]:
    """" (it launches pkg/train.py)": what the launch script runs, as fsdp-lint reads it; and its launch, when
    there is one."""
    from fsdp_lint.entry.shell import ShellError, shell_launches

    try:
        found = shell_launches(script, list(args))
    except (ShellError, OSError, ValueError):
        return "", None
    names = ", ".join(dict.fromkeys(os.path.relpath(l.path) for l in found))
    launch = None
    if len(found) == 1:
        one = found[0]
        launch = {"path": one.path, "args": list(one.args), "world_size": one.world_size,
                  "every_gpu_of": one.every_gpu_of, "cwd": one.cwd, "env": dict(_given_env(env), **one.env),
                  "module": one.module, "accelerate_config": one.accelerate_config, "shown": shown, "plain": one.plain,
                  "accelerate_args": one.accelerate_args}
    return (f" (it launches {names})" if names else ""), launch


def _may_train(path: str) -> bool:
    """A file a plain `python` subprocess runs is the training only when it is the project's own and its text
    has a word a model, wrap or framework needs (py-cpuinfo's `cpuinfo.py --json`, a project's probe script
    whose stdout is parsed, are not)."""
    from fsdp_lint.entry.project import is_local
    from fsdp_lint.entry.quick import may_matter

    if not is_local(path):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return may_matter(fh.read())
    except OSError:
        return False


def _is_python(word: str) -> bool:
    base = os.path.basename(word)
    return word == sys.executable or base.startswith("python")


def _find_spec(module: str) -> Optional[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None
