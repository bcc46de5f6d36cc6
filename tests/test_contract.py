"""Contract defects found by probing (issue 18): non-regular files, Ctrl-C early, options and config
values refused before the static pass with one line naming the cause and exit 2."""
from __future__ import annotations

import os
import textwrap

import pytest

TRAIN = textwrap.dedent('''
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
            self.head = nn.Linear(8, 8)

    model = Net()
    for layer in model.layers:
        fully_shard(layer)
''')


def one_line_error(res, *parts):
    assert res.code == 2, (res.code, res.out, res.err)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_fifo_in_a_walked_folder_is_not_opened_and_a_named_one_is_refused(cli, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    os.mkfifo(tmp_path / "pipe.py")              # opening it for reading would block until a writer comes
    res = cli(".", "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1 and "train.py" in res.out and "pipe.py" not in res.out + res.err
    one_line_error(cli("pipe.py", cwd=str(tmp_path)), "pipe.py: a named pipe (FIFO), not a regular file")
