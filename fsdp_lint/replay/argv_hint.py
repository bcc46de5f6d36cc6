"""A setup failure of a script that reads its command line and was linted without arguments.

``fsdp-lint scripts/train.py`` on a script launched as ``train.py CONFIG_PATH [OPTIONS]`` (OLMo) or
``train.py config=PATH`` (OmegaConf ``from_cli``, lingua) fails in the script's own argument handling
-- ``OLMoCliError: Usage: ...``, ``ConfigAttributeError: Missing key config`` -- not in an argument
parser that fsdp-lint recognises. The failure is the cause; the hint says how to give the arguments.
"""
from __future__ import annotations

import os
import re
import traceback
from typing import List

from fsdp_lint.entry.project import is_local

# what a script reads its command line with (besides argparse/click/typer/fire, whose own messages
# the replay already turns into "the script's argument parser stopped it")
_READS_ARGV = re.compile(r"\bsys\.argv\b|\bfrom_cli\s*\(|\bparse_args\s*\(|\bparse_known_args\s*\(")


def argv_hint(exc: BaseException, entry_path: str, argv: List[str], display: str) -> str:
    """" (the script ran without arguments: ...)" when `exc` ended a replay of `entry_path` run with
    no arguments, and a file of the project that the failure went through (the entry, a settings
    helper) reads the command line; else ""."""
    if argv or isinstance(exc, ImportError) or "not installed" in str(exc):
        return ""
    files = {os.path.abspath(f.filename) for f in traceback.extract_tb(exc.__traceback__)}
    entry = os.path.abspath(entry_path)
    if entry not in files:
        return ""
    for path in sorted(files):
        if path != entry and not is_local(path):
            continue
        try:
            with open(path, encoding="utf-8-sig") as fh:
                if _READS_ARGV.search(fh.read()):
                    return (f" (the script ran without arguments: pass those of a real launch after --: "
                            f"fsdp-lint {display} -- ARGS)")
        except OSError:
            continue
    return ""
