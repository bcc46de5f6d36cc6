"""The runs a launch script named on the command line asks for (`fsdp_lint.entry.shell` reads its launch lines):
each launched file with its arguments, world size, accelerate config, environment and the notes about the script
(the variables it never sets, a world it does not set)."""
from __future__ import annotations

import os
from typing import Optional

from fsdp_lint.cli_paths import BadInput


def _every_gpu(machines, gpus_per_node: int, notes: list) -> int:
    machines = int(machines or 1)
    notes.append(f"the accelerate config's num_processes is `gpu` (every GPU of the node, as torchrun's "
                 f"--nproc_per_node gpu): planned for {gpus_per_node} per node x {machines} "
                 f"(--gpus-per-node sets the node's count)")
    return gpus_per_node * machines


def _accelerate_config_processes(script: str, launch, gpus_per_node: int, notes: list) -> Optional[int]:
    """``accelerate launch --config_file CFG`` without ``--num_processes``: the config's ``num_processes``
    is the world (accelerate reads it; ``gpu``: every GPU of each machine, as accelerate passes it to
    torchrun); a config without it is refused by accelerate on a node too."""
    import re

    try:
        with open(launch.accelerate_config, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None         # (the accelerate config's own error is reported where it is read)
    before = dict(os.environ)
    try:        # accelerate's own reading of the launch line (YAML or JSON config), and its refusal
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser

        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
            ["--config_file", launch.accelerate_config, "train.py"]))
        if str(args.num_processes) == "gpu":     # passed to torchrun as `--nproc_per_node gpu`
            return _every_gpu(args.num_machines, gpus_per_node, notes)
        return int(args.num_processes) if args.num_processes else None
    except ImportError:       # no accelerate here: the config's own top-level key
        found = re.search(r"^num_processes:\s*(\d+|gpu)\s*(#.*)?$", text, re.M)
        if found and found.group(1) == "gpu":
            machines = re.search(r"^num_machines:\s*(\d+)\s*(#.*)?$", text, re.M)
            return _every_gpu(machines.group(1) if machines else 1, gpus_per_node, notes)
        return int(found.group(1)) if found else None
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    finally:
        os.environ.clear()
        os.environ.update(before)
    raise BadInput(f"{script}: line {launch.line}: `accelerate launch --config_file {os.path.relpath(launch.accelerate_config)}` "
                   f"passes no --num_processes and the config has no num_processes: accelerate refuses it on a node "
                   f"too ({said}); add one of them")


_NEVER_SETS, _NOT_RUN = " never sets ", " fsdp-lint does not run"


def with_unset_note(msg: str, run_settings) -> str:
    """A launch's failure, with the variables its script never sets (bash passed nothing for them) and the
    command substitutions not run here."""
    notes = [n for n in getattr(run_settings, "launch_notes", ()) if _NEVER_SETS in n or _NOT_RUN in n]
    return msg + "".join(f" [{n}]" for n in notes)


def _unpassed_arguments(script: str, script_args) -> str:
    """`` (the script reads its arguments -- $1, $2 -- and none were given: ...)`` where that is so, else ""."""
    import re

    if script_args:
        return ""
    try:
        with open(script, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    read = sorted(set(re.findall(r"\$\{?([1-9])\b", text)))
    if not read:
        return ""
    return (f" (it is built from the script's arguments -- {', '.join('$' + n for n in read)} -- and none were given: "
            f"`fsdp-lint {script} -- ARGS` passes them as `bash {script} ARGS` does)")


def shell_runs(scripts, settings, script_args, cli_world_size):
    """The launch lines of shell scripts named on the command line, as runs of the files they launch with
    their arguments, world size and accelerate config (fsdp_lint.entry.shell)."""
    from fsdp_lint.entry.bash_substitutions import NODE_SMI
    from fsdp_lint.entry.shell import NODE_GPUS, ShellError, launcher_refusal, shell_launches

    runs = []
    for script, explicit in scripts:
        NODE_GPUS[0] = settings.gpus_per_node
        NODE_SMI[0] = (settings.gpu, settings.gpus_per_node)
        try:      # `-- ARGS` are the script's own arguments, as `bash SCRIPT ARGS` gives them
            launches = shell_launches(script, script_args or ())
        except ShellError as exc:
            raise BadInput(f"{script}: {exc}") from None
        finally:
            NODE_GPUS[0] = NODE_SMI[0] = None
        if not launches:
            raise BadInput(f"{script}: no launch of a Python file in it (torchrun, python -m torch.distributed.run, "
                           f"accelerate launch, deepspeed, lightning run model / fabric run, or python FILE.py)")
        for launch in launches:
            refusal = launcher_refusal(launch)
            if refusal:
                raise BadInput(f"{script}: line {launch.line}: {refusal} (torchrun refuses the launch before it starts "
                               f"anything, on a node too)")
            overrides = {"launch_script": os.path.abspath(script), "launched": True}
            world = launch.world_size or (launch.every_gpu_of * settings.gpus_per_node if launch.every_gpu_of else None)
            if not world and launch.accelerate_config and cli_world_size is None:
                notes: list = []
                world = _accelerate_config_processes(script, launch, settings.gpus_per_node, notes)
                if notes:
                    overrides["launch_notes"] = overrides.get("launch_notes", ()) + tuple(notes)
            if world and cli_world_size is None:
                overrides.update(world_size=world, world_size_source="launch script")
            elif launch.unset_world and cli_world_size is None:
                overrides["launch_notes"] = (f"the launch's world is `{launch.unset_world}`, which {os.path.basename(script)} "
                                             f"does not set: planned for world size {settings.world_size} (pass "
                                             f"--world-size, or set it in the script)",)
            if launch.unset:      # bash expands them to nothing: a failure on that names them
                names = ", ".join("$" + n for n in launch.unset)
                overrides["launch_notes"] = overrides.get("launch_notes", ()) + (
                    f"{os.path.basename(script)} line {launch.line}{_NEVER_SETS}{names}: bash passes nothing for "
                    f"{'it' if len(launch.unset) == 1 else 'them'} (set {'it' if len(launch.unset) == 1 else 'them'} "
                    f"in the script or the environment)",)
            if launch.loops:      # `for FOLD in {0..4}; do torchrun ... --fold $FOLD; done`
                overrides["launch_notes"] = overrides.get("launch_notes", ()) + tuple(launch.loops)
            computed = next((a for a in launch.args if "$(" in a or "`" in a), None)
            if computed:          # a command substitution not run here (`--steps $(jq .steps cfg.json)`)
                overrides["launch_notes"] = overrides.get("launch_notes", ()) + (
                    f"{os.path.basename(script)} line {launch.line}: `{computed}{'' if computed.endswith(')') else '...'}` "
                    f"is a command substitution"
                    f"{_NOT_RUN}: its text is passed as written, where bash passes its output",)
            if launch.env:
                overrides["launch_env"] = tuple(sorted(launch.env.items()))
            if launch.plain:
                overrides["launch_plain"] = True
            if launch.module:
                overrides["launch_module"] = launch.module
            if launch.accelerate_config and not settings.accelerate_config:
                if not os.path.exists(launch.accelerate_config):
                    raise BadInput(f"{script}: line {launch.line}: accelerate's --config_file is "
                                   f"{launch.accelerate_config}, which is not there{_unpassed_arguments(script, script_args)}")
                overrides["accelerate_config"] = launch.accelerate_config
            if launch.accelerate_args:
                overrides["accelerate_args"] = launch.accelerate_args
            runs.append((launch.path, list(launch.args), settings.with_overrides(**overrides), explicit, launch.cwd))
    return runs
