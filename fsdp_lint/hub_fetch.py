"""``--fetch-configs``: fetch the hub files a node downloads at setup that a lint stopped on, then lint again.

A replay never reaches the network (the simulated node has none, `fsdp_lint.replay.network`): a model or
tokenizer named by its hub id that is not in the local Hugging Face cache ends the lint with one line that gives
the ``hf download`` command putting it there (`fsdp_lint.replay.hub_commands`). With ``--fetch-configs``
(``fetch-configs = true``) fsdp-lint runs that download itself -- in a child process of its own, with a time
limit, outside the linted code -- and lints the file again, up to `MAX_FETCHES` times a file. Only what a setup
reads besides weights is fetched: configs, tokenizer files and a model's own code (`SETUP_FILES`); a hint
that names a weights file or a data set is left as the error it is. ``HF_HUB_OFFLINE=1`` in the user's
environment is respected: nothing is fetched and the error says so.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Callable, List, Optional

from fsdp_lint.replay.hub_commands import RERUN_HINT, SETUP_FILES

MAX_FETCHES = 4
FETCH_TIMEOUT = 300.0       # seconds for one repository's setup files

_COMMAND = re.compile(r"`((?:hf|huggingface-cli) download [^`]+)`")


class FetchRefused(Exception):
    """What stopped a fetch, in one line (offline, a gated repository, a weights file, the network)."""


def requested(message: str) -> Optional[dict]:
    """The download an error's hint gives (``hf download REPO [FILES] [--include P ...] [--revision R]
    [--repo-type T]``, as `hub_commands.download_command` writes it), or None."""
    m = _COMMAND.search(message)
    if m is None:
        return None
    try:
        words = shlex.split(m.group(1))[2:]
    except ValueError:          # (not a command this module wrote)
        return None
    if not words:
        return None
    asked = {"repo": words[0], "files": [], "include": [], "revision": None, "repo_type": None}
    i = 1
    while i < len(words):
        word = words[i]
        if word == "--include":
            i += 1
            while i < len(words) and not words[i].startswith("--"):
                asked["include"].append(words[i])
                i += 1
            continue
        if word in ("--revision", "--repo-type") and i + 1 < len(words):
            asked["revision" if word == "--revision" else "repo_type"] = words[i + 1]
            i += 2
            continue
        asked["files"].append(word)
        i += 1
    return asked


def _refusal(asked: dict) -> Optional[str]:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set in this environment"
    if asked["repo_type"] not in (None, "model"):
        return f"it is a {asked['repo_type']} repository (--fetch-configs fetches a model's configs and tokenizer only)"
    setup = [f for f in asked["files"] if not any(fnmatch.fnmatch(os.path.basename(f), p) for p in SETUP_FILES)]
    if setup:
        return f"{setup[0]} is not a config, tokenizer or code file (--fetch-configs never fetches weights or data)"
    return None


def fetch(asked: dict, timeout: float = FETCH_TIMEOUT) -> None:
    """Fetch what `asked` names into the local Hugging Face cache, in a child process. Raises FetchRefused."""
    why = _refusal(asked)
    if why:
        raise FetchRefused(why)
    job = dict(asked, include=[p for p in (asked["include"] or SETUP_FILES) if p in SETUP_FILES] or list(SETUP_FILES))
    try:
        done = subprocess.run([sys.executable, "-m", "fsdp_lint.hub_fetch", json.dumps(job)], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FetchRefused(f"the hub did not answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise FetchRefused(f"the download could not start ({exc})") from None
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).strip().splitlines() if line.strip()]
        raise FetchRefused(lines[-1] if lines else f"the download ended with exit code {done.returncode}")


def with_fetches(outcome: Callable, relint: Callable, lint_error: type) -> Callable:
    """`outcome` (a file's lint, a callable that returns its result or raises `lint_error`) with the hub files
    its error names fetched and the file linted again (`relint()`, the same kind of callable), until it needs
    nothing more, `MAX_FETCHES` times at most."""
    def run():
        fetched: List[str] = []
        current = outcome
        while True:
            try:
                res = current()
            except lint_error as exc:
                asked = requested(str(exc))
                if asked is None or len(fetched) >= MAX_FETCHES or asked in fetched:
                    raise
                try:
                    fetch(asked)
                except FetchRefused as why:
                    said = str(exc).replace(RERUN_HINT, "")      # (it was rerun so: it did not help)
                    raise lint_error(f"{said} (--fetch-configs did not fetch it: {why})") from None
                fetched.append(asked)
                current = relint
                continue
            notes = getattr(res, "notes", None)
            if isinstance(notes, list):
                notes.extend(f"--fetch-configs fetched {_described(a)} into the local Hugging Face cache (no weights)"
                             for a in fetched)
            return res
    return run


def _described(asked: dict) -> str:
    what = ", ".join(asked["files"]) if asked["files"] else "the configs and tokenizer"
    return f"{what} of {asked['repo']}{' at revision ' + asked['revision'] if asked['revision'] else ''}"


def _main(argv: List[str]) -> int:
    """The child: one repository's files, with huggingface_hub (its own retries, auth and cache)."""
    job = json.loads(argv[0])
    try:
        from huggingface_hub import hf_hub_download, snapshot_download

        kind = job["repo_type"] or "model"
        if job["files"]:
            for name in job["files"]:
                hf_hub_download(job["repo"], name, repo_type=kind, revision=job["revision"])
        else:
            snapshot_download(job["repo"], allow_patterns=job["include"], repo_type=kind, revision=job["revision"])
    except Exception as exc:  # noqa: BLE001 - one line for the parent's error
        text = " ".join(str(exc).split())
        first = text.split(". ")[0]       # (huggingface_hub's messages go on with advice for its own API)
        print(f"{type(exc).__name__}: {first[:240]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
