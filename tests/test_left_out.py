"""Statements of the entry that the plan does not depend on are left out (README "What linting runs";
issue 18): after the last statement that matters (the optimizer), and a `train(model)` -- a function
of the file holding a training loop -- wherever it is called. Each statement would leave a file behind."""
from __future__ import annotations

import os
import textwrap

import pytest

MAIN = textwrap.dedent('''
    import os
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(32, 32) for _ in range(3)])
            self.head = nn.Linear(32, 8)


    def train(model, steps=10):
        open("ran_train", "w").write("logging set up before the first forward")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            model(torch.randn(2, 32)).sum().backward()
            optimizer.step()


    def main():
        model = Net()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        os.system("touch ran_os_system_after_the_wrap")
        for i in range(2):
            open(f"ran_loop_{{i}}", "w").write("x")
        {before_optimizer}
        optimizer = torch.optim.AdamW(model.parameters())
        {after_optimizer}


    if __name__ == "__main__":
        main()
        {after_main}
''')


@pytest.mark.parametrize("before, after, after_main", [
    ("train(model)", "pass", "pass"),                                     # train() before the optimizer
    ("pass", "os.system('touch ran_after_the_optimizer')", "pass"),       # after the optimizer
    ("pass", "train(model)", "pass"),
    ("pass", "pass", "os.system('touch ran_after_main')"),               # in `if __name__ == "__main__":`
    ("pass", "for i in range(2):\n        open(f'ran_loop_after_{i}', 'w').write('x')", "pass"),
])
def test_statements_the_plan_does_not_need_do_not_run(cli, tmp_path, before, after, after_main):
    (tmp_path / "train.py").write_text(MAIN.format(before_optimizer=before, after_optimizer=after,
                                                   after_main=after_main))
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert '"layers.0"' in res.out                          # the plan was built
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("ran_")) == []


def test_at_module_level_too(cli, tmp_path):
    body = MAIN.split("def main():")[0] + textwrap.dedent('''
        if __name__ == "__main__":
            model = Net()
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            optimizer = torch.optim.AdamW(model.parameters())
            os.system("touch ran_after_the_optimizer")
            train(model)
    ''')
    (tmp_path / "train.py").write_text(body)
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0 and '"layers.0"' in res.out, res.err
    assert [f for f in os.listdir(tmp_path) if f.startswith("ran_")] == []
