"""Framework options of one lint: ``--accelerate-config``, ``--hf-config``, ``--hf-class``, and the node's
``--gpu`` (what the simulated CUDA answers: `fsdp_lint.replay.node`).

An accelerate config file is read by accelerate's own launcher code (``accelerate launch``'s parser,
``_validate_launch_command`` and ``prepare_multi_gpu_env``), so the environment the replayed script
sees is the one ``accelerate launch --config_file FILE train.py`` would give it, for the installed
accelerate version.
"""
from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


class OptionError(Exception):
    """A framework option that cannot be used (message is one line, exit code 2)."""


@dataclass
class FrameworkOptions:
    accelerate_config: Optional[str] = None
    accelerate_env: Dict[str, str] = field(default_factory=dict)
    hf_config: Optional[str] = None           # a config.json, or a directory holding one
    hf_class: Optional[str] = None            # AutoModelForCausalLM, LlamaForCausalLM, ...
    gpu: Optional[str] = None                 # issue 15: the simulated node's GPU (fsdp_lint.gpus; None: default)
    script_world: bool = False                # nothing gave the world size: a script's own launcher may
    launch_env: Dict[str, str] = field(default_factory=dict)   # what the launch line exports to the process
    launch_plain: bool = False                # a plain `python FILE` launch: no torchrun variables
    accelerate_args: Tuple[str, ...] = ()     # `accelerate launch`'s own options on the launch line
    node_gpus: int = 8                        # the node's GPUs (--gpus-per-node): its Ray cluster's

    @classmethod
    def from_settings(cls, settings) -> "FrameworkOptions":
        opts = cls(accelerate_config=getattr(settings, "accelerate_config", None),
                   hf_config=getattr(settings, "hf_config", None), hf_class=getattr(settings, "hf_class", None),
                   gpu=getattr(settings, "gpu", None),
                   script_world=bool(getattr(settings, "script_world", False))
                   and getattr(settings, "world_size_source", "default") == "default",
                   launch_env=dict(getattr(settings, "launch_env", None) or ()),
                   launch_plain=bool(getattr(settings, "launch_plain", False)),
                   accelerate_args=tuple(getattr(settings, "accelerate_args", None) or ()),
                   node_gpus=int(getattr(settings, "gpus_per_node", None) or 8))
        if opts.hf_config:
            opts.hf_config = _config_json(opts.hf_config)
        if opts.accelerate_config or opts.accelerate_args:
            opts.accelerate_env = accelerate_launch_env(opts.accelerate_config, getattr(settings, "world_size", None),
                                                        opts.accelerate_args)
        return opts

    def yaml_lines(self) -> Dict[str, Tuple[int, int]]:
        """key -> (line, col) of the keys of the accelerate config file, for findings that point there."""
        return yaml_key_lines(self.accelerate_config) if self.accelerate_config else {}


def _config_json(path: str) -> str:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise OptionError(f"--hf-config {path}: no such file (pass a model's config.json or the directory holding it)")
    return path


# what `accelerate launch` sets but that is about processes, not about the plan
_LAUNCHER_ONLY = {"OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}


def accelerate_launch_env(path: Optional[str], world_size: Optional[int] = None,
                          launch_args: Tuple[str, ...] = ()) -> Dict[str, str]:
    """The environment variables ``accelerate launch --config_file PATH [OPTIONS]`` sets for the script
    (`launch_args`: the launch line's own options, ``--use_fsdp --fsdp_sharding_strategy=2 ...``, which
    accelerate's parser reads over the config's).

    The launch gets ``--num_processes WORLD_SIZE``: the world is fsdp-lint's ``--world-size``, and a config
    written for a launcher that passes the process count itself (no ``num_processes`` key, as with SLURM
    scripts) is refused by accelerate without it."""
    shown = f"--accelerate-config {path}" if path else f"accelerate launch {' '.join(launch_args)}"
    if path and not os.path.isfile(path):
        raise OptionError(f"--accelerate-config {path}: no such file")
    try:
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils.launch import prepare_multi_gpu_env
    except ImportError:
        raise OptionError("--accelerate-config needs accelerate: pip install 'fsdp-lint[hf]'") from None
    before = dict(os.environ)
    said = io.StringIO()        # (argparse's own words for a refusal)
    try:
        count = ["--num_processes", str(world_size)] if world_size else []
        config = ["--config_file", path] if path else []
        with contextlib.redirect_stderr(said):
            args = launch_command_parser().parse_args([*config, *_without_values(launch_args), *count, "train.py"])
        args, _, _ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    except SystemExit:
        why = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        raise OptionError(f"{shown}: accelerate rejects it{': ' + why[-1] if why else ''}") from None
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OptionError(f"{shown}: accelerate cannot read it: {type(exc).__name__}: {msg}") from None
    finally:
        os.environ.clear()
        os.environ.update(before)
    # a config that is not FSDP's (MULTI_GPU) still starts the processes: a script that shards with torch's
    # own FSDP runs as it does under torchrun; an Accelerator that prepares the model wraps it in DDP, which
    # the accelerate driver refuses (fsdp_lint.replay.frameworks.accelerate)
    return {k: v for k, v in env.items() if before.get(k) != v and k not in _LAUNCHER_ONLY}


def _without_values(words: Tuple[str, ...]) -> List[str]:
    """The launch line's accelerate options less ``--num_processes``/``--config_file`` and their values (the
    world and the config are fsdp-lint's, given separately) and the machines' rendezvous."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0]
        # (and the rendezvous of the node's machines: the simulated node is rank 0's, whatever the
        # script computed its address and port from -- `--main_process_port $((20000 + SLURM_JOB_ID % 10000))`)
        if name in ("--num_processes", "--config_file", "--num_machines", "--main_process_ip", "--main_process_port",
                    "--machine_rank"):
            skip = "=" not in w
            continue
        out.append(w)
    return out


def yaml_key_lines(path: str) -> Dict[str, Tuple[int, int]]:
    out: Dict[str, Tuple[int, int]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for i, text in enumerate(fh, start=1):
                stripped = text.lstrip()
                if stripped.startswith("#") or ":" not in stripped:
                    continue
                key = stripped.split(":", 1)[0].strip().strip("'\"")
                out.setdefault(key, (i, len(text) - len(stripped) + 1))
    except OSError:
        pass
    return out


def find_literal(path: str, value: str) -> Optional[Tuple[int, int]]:
    """(line, col) of the first string literal in `path` that is `value` or names it in a comma-separated
    list ("LlamaDecoderLayer,MistralDecoderLayer"), for findings about a class name a file spells."""
    import re

    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(value)}(?![A-Za-z0-9_])")
    for i, text in enumerate(lines, start=1):
        m = pattern.search(text)
        if m and not text.lstrip().startswith("#"):
            return i, m.start() + 1
    return None


def names_list(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]
