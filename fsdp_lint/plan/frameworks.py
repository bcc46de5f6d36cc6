"""The plan of a framework's wrap calls: which framework made them (``plan.framework``), the wrap-class
names it could not match (policy entries for FSD103, at the line or argument that set them) and
accelerate's upcast of low-precision trainable parameters."""
from __future__ import annotations

from typing import List, Optional

from fsdp_lint.replay.frameworks import current_options

def framework_of(wrap_calls) -> Optional[str]:
    """The framework that made the plan's wrap calls (the last call's), or None (the file's own code)."""
    for call in reversed(wrap_calls):
        name = getattr(call, "framework", None)
        if name:
            return name
    return None


def framework_errors(wrap_calls) -> List[dict]:
    out: List[dict] = []
    for call in wrap_calls:
        out.extend(getattr(call, "framework_errors", []))
    return out


def annotate_plan(plan, result, tree, settings=None) -> None:
    """`plan.framework`, and a policy entry (for FSD103) for each wrap-class name a framework could not
    find, located where the name is written: the linted file, the accelerate config, or the call."""
    import os

    from fsdp_lint.replay.frameworks.options import find_literal
    from fsdp_lint.plan.build import PolicyInfo

    from fsdp_lint.replay.frameworks.accelerate import apply_upcast, plugin_in_code

    plan.framework = framework_of(result.wrap_calls)
    if plan.framework == "transformers":
        stopped = getattr(result, "stopped", None)
        user_file = next((e["path"] for e in framework_errors(result.wrap_calls)), None) \
            or (stopped[1].path if stopped else None)
        plan.hf_frontend = hf_frontend(getattr(result, "argv", None) or [], user_file,
                                       getattr(settings, "launch_script", None))
    # where the framework's configuration is written (accelerate: the plugin in code, else the YAML)
    plan.framework_config = "plugin" if plan.framework == "accelerate" and plugin_in_code(result) else None
    argv = list(getattr(result, "argv", None) or [])
    apply_upcast(plan, result, tree)
    for call, info in zip(result.optimizers, plan.optimizers):
        info.remapped_by = getattr(call, "remapped_by", None)
    options = current_options()
    yaml_lines = options.yaml_lines()
    from_yaml = "FSDP_TRANSFORMER_CLS_TO_WRAP" in options.accelerate_env
    for err in framework_errors(result.wrap_calls):
        for name in err["missing"]:
            path, line, setting = err["path"], err["line"], err["setting"]
            explicit = setting == "transformer_layer_cls_to_wrap"
            spot = find_literal(path, name) if explicit and os.path.isfile(path) else None
            if spot is not None:
                line = spot[0]
                if options.accelerate_config and os.path.abspath(path) == os.path.abspath(options.accelerate_config):
                    setting = "fsdp_transformer_layer_cls_to_wrap"
            elif explicit and from_yaml and "fsdp_transformer_layer_cls_to_wrap" in yaml_lines:
                path, line = options.accelerate_config, yaml_lines["fsdp_transformer_layer_cls_to_wrap"][0]
                setting = "fsdp_transformer_layer_cls_to_wrap"
            elif explicit and _spelled_in_arguments(argv, name):
                # a config file named on the script's command line (the HF Trainer's --fsdp_config fsdp.json)
                path, line = _spelled_in_arguments(argv, name)
            written = _written(plan, argv, name, path, options)
            flag = _flag_naming(argv, name)
            if flag is not None and not _spelled_in_arguments(argv, name):
                # the name is in an argument itself (`--fsdp_config '{"transformer_layer_cls_to_wrap": [...]}'`):
                # the launch command in the configuration, or the line that parses the command line
                script = getattr(settings, "launch_script", None)
                written = f"`{flag}` in {os.path.basename(script)}" if script else f"`{flag}` on the command line"
                entry = _script_line(script, name) or _entry_line(settings, name)
                path, line = entry if entry else (path, _parse_line(path) or line)
            desc = f"{setting}: {', '.join(err['names'])}"
            plan.policies.append(PolicyInfo(path, line, desc, [name], 0, setting=setting,
                                            framework=err["framework"], error=err["message"], written=written))


def _spelled_in_arguments(argv, name: str):
    """(path, line) where a file named in the script's arguments (``--fsdp_config fsdp.json``,
    ``--config=train.yaml``) spells the wrap-class `name`, or None."""
    import os

    from fsdp_lint.replay.frameworks.options import find_literal

    for arg in argv:
        candidate = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if candidate.startswith("-") or not os.path.isfile(candidate):
            continue
        spot = find_literal(candidate, name)
        if spot is not None:
            return candidate, spot[0]
    return None


def hf_frontend(argv, path: Optional[str], launch_script: Optional[str] = None) -> dict:
    """How the HF Trainer's FSDP settings are written: `how` is "flags" (`--fsdp ...` parsed by
    HfArgumentParser), "args_file" (a JSON/YAML file of arguments, `python train.py args.json`) or
    "python" (`TrainingArguments(fsdp=..., fsdp_config=...)`); `fsdp_config_file` the JSON file that
    `fsdp_config` names, `fsdp_flag` the `--fsdp` value as given, and transformers' major version
    (5 takes `--fsdp` and `fsdp_config` only: `--fsdp_transformer_layer_cls_to_wrap` is gone)."""
    import os
    import re

    def value(flag: str):
        found = None            # the last one counts, as with argparse
        for i, a in enumerate(argv):
            if a == flag:
                found = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
            elif a.startswith(flag + "="):
                found = a.split("=", 1)[1]
        return found

    def mentions_fsdp(candidate: str) -> bool:
        try:
            with open(candidate, encoding="utf-8") as fh:
                return "fsdp" in fh.read()
        except (OSError, UnicodeDecodeError):
            return False

    args_file = next((a for a in argv if not a.startswith("-") and a.endswith((".json", ".yaml", ".yml"))
                      and os.path.isfile(a) and mentions_fsdp(a)), None)
    flags = any(a == "--fsdp" or a.startswith(("--fsdp_", "--fsdp=")) for a in argv)
    config = value("--fsdp_config")
    how = "flags" if flags else "args_file" if args_file else "python"
    if how == "python" and path and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as fh:
                m = re.search(r"fsdp_config\s*=\s*[\"']([^\"']+\.json)[\"']", fh.read())
        except (OSError, UnicodeDecodeError):
            m = None
        if m:
            config = next((c for c in (m.group(1), os.path.join(os.path.dirname(path), m.group(1)))
                           if os.path.isfile(c)), None)
    try:
        from importlib.metadata import version

        major = int(version("transformers").split(".")[0])
    except Exception:  # noqa: BLE001 - not installed, or a version without a number
        major = 5
    config_file = config if isinstance(config, str) and os.path.isfile(config) else None
    inline = _json_object(config) if isinstance(config, str) and config.lstrip().startswith("{") else None
    return {"how": how, "args_file": args_file, "fsdp_flag": value("--fsdp"), "transformers_major": major,
            "fsdp_config_file": config_file, "fsdp_config_inline": inline,
            # the settings the config holds (inline or the file's), e.g. `min_num_params`, which transformers 4
            # refuses beside `transformer_layer_cls_to_wrap` ("mutually exclusive")
            "fsdp_config_values": inline if inline is not None else _json_file(config_file),
            "min_num_params_flag": value("--fsdp_min_num_params"),
            # the launch script the flags are written in, and the line of each FSDP flag there
            "launch_script": launch_script, "flag_lines": _flag_lines(launch_script) if launch_script else {}}


def _flag_lines(script: str) -> dict:
    """{flag: line} of the `--fsdp...` flags a launch script writes (the first line of each)."""
    import re

    try:
        with open(script, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict = {}
    for no, text in enumerate(lines, start=1):
        if text.lstrip().startswith("#"):
            continue
        for flag in re.findall(r"(?<![\w-])(--fsdp[\w-]*)", text):
            out.setdefault(flag, no)
    return out


def _json_object(text: str) -> Optional[dict]:
    import json

    try:
        out = json.loads(text)
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def _json_file(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return _json_object(fh.read())
    except (OSError, UnicodeDecodeError):
        return None


def _written(plan, argv, name: str, path: str, options) -> Optional[str]:
    """Where the front-end's setting that names `name` is written, in its words (None: accelerate's)."""
    import os

    if plan.framework != "transformers":
        return None
    front = plan.hf_frontend or {}
    if front.get("fsdp_config_file") and os.path.abspath(path) == os.path.abspath(front["fsdp_config_file"]):
        return f"the `transformer_layer_cls_to_wrap` key of {os.path.basename(path)} (the `fsdp_config` file)"
    if front.get("args_file") and os.path.abspath(path) == os.path.abspath(front["args_file"]):
        return f"`fsdp_config` of {os.path.basename(path)} (the Trainer's arguments file)"
    if front.get("how") == "python":
        return "`fsdp_config={\"transformer_layer_cls_to_wrap\": [...]}` of `TrainingArguments`"
    return None


def _flag_naming(argv, name: str) -> Optional[str]:
    """The flag whose value (the next argument, or after `=`) spells the class `name`, or None."""
    import re

    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")
    for i, a in enumerate(argv):
        flag, _, inline = a.partition("=") if a.startswith("--") else ("", "", "")
        if flag and inline and pattern.search(inline):
            return flag
        if a.startswith("--") and "=" not in a and i + 1 < len(argv) and pattern.search(argv[i + 1]):
            return a
    return None


def _script_line(script: Optional[str], name: str):
    """(script, line) where the launch script sets `name` (the flag's line, or the `VAR=...` it expands)."""
    from fsdp_lint.replay.frameworks.options import find_literal

    spot = find_literal(script, name) if script else None
    return (script, spot[0]) if spot else None


def _entry_line(settings, name: str):
    """(pyproject.toml, line) of the `[[tool.fsdp-lint.entry]]` arguments that spell `name`, or None."""
    from fsdp_lint.replay.frameworks.options import find_literal

    config = getattr(settings, "config_path", None)
    if not config or not getattr(settings, "entries", None):
        return None
    spot = find_literal(config, name)
    return (config, spot[0]) if spot else None


def _parse_line(path: str) -> Optional[int]:
    """The line of the linted file that parses the command line (`parser.parse_args_into_dataclasses()`)."""
    import re

    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, TypeError, UnicodeDecodeError):
        return None
    return next((i for i, t in enumerate(lines, start=1)
                 if re.search(r"\.parse_args(_into_dataclasses)?\(", t) and not t.lstrip().startswith("#")), None)
