"""Describing what torch raised: type, one-line message, the phase and the frame that raised it."""
from __future__ import annotations

import os
import traceback



def in_fsdp(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    # torch's memory trackers (--run on CPU, --simulate) are instrumentation, not FSDP
    return "/torch/distributed/" in norm and "/torch/distributed/_tools/" not in norm


def describe_exception(exc: BaseException, phase: str) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    # the frame that raised: the deepest one in the user's code or in torch.distributed (FSDP
    # itself), else the deepest that is not fsdp-lint's own or torch's dispatch plumbing
    shown = ([f for f in frames if not _is_library_file(f.filename) or in_fsdp(f.filename)]
             or [f for f in frames if not _is_plumbing(f.filename)] or frames)
    last = shown[-1] if shown else None
    user = None
    for f in reversed(frames):
        if not _is_library_file(f.filename):
            user = f
            break
    return {
        "type": type(exc).__name__,
        "message": one_line(str(exc)),
        "phase": phase,
        "frame": f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}" if last else None,
        "user_path": user.filename if user else None,
        "user_line": user.lineno if user else None,
        "in_fsdp": any(in_fsdp(f.filename) for f in frames),
    }


def _is_plumbing(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return "/fsdp_lint/" in norm or "/torch/distributed/_tools/" in norm or norm.endswith(
        ("/torch/_ops.py", "/torch/utils/_python_dispatch.py"))


def _is_library_file(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return filename.startswith("<") or any(s in norm for s in ("/site-packages/", "/dist-packages/", "/lib/python3",
                                                                "/fsdp_lint/"))


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def at_frame(err: dict) -> str:
    return f" (at {err['frame']})" if err.get("frame") else ""
