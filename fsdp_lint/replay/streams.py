"""The setup code's standard streams: kept for the report, and files as on a node.

What the linted code prints is captured (the report shows it when the replay fails). On a node its
stdout is a file -- a terminal, a pipe, SLURM's log -- and libraries ask for its descriptor:
``os.isatty(sys.stdout.fileno())`` decides coloured logging, ``faulthandler.enable()`` writes to it. A
plain ``io.StringIO`` raises ``UnsupportedOperation: fileno`` there, and the statement was skipped (a
project's logger set up without its handlers). `NodeStream` answers with a descriptor of ``os.devnull``:
not a terminal, as under a job scheduler; what is written to the descriptor itself is dropped."""
from __future__ import annotations

import io
import os
import weakref


class NodeStream(io.StringIO):
    _fd = None

    def fileno(self) -> int:
        if self._fd is None:
            self._fd = os.open(os.devnull, os.O_WRONLY)
            weakref.finalize(self, os.close, self._fd)
        return self._fd
