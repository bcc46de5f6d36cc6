"""The cache folder: one pickled result per key, written atomically, oldest entries pruned.

Layout (ruff's): ``DIR/<format>-<fsdp-lint version>/<key[:2]>/<key>``, with a ``CACHEDIR.TAG`` and a
``.gitignore`` of ``*`` at the top so that backups and git leave it alone. A file that cannot be
read back (an older pickle, a disk that filled up mid-write) is a miss and is removed."""
from __future__ import annotations

import contextlib
import gc
import os
import pickle
from typing import Any, Optional

from fsdp_lint.cache.key import FORMAT
from fsdp_lint.version import __version__

DEFAULT_DIR = ".fsdp_lint_cache"
ENV_DIR = "FSDP_LINT_CACHE_DIR"
MAX_ENTRIES = 1000     # beyond this, or MAX_BYTES, the least recently used entries go
MAX_BYTES = 512 << 20  # (the 70B-shaped model's result is about 0.4 MB)
_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# This file is a cache directory tag created by fsdp-lint.\n"
        "# For information about cache directory tags, see: https://bford.info/cachedir/\n")


def default_dir(config_path: Optional[str]) -> str:
    """``$FSDP_LINT_CACHE_DIR``, else ``.fsdp_lint_cache`` next to the pyproject.toml the settings
    came from (the project root), else in the current directory."""
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    root = os.path.dirname(os.path.abspath(config_path)) if config_path else os.getcwd()
    return os.path.join(root, DEFAULT_DIR)


class Cache:
    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.folder = os.path.join(self.directory, f"{FORMAT}-{__version__}")
        self.hits = 0
        self.misses = 0
        self.writes = 0

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, key[:2], key)

    def get(self, key: str) -> Optional[Any]:
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            self.misses += 1
            return None
        enabled = gc.isenabled()
        gc.disable()         # unpickling a large result creates many objects: no collections meanwhile
        try:
            value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - any unreadable entry is a miss
            with contextlib.suppress(OSError):
                os.unlink(path)
            self.misses += 1
            return None
        finally:
            if enabled:
                gc.enable()
        with contextlib.suppress(OSError):
            os.utime(path)          # recently used: pruned last
        self.hits += 1
        return value

    def put(self, key: str, value: Any) -> bool:
        """Store `value`; False when it cannot be (a read-only folder, an unpicklable result): the
        lint is unaffected."""
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001
            return False
        import tempfile     # only when writing: a run of cache hits never needs it

        path = self._path(key)
        try:
            self._prepare()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return False
        self.writes += 1
        return True

    def _prepare(self) -> None:
        if os.path.isdir(self.folder):
            return
        os.makedirs(self.folder, exist_ok=True)
        for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", "# created by fsdp-lint\n*\n")):
            target = os.path.join(self.directory, name)
            if not os.path.exists(target):
                with contextlib.suppress(OSError), open(target, "w", encoding="utf-8") as fh:
                    fh.write(text)

    def prune(self, keep: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        """Remove the least recently used entries beyond `keep` entries or `max_bytes` in all (only
        after a run that wrote some)."""
        if not self.writes or not os.path.isdir(self.folder):
            return
        entries = []
        for sub in os.listdir(self.folder):
            d = os.path.join(self.folder, sub)
            if os.path.isdir(d):
                for name in os.listdir(d):
                    p = os.path.join(d, name)
                    with contextlib.suppress(OSError):
                        st = os.stat(p)
                        entries.append((st.st_mtime, st.st_size, p))
        entries.sort(reverse=True)      # newest first: kept
        total = 0
        for i, (_, size, p) in enumerate(entries):
            total += size
            if i >= keep or total > max_bytes:
                with contextlib.suppress(OSError):
                    os.unlink(p)
