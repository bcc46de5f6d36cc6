"""Failures whose cause is an input this machine lacks: a file or folder, a hub download, the network.

Such a failure is its own cause. It is not the consequence of an earlier skipped statement that merely
shared a config object with it (``Tracker(args)`` skipped, then ``AutoConfig.from_pretrained(args.llm_path)``
finds no config here: the config is what is missing), and no library version explains it (a pinned
transformers does not create ``$model_path/llm_config.json`` either).
"""
from __future__ import annotations

import errno
import re

# an installed library's words for a model, file or folder that is not there (transformers' OSError of a hub
# id that is neither a local folder nor downloadable, huggingface_hub's errors of a file not on the hub)
_NOT_THERE = re.compile(
    r"is not a local folder and is not a valid model identifier|does not appear to have a file named|"
    r"Can't load (the )?(config|tokenizer|model|configuration)|We couldn't connect to|"
    r"Repository Not Found|EntryNotFound|LocalEntryNotFound|No such file or directory|Repo id must|"
    r"Incorrect path_or_model_id|"
    r"(file|folder|directory|path|checkpoint) .{0,80}(does not exist|doesn't exist|not found)",
    re.IGNORECASE)


def missing_input(exc: BaseException) -> bool:
    """Whether `exc` says that a file, a folder, a download or the network is not here (through its causes:
    transformers' OSError raised from huggingface_hub's LocalEntryNotFoundError)."""
    from fsdp_lint.replay.network import NetworkWait, NotDownloaded, network_ask

    todo, seen = [exc], 0
    while todo and seen < 8:
        e = todo.pop()
        seen += 1
        if isinstance(e, (NotDownloaded, NetworkWait, FileNotFoundError, NotADirectoryError)):
            return True
        if isinstance(e, OSError) and (e.errno == errno.ENOENT or _NOT_THERE.search(str(e))):
            return True
        if type(e).__name__ in ("LocalEntryNotFoundError", "EntryNotFoundError", "RepositoryNotFoundError",
                                "RevisionNotFoundError", "GatedRepoError", "OfflineModeIsEnabled",
                                "HFValidationError"):       # (a placeholder path: `$model_path/llm`)
            return True
        # (`raise OSError(...) from err`, or an OSError raised while handling one; not any failure that
        # happened to be raised inside an `except FileNotFoundError:`, which may be the script's own check)
        todo += [x for x in (e.__cause__, e.__context__ if isinstance(e, OSError) else None)
                 if isinstance(x, BaseException)]
    return network_ask(exc) is not None
