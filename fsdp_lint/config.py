"""Settings: defaults, ``[tool.fsdp-lint]`` in the nearest pyproject.toml, then the command line."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Tuple


class ConfigError(Exception):
    """A bad setting (message is one line)."""


@dataclass
class EntrySpec:
    """``[[tool.fsdp-lint.entry]]``: a launch command to lint -- the file, the script's own
    arguments, and settings for that run (world size, api, ...)."""
    path: str                                      # absolute
    args: List[str] = field(default_factory=list)
    cwd: Optional[str] = None                      # launched from: the config file's folder
    overrides: Dict[str, Any] = field(default_factory=dict)   # Settings field -> value


@dataclass
class Settings:
    world_size: int = 8
    api: Optional[str] = None
    wrap: List[str] = field(default_factory=list)
    use_orig_params: Optional[bool] = None
    model: Optional[str] = None
    select: List[str] = field(default_factory=lambda: ["ALL"])
    ignore: List[str] = field(default_factory=list)
    extend_select: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    fail_on: str = "warning"
    # thresholds
    whole_model_fraction: float = 0.9        # FSD101: one unit holding this share of the model
    collective_floor_bytes: int = 1 << 20    # FSD102: units whose all-gather moves less than this
    over_fine_fraction: float = 0.5          # FSD102: ... when more than this share of units do
    padding_fraction: float = 0.05           # FSD601
    replay_timeout: float = 120.0
    gpus_per_node: int = 8                   # HYBRID_SHARD node groups; FSD702: replicas across nodes
    gpu: Optional[str] = None                # the simulated node's GPU (fsdp_lint.gpus; None: the default)
    # the memory budget (fsdp_lint.plan.budget): the device's memory (IEC units; None: the --gpu profile's)
    # and what a real process loses of it
    gpu_memory: Optional[str] = None
    cuda_context_memory: Optional[str] = None        # None: budget.DEFAULT_CUDA_CONTEXT
    nccl_memory: Optional[str] = None                # None: budget.DEFAULT_NCCL
    memory_fragmentation: Optional[float] = None     # None: budget.DEFAULT_FRAGMENTATION
    memory_info_share: float = 0.05                  # FSD104/FSD202: below this share of the usable memory, info
    suggest: bool = False                            # --suggest: plans that fit (fsdp_lint.suggest)
    allow_partial: bool = False              # report a plan with elements fsdp-lint does not model
    fetch_configs: bool = False              # fetch a hub model's configs and tokenizer it stops on (fsdp_lint.hub_fetch)
    entries: List[EntrySpec] = field(default_factory=list)
    # frameworks (issue 8): an accelerate config file as `accelerate launch --config_file` reads it; a
    # Hugging Face model config for `from_pretrained(...)` (never downloaded) or to lint a model alone
    accelerate_config: Optional[str] = None
    hf_config: Optional[str] = None
    hf_class: Optional[str] = None
    world_size_source: str = "default"       # where world_size came from: "default" | "config" | "--world-size"
    # the command line: with nothing giving the world size, a script that starts its own processes
    # (Lightning's ``Fabric(devices=4)`` run as ``python train.py``) decides it
    script_world: bool = False
    # launched as an entry point (from a launch script, an [[entry]], or with `-- ARGS`): replayed even
    # where its syntax reaches no model (a CLI that picks its recipe from the config at run time)
    launched: bool = False
    # the training inputs (what --run/--simulate feed and activations are estimated for)
    input_shape: Optional[str] = None        # "8,2048"
    input_dtype: Optional[str] = None        # "float" | "long" | "bfloat16" | "half"
    config_path: Optional[str] = None
    # the shell script whose launch line this run is (`fsdp-lint scripts/train.sh`): findings about a flag
    # point at the script line that sets it
    launch_script: Optional[str] = None
    # the environment that launch line gives the process (`export VAR=...`, `VAR=... torchrun`, the
    # launcher's own variables): (name, value) pairs
    launch_env: Tuple[Tuple[str, str], ...] = ()
    launch_plain: bool = False                 # a launch script's plain `python FILE`: no launcher's variables
    accelerate_args: Tuple[str, ...] = ()      # `accelerate launch`'s options on the launch line (--use_fsdp ...)
    # the module that launch line runs (`-m training.run`) and the folder it resolves from: (module, root)
    launch_module: Tuple[str, ...] = ()
    # what reading the launch line found that the report says (a world size a variable nothing sets gives)
    launch_notes: Tuple[str, ...] = ()
    # --simulate: activations enter the static estimate even for inputs inferred from the first layer
    # (the simulation runs on the same ones, so the two figures compare)
    activations_for_inferred_inputs: bool = False
    # --select/--ignore/--extend-select from the command line: a second layer over the config's
    # (ruff's model: a layer with `select` starts the selection afresh; one without only adds/removes)
    cli_selection: Optional[Dict[str, Any]] = None

    def with_overrides(self, **kwargs) -> "Settings":
        clean = {k: v for k, v in kwargs.items() if v is not None and v != [] and v != ()}
        return replace(self, **clean)


_KEYS = {f.name.replace("_", "-"): f.name for f in fields(Settings)}
_KEYS.pop("entries")
_KEYS["entry"] = "entries"
_INTERNAL = {"config_path", "launch_script", "launch_env", "launch_plain", "accelerate_args", "launch_module", "launch_notes", "cli_selection", "world_size_source", "script_world", "launched", "activations_for_inferred_inputs", "suggest"}
# what an [[tool.fsdp-lint.entry]] table may set besides `path` and `args`
_ENTRY_SETTINGS = ("world_size", "api", "wrap", "use_orig_params", "model", "replay_timeout")


def find_pyproject(start: str) -> Optional[str]:
    d = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)))
    while True:
        candidate = os.path.join(d, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def load_settings(start: str, explicit: Optional[str] = None) -> Settings:
    path = explicit or find_pyproject(start)
    settings = Settings()
    if not path:
        return settings
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except Exception as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    section = data.get("tool", {}).get("fsdp-lint")
    if section is None:
        return settings
    values: Dict[str, Any] = {}
    for key, value in section.items():
        name = _KEYS.get(key) or _KEYS.get(key.replace("_", "-"))
        if name is None or name in _INTERNAL:
            raise ConfigError(f"{path}: unknown key [tool.fsdp-lint] {key!r}")
        values[name] = value
    settings = replace(settings, config_path=path)
    for name, value in values.items():
        values[name] = _entries(value, path) if name == "entries" else _check_type(name, value, path)
    for name in ("accelerate_config", "hf_config"):    # files named in the config: relative to it
        if values.get(name):
            values[name] = os.path.join(os.path.dirname(os.path.abspath(path)), values[name])
    try:
        settings = replace(settings, **values)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if "world_size" in values:
        settings = replace(settings, world_size_source="config")
    validate(settings, origin=path)
    return settings


def _entries(value: Any, path: str) -> List[EntrySpec]:
    """``[[tool.fsdp-lint.entry]]`` tables: `path` (relative to the config file), `args` (a list, or
    one string split like a shell would), and per-run settings."""
    import shlex

    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{path}: [tool.fsdp-lint] entry must be an array of tables ([[tool.fsdp-lint.entry]])")
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for i, table in enumerate(value):
        where = f"{path}: [[tool.fsdp-lint.entry]] #{i + 1}"
        file = table.get("path")
        if not isinstance(file, str) or not file:
            raise ConfigError(f"{where}: `path` (the entry point's file) is required")
        args = table.get("args", [])
        if isinstance(args, str):
            args = shlex.split(args)
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise ConfigError(f"{where}: `args` must be a list of strings, got {args!r}")
        overrides: Dict[str, Any] = {}
        for key, v in table.items():
            if key in ("path", "args"):
                continue
            name = _KEYS.get(key) or _KEYS.get(key.replace("_", "-"))
            if name not in _ENTRY_SETTINGS:
                allowed = ", ".join(["path", "args"] + [k.replace("_", "-") for k in _ENTRY_SETTINGS])
                raise ConfigError(f"{where}: unknown key {key!r} (an entry takes {allowed})")
            overrides[name] = _check_type(name, v, where)
        full = os.path.normpath(os.path.join(base, file))
        if not os.path.isfile(full):
            raise ConfigError(f"{where}: no such file {file!r} (paths are relative to {os.path.dirname(path) or '.'})")
        out.append(EntrySpec(path=full, args=[str(a) for a in args], overrides=overrides, cwd=base))
        validate(replace(Settings(), **overrides), origin=where)
    return out


def _type_hints() -> Dict[str, Any]:
    import typing

    return typing.get_type_hints(Settings)


def _describe(tp) -> str:
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_describe(a) for a in inner)
    if origin in (list, List):
        plural = {str: "strings", int: "integers", float: "numbers", bool: "true/false values"}
        return f"a list of {plural.get(args[0]) or _describe(args[0])}" if args else "a list"
    if origin in (dict, Dict):
        return "a table of glob = [codes]"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _coerce(tp, value):
    """`value` converted to `tp` (a scalar string is accepted for a list); raises ValueError."""
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value)
            except ValueError:
                pass
        raise ValueError
    if origin in (list, List):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError
        return [_coerce(args[0], v) for v in items] if args else list(items)
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ValueError
        return {_coerce(args[0], k): _coerce(args[1], v) for k, v in value.items()} if args else dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    return value


# rule selections are lists, as in ruff's config: `select = "ALL"` is refused (issue 18), not read as ["ALL"]
_LIST_ONLY = ("select", "ignore", "extend_select", "per_file_ignores")


def _check_type(name: str, value: Any, origin: str) -> Any:
    tp = _type_hints().get(name)
    if tp is None:
        return value
    key = name.replace("_", "-")
    if name in _LIST_ONLY:
        bad = value if isinstance(value, str) else next(
            (v for v in value.values() if isinstance(v, str)), None) if isinstance(value, dict) else None
        if bad is not None:
            example = f'{key} = ["{value}"]' if isinstance(value, str) else f'{key} = {{ "tests/*" = ["{bad}"] }}'
            raise ConfigError(f"{origin}: [tool.fsdp-lint] {key} must be {_describe(tp)} ({example}), "
                              f"got {value!r}")
    try:
        return _coerce(tp, value)
    except ValueError:
        key = name.replace("_", "-")
        raise ConfigError(f"{origin}: [tool.fsdp-lint] {key} must be {_describe(tp)}, got {value!r}") from None


MAX_WORLD_SIZE = 1 << 20      # ranks fsdp-lint plans for at most (per-rank tables and loops stay small)
_FRACTIONS = ("whole_model_fraction", "over_fine_fraction", "padding_fraction", "memory_info_share")


MAX_TIMEOUT = 86400.0          # seconds: a replay deadline above a day (inf, 1e308) cannot be kept by a timer
# characters of a `model` target ([path.py:]NAME(arg, key=value, ...)): real ones are a line; a longer
# one is refused before it is parsed (and never echoed whole)
MAX_MODEL_TARGET = 4096


def _not_a_hf_config(path: str) -> Optional[str]:
    """Why `path` is not a Hugging Face model config (its config.json, or the folder holding it), or None."""
    import json

    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            return "the folder has no config.json (name a model's config.json or the folder holding it)"
        path = os.path.join(path, "config.json")
    elif not os.path.exists(path):
        if not path.endswith(".json") and path.count("/") == 1 and not path.startswith((".", "/")):
            return None          # `org/name`: a model in the local Hugging Face cache (transformers finds it)
        return "no such file or directory"
    elif not os.path.isfile(path):
        return "not a regular file"
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(1 << 24))
    except (OSError, ValueError) as exc:
        return f"not a model config (config.json holds a JSON object): {type(exc).__name__}: {str(exc)[:120]}"
    if not isinstance(data, dict) or "model_type" not in data:
        return "not a model config: a Hugging Face config.json is a JSON object with a `model_type`"
    return None


def validate(settings: Settings, origin: str = "command line") -> None:
    if not isinstance(settings.world_size, int) or isinstance(settings.world_size, bool) or settings.world_size < 1:
        raise ConfigError(f"{origin}: world-size must be a positive integer, got {settings.world_size!r}")
    if settings.world_size > MAX_WORLD_SIZE:
        raise ConfigError(f"{origin}: world-size must be at most {MAX_WORLD_SIZE:,} (2^20), got {settings.world_size:,}")
    for name in _FRACTIONS:
        value = getattr(settings, name)
        if not 0 <= value <= 1:
            raise ConfigError(f"{origin}: {name.replace('_', '-')} must be between 0 and 1, got {value!r}")
    if settings.collective_floor_bytes < 0:
        raise ConfigError(f"{origin}: collective-floor-bytes must be 0 or more, got {settings.collective_floor_bytes!r}")
    if settings.replay_timeout is not None and not settings.replay_timeout > 0:
        raise ConfigError(f"{origin}: replay-timeout must be a positive number of seconds, got {settings.replay_timeout!r}")
    if settings.replay_timeout is not None and settings.replay_timeout > MAX_TIMEOUT:
        raise ConfigError(f"{origin}: replay-timeout must be at most {MAX_TIMEOUT:,.0f} seconds (a day), "
                          f"got {settings.replay_timeout!r}")
    if isinstance(settings.model, str) and len(settings.model) > MAX_MODEL_TARGET:
        raise ConfigError(f"{origin}: model must be at most {MAX_MODEL_TARGET:,} characters ([path.py:]NAME or "
                          f"NAME(arg, key=value, ...)), got {len(settings.model):,}: {settings.model[:60]!r}...")
    if settings.hf_config:
        problem = _not_a_hf_config(settings.hf_config)
        if problem:
            raise ConfigError(f"{origin}: hf-config {settings.hf_config}: {problem}")
    if not isinstance(settings.gpus_per_node, int) or isinstance(settings.gpus_per_node, bool) \
            or settings.gpus_per_node < 1:
        raise ConfigError(f"{origin}: gpus-per-node must be a positive integer, got {settings.gpus_per_node!r}")
    if settings.gpu is not None:
        from fsdp_lint import gpus

        if gpus.find(settings.gpu) is None:
            what = "--gpu" if origin == "command line" else f"{origin}: gpu"
            raise ConfigError(f"{what}: unknown GPU {settings.gpu!r}; known: {', '.join(gpus.names())}")
    for name in ("gpu_memory", "cuda_context_memory", "nccl_memory"):
        value = getattr(settings, name)
        if value is not None and parse_bytes(value) is None:
            what = f"--{name.replace('_', '-')}" if origin == "command line" else f"{origin}: {name.replace('_', '-')}"
            raise ConfigError(f"{what} must be a size such as 80GiB, 40GB or 512MiB, got {value!r}")
    if settings.gpu_memory is not None and not parse_bytes(settings.gpu_memory):
        raise ConfigError(f"{origin}: gpu-memory must be more than 0, got {settings.gpu_memory!r}")
    if settings.memory_fragmentation is not None and not 0 <= settings.memory_fragmentation < 1:
        raise ConfigError(f"{origin}: memory-fragmentation must be at least 0 and below 1, "
                          f"got {settings.memory_fragmentation!r}")
    if settings.api not in (None, "fsdp1", "fsdp2"):
        raise ConfigError(f"{origin}: api must be 'fsdp1' or 'fsdp2', got {settings.api!r}")
    if settings.fail_on not in ("info", "warning", "error"):
        raise ConfigError(f"{origin}: fail-on must be info, warning or error, got {settings.fail_on!r}")
    if settings.input_shape is not None and input_shape_dims(settings.input_shape) is None:
        what = "--input-shape" if origin == "command line" else f"{origin}: input-shape"
        raise ConfigError(f"{what} must be positive integers separated by commas (e.g. 8,2048), "
                          f"got {settings.input_shape!r}")
    if settings.input_dtype not in (None, "float", "long", "bfloat16", "half"):
        raise ConfigError(f"{origin}: input-dtype must be float, long, bfloat16 or half, got {settings.input_dtype!r}")


def input_shape_dims(text) -> Optional[tuple]:
    """``"8,2048"`` (or ``8x2048``) -> ``(8, 2048)``; None when it is not a shape."""
    import re

    if not isinstance(text, str):
        return None
    parts = [d.strip() for d in re.split(r"[,x]", text.strip())]
    if not parts or not all(d.isdigit() for d in parts):
        return None
    dims = tuple(int(d) for d in parts)
    return dims if all(d >= 1 for d in dims) else None


_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
               "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text) -> Optional[int]:
    """``"80GiB"`` -> 85899345920 (IEC), ``"40GB"`` -> 40e9 (SI), a plain number as bytes; None when
    it is no size."""
    import re

    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if text >= 0 else None
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _BYTE_UNITS:
        return None
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])
