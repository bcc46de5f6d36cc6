"""The command that puts a hub file in the local Hugging Face cache, written for the huggingface_hub installed here.

The hints fsdp-lint gives when a node's download is not here are commands a user pastes, so they must run as
written: huggingface_hub 0.34 brought the ``hf`` command and 1.0 removed ``huggingface-cli``; before 1.0 the
``download`` command's ``--include`` takes several patterns after one flag, from 1.0 (typer) one pattern per
flag, and a pattern beside file names is ignored in both (the files alone are downloaded).
"""
from __future__ import annotations

import os
import re
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


def is_hub_id(name: str) -> bool:
    """``org/name`` or ``name`` as the hub spells a repository; a path of more parts (``output/models/vae``)
    or a relative or absolute one is a folder of this machine's."""
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(name)
        return True
    except ImportError:
        return name.count("/") <= 1 and not name.startswith((".", "/", "~"))
    except Exception:       # HFValidationError
        return False


# the hub's models of the time before owners (`gpt2`, `bert-base-uncased`, `t5-small`): still served under a bare name
_LEGACY = re.compile(r"^(gpt2(-medium|-large|-xl)?|distilgpt2|(distil)?bert-|roberta-|distilroberta-|xlm-|xlnet-|t5-|"
                     r"albert-|ctrl$|openai-gpt$|bart-)")


def bare_name(name: str) -> Optional[str]:
    """What a bare name (no owner: ``Qwen2.5-3B-Instruct``) that is no folder here is, in words -- a folder the node
    has where the job starts (the README's download into the working folder), not a hub id, which has an owner
    (``Qwen/Qwen2.5-3B-Instruct``) -- or None for any other name."""
    if "/" in name or os.sep in name or not name or name.startswith((".", "~")) or _LEGACY.match(name) or \
            not is_hub_id(name):
        return None
    return (f"no folder {name!r} here: a name without an owner is a folder the node has where the job starts (a "
            f"model downloaded there first), not a hub model (those are `owner/{name}`); this machine does not "
            f"have it")

