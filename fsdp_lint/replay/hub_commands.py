"""The command that puts a hub file in the local Hugging Face cache, written for the huggingface_hub installed here.

The hints fsdp-lint gives when a node's download is not here are commands a user pastes, so they must run as
written: huggingface_hub 0.34 brought the ``hf`` command and 1.0 removed ``huggingface-cli``; before 1.0 the
``download`` command's ``--include`` takes several patterns after one flag, from 1.0 (typer) one pattern per
flag, and a pattern beside file names is ignored in both (the files alone are downloaded).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

# what a setup reads of a model repository besides its weights: the config, the tokenizer's files (JSON,
# sentencepiece `.model`, BPE merges and vocabularies `.txt`, tiktoken), the model's own code (trust_remote_code)
SETUP_FILES = ("*.json", "*.model", "*.txt", "*.tiktoken", "*.py")


def _installed_version() -> Optional[Tuple[int, int]]:
    try:
        from importlib.metadata import version

        parts = version("huggingface_hub").split(".")
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except Exception:               # not installed, or a version string of another shape
        return None


def download_command(repo: str, files: Sequence[str] = (), include: Sequence[str] = (), repo_type: Optional[str] = None,
                     revision: Optional[str] = None) -> str:
    """``hf download org/name config.json`` (or ``huggingface-cli download ...`` before huggingface_hub 0.34),
    with `files` by name, else the `include` patterns in the installed CLI's syntax."""
    installed = _installed_version()
    words = ["hf" if installed is None or installed >= (0, 34) else "huggingface-cli", "download", repo, *files]
    if include and not files:
        quoted = [f"'{p}'" for p in include]
        if installed is None or installed >= (1, 0):
            words += [w for q in quoted for w in ("--include", q)]
        else:
            words += ["--include", *quoted]
    if revision and revision != "main":
        words += ["--revision", revision]
    if repo_type and repo_type != "model":
        words += ["--repo-type", repo_type]
    return " ".join(words)

# the hint an error names the download with (removed where --fetch-configs was given and could not fetch it)
RERUN_HINT = " (or rerun with --fetch-configs)"
