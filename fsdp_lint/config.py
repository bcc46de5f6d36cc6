"""Settings: defaults, ``[tool.fsdp-lint]`` in the nearest pyproject.toml, then the command line."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Optional


class ConfigError(Exception):
    """A bad setting (message is one line)."""


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
    # the training inputs (what --run/--simulate feed and activations are estimated for)
    input_shape: Optional[str] = None        # "8,2048"
    input_dtype: Optional[str] = None        # "float" | "long" | "bfloat16" | "half"
    config_path: Optional[str] = None
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
_INTERNAL = {"config_path", "cli_selection", "activations_for_inferred_inputs"}


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
        values[name] = _check_type(name, value, path)
    try:
        settings = replace(settings, **values)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    validate(settings, origin=path)
    return settings


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
        return f"a list of {_describe(args[0])}s" if args else "a list"
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


def _check_type(name: str, value: Any, origin: str) -> Any:
    tp = _type_hints().get(name)
    if tp is None:
        return value
    try:
        return _coerce(tp, value)
    except ValueError:
        key = name.replace("_", "-")
        raise ConfigError(f"{origin}: [tool.fsdp-lint] {key} must be {_describe(tp)}, got {value!r}") from None


def validate(settings: Settings, origin: str = "command line") -> None:
    if not isinstance(settings.world_size, int) or isinstance(settings.world_size, bool) or settings.world_size < 1:
        raise ConfigError(f"{origin}: world-size must be a positive integer, got {settings.world_size!r}")
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
