"""The key of one lint run: everything its result depends on, read without importing torch.

A run's result (the FileResult a child process builds) is a function of

* fsdp-lint itself: its version and its own source files (an editable install changes under it);
* the interpreter: ``sys.version``, ``sys.executable``, ``sys.path`` and the working directories
  (the process's and the run's: relative paths in the script resolve against them);
* the installed distributions: every ``*.dist-info`` / ``*.egg-info`` name on ``sys.path`` -- torch's
  and the frameworks' versions among them. Listing the folders costs one ``os.listdir`` per path entry;
  mapping import names to distributions would cost ``importlib.metadata.packages_distributions()``
  (0.7 s here), so any install or upgrade in the environment invalidates every entry, which never
  serves a stale result;
* the code that runs: the entry file and every project module it reaches (``entry.project.reach``),
  by content, and the modules that could not be read;
* how it is run: the script's argv, whether the file was named on the command line, the settings;
* the files it reads: the pyproject.toml the settings came from, ``--accelerate-config``,
  ``--hf-config``, files and folders named in argv (``--config configs/8b.yaml``, ``conf=dir``) and
  string literals in the reached modules that name an existing path (``"configs/model.yaml"``,
  Hydra's ``config_path="conf"``), by content;
* the environment variables the code can read: those the reached modules name in a string literal
  (``os.environ["MODEL_SIZE"]``) and those of the libraries under it (``TORCH_*``, ``HF_*``, ...).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import re
import sys
from typing import Any, Iterable, List, Optional, Set, Tuple

from fsdp_lint.version import __version__

FORMAT = 2    # the layout of an entry; a change starts a new cache folder

# environment variables that torch, the frameworks or the launch read
_ENV_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "NCCL", "HF_", "HUGGINGFACE", "TRANSFORMERS", "ACCELERATE",
                 "FSDP", "LIGHTNING", "PL_", "PYTHON", "OMP_", "MKL_", "KMP_", "TOKENIZERS", "SAFETENSORS",
                 "DATASETS", "WANDB_MODE", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK")
_LITERAL = re.compile(r"""(?:"([^"\\\n]{1,300})"|'([^'\\\n]{1,300})')""")
_CONFIG_EXT = (".yaml", ".yml", ".json", ".toml", ".ini", ".cfg", ".txt", ".py", ".conf", ".jsonl")
_MAX_DIR_FILES = 400
_MAX_HASHED_BYTES = 4 << 20   # bigger files (weights) count by size and modification time


class Uncacheable(Exception):
    """A run whose key cannot be known without running it: linted as without a cache."""


def _h(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_digest(path: str) -> str:
    """A file's content hash; a large file's size and modification time (weights, data shards)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):     # a FIFO or device named in argv would block open() for ever
            return f"not-a-file:{stat.S_IFMT(st.st_mode)}"
        if st.st_size > _MAX_HASHED_BYTES:
            return f"size={st.st_size},mtime={st.st_mtime_ns}"
        with open(path, "rb") as fh:
            return _h(fh.read())
    except OSError as exc:
        return f"unreadable:{type(exc).__name__}"


def dir_digest(path: str) -> List[Tuple[str, str]]:
    """(relative file, digest) for the config-like files under a folder (a Hydra ``conf/``, a local
    model folder), a few levels deep."""
    out: List[Tuple[str, str]] = []
    base_depth = path.rstrip(os.sep).count(os.sep)
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        if dirpath.count(os.sep) - base_depth >= 3:
            dirnames[:] = []
        for name in sorted(filenames):
            if name.endswith(_CONFIG_EXT) or name.endswith((".safetensors", ".bin", ".model")):
                full = os.path.join(dirpath, name)
                out.append((os.path.relpath(full, path), file_digest(full)))
                if len(out) >= _MAX_DIR_FILES:
                    out.append(("...", "truncated"))
                    return out
    return out


_OWN: Optional[str] = None


def own_code_digest() -> str:
    """fsdp-lint's own source files (name, size, modification time): a rule edited in a development
    install is a new linter."""
    global _OWN
    if _OWN is None:
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        roots = [pkg]
        import importlib.util

        # the rules are installed as fsdp_lint.rules from rules/ (a folder of its own in a checkout);
        # found without running the package
        spec = importlib.util.find_spec("fsdp_lint.rules")
        if spec is not None and spec.submodule_search_locations:
            roots += [os.path.abspath(p) for p in spec.submodule_search_locations if os.path.abspath(p) != pkg]
        rows = []
        for root in roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        st = os.stat(os.path.join(dirpath, name))
                        rows.append(f"{os.path.join(dirpath, name)}:{st.st_size}:{st.st_mtime_ns}")
        _OWN = _h("\n".join(rows).encode())
    return _OWN


def installed_distributions() -> List[str]:
    """``name-version`` of every distribution on ``sys.path`` (torch, the frameworks and the rest),
    from the folder names alone (nothing is imported or read)."""
    out: Set[str] = set()
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                out.add(f"{entry}/{name}")
    return sorted(out)


def _literals(text: str) -> Iterable[str]:
    for m in _LITERAL.finditer(text):
        yield m.group(1) if m.group(1) is not None else m.group(2)


def _argv_paths(argv: Iterable[str]) -> Iterable[str]:
    for arg in argv:
        yield arg
        if "=" in arg:
            yield arg.split("=", 1)[1]


def _read_paths(candidates: Iterable[str], bases: List[str], skip: Set[str]) -> List[Tuple[str, Any]]:
    """Digests of the existing files and folders among `candidates` (absolute, or relative to one of
    `bases`); the folders in `skip` (the working directories, the modules' folders) are not walked."""
    out: List[Tuple[str, Any]] = []
    seen: Set[str] = set()
    for cand in candidates:
        if not cand or cand.isspace() or len(cand) > 300 or "\x00" in cand or cand in (".", "..", "/", "~"):
            continue
        for base in ([""] if os.path.isabs(cand) else bases):
            full = os.path.normpath(os.path.join(base, os.path.expanduser(cand)))
            if full in seen:
                continue
            if os.path.isfile(full):
                seen.add(full)
                out.append((full, file_digest(full)))
            elif os.path.isdir(full) and full not in skip and os.path.dirname(full) != full:
                seen.add(full)
                out.append((full, dir_digest(full)))
    return out


def _settings_data(settings) -> Any:
    try:
        return dataclasses.asdict(settings)
    except TypeError:
        return repr(settings)


def run_key(screened, settings, argv: Optional[List[str]], explicit: bool, cwd: Optional[str]) -> str:
    """The key of linting a screened file (``engine.Screened``: its facts and the project it reaches)
    with these settings and argv, from `cwd` (None: this process's)."""
    facts, project = screened.facts, screened.project
    modules = dict(project.modules) if project is not None else {facts.path: facts}
    model_files: List[Tuple[str, str]] = []
    if settings.model:    # --model path.py:Class: that file and what it reaches are code that runs
        target = settings.model.split(":", 1)[0]
        if not target.endswith(".py"):
            raise Uncacheable("--model names a module, not a file")   # its file is found only by importing
        from fsdp_lint.entry.project import reach

        full = os.path.join(os.path.abspath(cwd) if cwd else os.getcwd(), target)
        for path, other in reach(full).modules.items():
            model_files.append((os.path.abspath(path), _h(other.text.encode("utf-8", "surrogatepass"))))
    process_cwd = os.getcwd()
    run_cwd = os.path.abspath(cwd) if cwd else process_cwd
    module_dirs = sorted({os.path.dirname(os.path.abspath(p)) for p in modules})
    texts = [f.text for f in modules.values()]

    names: Set[str] = set()
    for text in texts:
        names.update(_literals(text))
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in names}

    bases = [run_cwd, process_cwd] + module_dirs
    skip = set(bases)
    configs = []
    for extra in (settings.config_path, settings.accelerate_config, settings.hf_config):
        if extra:
            full = os.path.abspath(extra)
            configs.append((full, dir_digest(full) if os.path.isdir(full) else file_digest(full)))
    configs += _read_paths(_argv_paths(argv or []), [run_cwd], set())
    configs += _read_paths(sorted(names), bases, skip)

    data = {
        "format": FORMAT,
        "fsdp_lint": [__version__, own_code_digest()],
        "python": [sys.version, sys.executable, list(sys.path), process_cwd, run_cwd],
        "distributions": installed_distributions(),
        "entry": [os.path.abspath(facts.path), explicit],
        "modules": sorted((os.path.abspath(p), _h(f.text.encode("utf-8", "surrogatepass"))) for p, f in modules.items()),
        "model_files": sorted(model_files),
        "unreadable": sorted((project.unreadable if project is not None else {}).items()),
        "argv": list(argv) if argv is not None else None,
        "settings": _settings_data(settings),
        "configs": configs,
        "env": sorted(env.items()),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()
