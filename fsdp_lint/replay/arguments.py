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
import re
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


# the flag of a data set's file (`--data_path`, `--train_file`, `data.train_files=`), of weights to start from
# (`--pretrained checkpoint.pt`, `--resume`): a node has them, and neither changes the plan
_DATA_FLAG = re.compile(r"data|train_file|eval_file|validation_file|test_file|corpus|trajector|pretrained|resume|ckpt|"
                        r"checkpoint|init_from|weights")
_WEIGHTS = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp")


def _read_by_a_data_set(exc: BaseException) -> bool:
    """The file was read while a ``torch.utils.data.Dataset`` was built (`--train_prompt_path captions.pkl` opened in
    the data set's ``__init__``): data a node has, whatever its flag is called."""
    import sys

    data = sys.modules.get("torch.utils.data")
    tb = exc.__traceback__
    while tb is not None and data is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), data.Dataset):
            return True
        tb = tb.tb_next
    return False


def names_an_unreadable_file(exc: BaseException, argv) -> bool:
    """Whether `exc` is a file named in the script's arguments `argv` (a config) that cannot be read: the
    launch command is wrong here, and skipping it would plan with defaults nobody launches. A data set's
    file (`--data_path traj.json`) or a checkpoint's (`--pretrained checkpoint.pt`) is not: a node has it,
    here it is missing data or weights."""
    name = getattr(exc, "filename", None)
    if not isinstance(exc, OSError) or not name or _read_by_a_data_set(exc):
        return False
    name = os.fspath(name)
    target = os.path.abspath(name)
    # `--config x.yaml`, `--config=x.yaml`, and OmegaConf/Hydra-style `config=x.yaml` that the
    # script opens by its absolute path (trials: lingua's `config=apps/main/configs/debug.yaml`)
    for i, a in enumerate(argv):
        if a == name or a.endswith("=" + name) or os.path.abspath(a) == target \
                or ("=" in a and os.path.abspath(a.split("=", 1)[1]) == target):
            flag = a.split("=", 1)[0] if "=" in a else (argv[i - 1] if i else "")
            return not (_DATA_FLAG.search(flag.lstrip("-+").lower()) or name.lower().endswith(_WEIGHTS))
    return False
