"""A re-run with nothing changed prints what the last run of the same command printed, before click
or any module of the pipeline is imported (pre-commit's common case: importing the classes of the
cached results, the report and click cost more than the rest of such a re-run).

The result cache (``fsdp_lint.cache``) keeps each file's result. Beside them, a command that ended
without an error keeps what it printed -- stdout, stderr, exit code -- under the command's own key:
fsdp-lint's version and source files, the interpreter, the working directory, the command line as
typed, and what the form of the output depends on (``NO_COLOR``/``FORCE_COLOR``, whether stdout and
stderr are terminals, the terminal's width). With it go the inputs the command computed from that
command line: the paths, the files they named or the walk found, the ``pyproject.toml`` each lookup
of the settings found (by content), the config files the settings name, and for each run its
settings and what decides its result (its key in the result cache and the files its lint imported,
or the reason the screen skipped it).

A re-run (``stored_output``) computes each of those again as the command would -- the same walk, the same
look-up of the settings, the same screen and key (``cache.run_key``), the imported files by content --
and prints the stored output only when every one is the same: the output is then the one the full
command would print for the same inputs. Anything else (a changed file, a new file in a walked
folder, an entry that cannot be read) goes to the full command line, which lints and stores afresh.

Stored only by a command that linted files, printed its report on stdout and ended with exit code 0
or 1, with the cache on: not under ``--no-cache``, ``-o``, ``--fix``, ``--diff``, ``--run``,
``--simulate``, ``--show-settings``, nor for ``--hf-config`` without paths.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from fsdp_lint.cli_paths import BadInput, collect_files, not_python, skipped_note, split_script_args

FORMAT = 1          # the layout of a stored output; a change makes older entries misses
_PREFIX = "out-"    # beside the results' keys in the cache folder (``Cache._path``: folder/ou/out-<key>)


def output_form() -> Dict[str, Any]:
    """What the bytes of an output depend on besides the results: colour, terminals, the width
    ``--layout diagram`` draws to."""
    import shutil

    return {"no_color": os.environ.get("NO_COLOR"), "force_color": os.environ.get("FORCE_COLOR"),
            "tty": [_isatty(sys.stdout), _isatty(sys.stderr)],
            "columns": shutil.get_terminal_size((120, 24)).columns, "columns_env": os.environ.get("COLUMNS")}


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a closed or replaced stream
        return False


def command_key(own: List[str], script_args: Optional[List[str]]) -> str:
    import hashlib
    import json

    from fsdp_lint.cache.key import own_code_digest
    from fsdp_lint.version import __version__

    data = {"format": FORMAT, "fsdp_lint": [__version__, own_code_digest()],
            "python": [sys.version, sys.executable], "cwd": os.getcwd(), "argv": [list(own), script_args],
            "form": output_form()}
    return _PREFIX + hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()


def _reads(runs) -> List[Tuple[str, Any]]:
    """(file, digest) of the config files the runs' settings were read from or name (and the launch script
    a run's arguments were read from: edited, the stored output is stale)."""
    from fsdp_lint.cache.key import dir_digest, file_digest

    paths = sorted({os.path.abspath(p) for _, settings, *_ in runs
                    for p in (settings.config_path, settings.accelerate_config, settings.hf_config,
                              getattr(settings, "launch_script", None)) if p})
    return [(p, dir_digest(p) if os.path.isdir(p) else file_digest(p)) for p in paths]


def _lookups(discovery) -> List[Tuple[str, Optional[str], Optional[str], Optional[str]]]:
    """For each (start, --config) the command looked the settings up from: the file found, its digest."""
    from fsdp_lint.cache.key import file_digest
    from fsdp_lint.config import find_pyproject

    out = []
    for start, explicit in discovery:
        found = explicit or find_pyproject(start)
        out.append((start, explicit, found, file_digest(found) if found else None))
    return out


def _tokens(runs) -> Optional[List[tuple]]:
    """What decides each run's result, computed as ``isolation.lint_runs`` records it; None when a
    run would not be linted from the cache (not Python, an error in the screen, a key that cannot be
    computed)."""
    from fsdp_lint import engine
    from fsdp_lint.cache.key import run_key
    from fsdp_lint.entry import project

    project.forget()     # as lint_runs: import resolution is remembered for this run's files only
    out = []
    for path, settings, argv, explicit, cwd in runs:
        if explicit and not_python(path):
            return None
        try:
            item = engine.screen(path, settings, explicit=explicit)
            if isinstance(item, engine.FileResult):
                out.append(("skip", item.skipped))
            else:
                out.append(("key", run_key(item, settings, argv, explicit, cwd)))
        except Exception:  # noqa: BLE001 - the full command reports it
            return None
    return out


def store(cache, own: List[str], script_args: Optional[List[str]], paths, files, discovery, runs,
          record: Dict[int, tuple], stdout: str, stderr: str, code: int) -> bool:
    """Keep what this command printed (`stdout` and `stderr` as written, `code`) in `cache`; `runs`
    as given to ``isolation.lint_runs`` and the `record` it filled; `discovery`: the (start, --config)
    pairs the settings were looked up from. False when a run has no record (nothing decided it from
    the cache) or the entry cannot be written."""
    if os.name == "nt" or len(record) != len(runs):
        return False
    entry = {"paths": list(paths), "files": list(files), "lookups": _lookups(discovery), "reads": _reads(runs),
             "runs": list(runs), "tokens": [record[i] for i in range(len(runs))],
             "stdout": stdout, "stderr": stderr, "code": code}
    try:
        return cache.put(command_key(own, script_args), entry)
    except Exception:  # noqa: BLE001 - the lint is unaffected
        return False


def _cache_dirs(own: List[str]) -> List[str]:
    """Where the command stored its output: ``--cache-dir``, else ``$FSDP_LINT_CACHE_DIR``, else next
    to the pyproject.toml found from the first path, the working directory or ``--config``, else in
    the working directory. (A guess that misses costs a full run, never a wrong output: an entry is
    found only under this command line's key and checked in full.)"""
    from fsdp_lint.cache.store import DEFAULT_DIR, ENV_DIR
    from fsdp_lint.config import find_pyproject

    for i, arg in enumerate(own):
        if arg == "--cache-dir" and i + 1 < len(own):
            return [own[i + 1]]
        if arg.startswith("--cache-dir="):
            return [arg.split("=", 1)[1]]
    if os.environ.get(ENV_DIR):
        return [os.environ[ENV_DIR]]
    roots = []
    first = next((a for a in own if not a.startswith("-")), None)
    for i, arg in enumerate(own):
        if arg == "--config" and i + 1 < len(own):
            roots.append(os.path.dirname(os.path.abspath(own[i + 1])))
    for start in ([first] if first and os.path.exists(first) else []) + [os.getcwd()]:
        found = find_pyproject(start)
        if found:
            roots.append(os.path.dirname(os.path.abspath(found)))
    roots.append(os.getcwd())
    return list(dict.fromkeys(os.path.join(r, DEFAULT_DIR) for r in roots))


def stored_output(argv: List[str]) -> Optional[Tuple[str, str, int]]:
    """The stored stdout, stderr and exit code of this command line, or None when there is none or
    any input it was computed from changed."""
    if os.name == "nt" or "FSDP_LINT_NO_CACHE" in os.environ:
        return None
    own, script_args = split_script_args(argv)
    if any(a in ("--no-cache", "--help", "-h", "--version") for a in own):
        return None
    from fsdp_lint.cache.store import Cache

    key = command_key(own, script_args)
    entry = None
    for directory in _cache_dirs(own):
        if os.path.isfile(Cache(directory)._path(key)):
            entry = Cache(directory).get(key)
            break
    if not _valid(entry):
        return None
    return entry["stdout"], entry["stderr"], entry["code"]


def _valid(entry) -> bool:
    if not isinstance(entry, dict):
        return False
    try:
        missing: List[str] = []
        # no paths: the files are the launch commands of the configuration, checked by its content
        if entry["paths"] and (collect_files(entry["paths"], missing) != entry["files"] or missing):
            return False
        if _lookups([(start, explicit) for start, explicit, _, _ in entry["lookups"]]) != entry["lookups"]:
            return False
        if _reads(entry["runs"]) != entry["reads"]:
            return False
        tokens = _tokens(entry["runs"])
        if tokens is None or len(tokens) != len(entry["tokens"]):
            return False
        from fsdp_lint.cache.key import file_digest

        for now, then in zip(tokens, entry["tokens"]):
            if now != tuple(then[:2]):
                return False
            if then[0] == "key" and any(file_digest(p) != d for p, d in then[2]):
                return False
    except Exception:  # noqa: BLE001 - an entry of another shape: the full command line decides
        return False
    return True


# --- a command whose files are all plain ------------------------------------------------------------
#
# ``fsdp-lint DIR`` on a folder of utilities, or pre-commit's ``fsdp-lint a.py b.py`` on a commit that
# touched no model, screens files and skips them all: the report is one line. ``plain_output`` does
# what the command line does for such a command -- the same walk, settings, checks of them, screen
# (``engine.screen``), notes and report (``report.text``) -- without importing click or the
# command line, and gives up (None: the full command line decides) at the first thing that is not
# that case: an option it does not read here, a file that is linted or cannot be, a setting that is
# wrong, a message it would have to print otherwise than as given. The screens it made go to the full
# command line (``engine.SCREENED``), which does not make them again. It does not write the result
# cache (nothing it does would be served from there any faster).

_FLAGS = {"--quiet": "quiet", "-q": "quiet", "--no-cache": None, "--exit-zero": None}
_VALUED = {"--format": "fmt", "--output-format": "fmt", "--world-size": "world_size", "-n": "world_size",
           "--fail-on": "fail_on"}
_CHOICES = {"fmt": ("full", "concise"), "fail_on": ("info", "warning", "error")}
# what click reads as true and false in FSDP_LINT_NO_CACHE (``--no-cache``'s variable); anything else
# is click's error to report
_BOOL_WORDS = {"", "0", "1", "f", "false", "n", "no", "off", "on", "t", "true", "y", "yes"}


def _plain_options(own: List[str]) -> Optional[Dict[str, Any]]:
    """The options of a command line that ``plain_output`` reads, or None."""
    opts: Dict[str, Any] = {"paths": [], "quiet": False, "fmt": "full", "world_size": None, "fail_on": None}
    it = iter(own)
    for arg in it:
        name, eq, value = arg.partition("=")
        if arg in _FLAGS:
            if _FLAGS[arg]:
                opts[_FLAGS[arg]] = True
        elif arg in _VALUED or (eq and name.startswith("--") and name in _VALUED):
            key = _VALUED[name if eq else arg]
            value = value if eq else next(it, None)
            if value is None:
                return None
            if key == "world_size":
                try:
                    value = int(value)        # as click's INT reads it
                except ValueError:
                    return None
                if not 1 <= value <= (1 << 20):
                    return None
            elif value not in _CHOICES[key]:
                return None
            opts[key] = value
        elif arg.startswith("-") or not arg:
            return None
        else:
            opts["paths"].append(arg)
    return opts


def plain_output(argv: List[str]) -> Optional[Tuple[str, str, int]]:
    """The stdout, stderr and exit code of a command line whose files are all skipped by the screen,
    as the full command line prints them; None for any other command."""
    own, script_args = split_script_args(argv)
    opts = _plain_options(own) if script_args is None else None
    if opts is None or os.environ.get("FSDP_LINT_NO_CACHE", "").strip().lower() not in _BOOL_WORDS:
        return None
    from fsdp_lint.config import ConfigError, load_settings, validate

    paths = opts["paths"]
    try:
        if not paths:
            if load_settings(os.getcwd()).entries:
                return None
            paths = ["."]               # ruff's default: the current directory
        missing: List[str] = []
        files = collect_files(paths, missing)
        if missing or not files:
            return None
        base = load_settings(files[0][0])
        if base.entries:
            return None
        settings = base.with_overrides(world_size=opts["world_size"], fail_on=opts["fail_on"],
                                       world_size_source="--world-size" if opts["world_size"] is not None else None)
        from fsdp_lint.check.selection import check_all_selectors

        validate(settings)
        check_all_selectors(settings)
    except (ConfigError, BadInput):
        return None
    if settings.model or any(explicit and not_python(path) for path, explicit in files):
        return None
    from fsdp_lint import engine
    from fsdp_lint.entry import project

    project.forget()     # as lint_runs
    engine.SCREENED = screened = {}
    results, notes = [], []
    for path, explicit in files:
        try:
            res = engine.screen(path, settings, explicit=explicit)
        except Exception:  # noqa: BLE001 - reported by the full command line
            return None
        if not isinstance(res, engine.FileResult):
            return None               # to be linted
        screened[(path, explicit)] = res
        results.append(res)
        if explicit and not opts["quiet"]:
            notes.append(skipped_note(path, res.skipped) + "\n")
    from fsdp_lint.cli_paths import use_color
    from fsdp_lint.humanize import use_size_units
    from fsdp_lint.report.text import render_text

    use_size_units(settings)
    color = use_color(None)
    text = render_text(results, full=opts["fmt"] == "full", color=color, fixes={"unsafe": False})
    err = "".join(notes)
    # click.echo would strip escape codes off a stream that is no terminal, and re-encode a stream
    # that cannot take UTF-8: none of that here
    if not (text + err).isascii() or "\x1b" in text + err:
        return None
    engine.SCREENED = None
    return text, err, 0
