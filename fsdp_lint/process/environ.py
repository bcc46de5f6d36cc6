"""Environment variables set for the length of a block, as they were afterwards."""
from __future__ import annotations

import contextlib
import os
from typing import Dict, Iterator


@contextlib.contextmanager
def environ_set(values: Dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block; afterwards each name holds what it held
    before, or is unset again where it was unset (the replay's rank-0 view, a simulated cluster job)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
