"""What a user launches who follows an HF Trainer fix text (shared by the front-end text tests)."""
from __future__ import annotations

import shlex


def apply_flags(argv, fix: str):
    """The launch a user gets who does what the fix says: the suggested flags added (argparse keeps the
    last of a repeated flag), a flag the text says to replace or drop taken out first."""
    drop = {flag for flag in ("--fsdp_config", "--fsdp_min_num_params")
            if f"in place of the `{flag}` given" in fix or f"drop `{flag}`" in fix}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        else:
            out.append(a)
    return out + shlex.split(fix.split("`")[1])
