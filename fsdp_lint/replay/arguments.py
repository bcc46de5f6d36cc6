"""Failures raised while the script's arguments are parsed: the launch is refused, never skipped.

``HfArgumentParser`` builds the script's argument dataclasses, and their ``__post_init__`` checks the
arguments (``raise ValueError("Need either a dataset name or a training/validation file.")``); argparse
calls ``type=`` converters. Such a failure is the script refusing its command line, as ``python
train.py ARGS`` would: skipping it would lint a plan built from arguments the script rejects (and the
error would name a later consequence, ``'NoneType' object has no attribute 'split'``).

Only parsers that never call the script's main function count: jsonargparse's ``CLI(main)``, fire,
click, typer and Hydra run the whole script inside their frames.
"""
from __future__ import annotations

import os
import shlex
from typing import Optional

# (package folder, file) of argument parsers whose frames mean "the arguments are being parsed"
_PARSER_FILES = (("transformers", "hf_argparser.py"), ("", "argparse.py"))


def _is_parser_file(fname: str) -> bool:
    parts = os.path.abspath(fname).split(os.sep)
    return any(parts[-1] == base and (not pkg or (len(parts) > 1 and parts[-2] == pkg))
               for pkg, base in _PARSER_FILES)


def while_parsing(exc: BaseException, frame=None) -> bool:
    """Whether `exc` was raised while an argument parser was parsing: its traceback passes through the
    parser, or the statement running in `frame` was called by it (a ``__post_init__``)."""
    tb = exc.__traceback__
    while tb is not None:
        if _is_parser_file(tb.tb_frame.f_code.co_filename):
            return True
        tb = tb.tb_next
    f = frame.f_back if frame is not None else None
    while f is not None:
        if _is_parser_file(f.f_code.co_filename):
            return True
        f = f.f_back
    return False


def describe(exc: BaseException, loc: str, argv, display: str, one_line) -> Optional[str]:
    """The one-line error for a failure raised while parsing, or None for any other failure."""
    if not while_parsing(exc):
        return None
    args = shlex.join(argv) if argv else "(none)"
    # with arguments given (a launch script's, `-- ARGS`), the parser refuses those: as on a node
    hint = "" if argv else f" (pass the script's own arguments after --: fsdp-lint {display} -- ARGS)"
    return (f"{loc}: the script's arguments were refused while they were parsed (arguments {args}): "
            f"{one_line(exc)}{hint}")
