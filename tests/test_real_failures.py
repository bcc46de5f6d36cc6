"""A failure that would happen on a real node is the script's bug, never skipped (issue 18): torch's own
checks of the model's names and options refuse the same call on CPU here (the oracle), and the lint
reports that line with exit 2; failures of what the simulated node lacks (a data file) are still skipped."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])


    def main():
        model = Net()
        {statement}
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())


    if __name__ == "__main__":
        main()
''')

CHECKS = [
    # (the statement, what real torch raises for it on CPU)
    ('model.add_module("head.proj", nn.Linear(64, 500))', KeyError),
    ('model.register_buffer("layers", torch.zeros(1))', KeyError),
]


@pytest.mark.parametrize("statement, error", CHECKS)
def test_torchs_own_check_fails_the_lint_at_its_line(cli, tmp_path, statement, error):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])

    model = Net()
    with pytest.raises(error) as real:             # the oracle: torch refuses it on CPU, as on a GPU node
        exec(statement, {"model": model, "nn": nn, "torch": torch})
    (tmp_path / "train.py").write_text(SCRIPT.format(statement=statement))
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    line = SCRIPT.format(statement=statement).splitlines().index("    " + statement) + 1
    assert res.code == 2, res.out + res.err
    [err] = [ln for ln in res.err.splitlines() if ln.startswith("fsdp-lint: error:")]
    assert f"train.py:{line}: {error.__name__}" in err and str(real.value).strip("'\"")[:30] in err
    assert "GPU node too" in err and "units" not in res.out


def test_what_the_simulated_node_lacks_is_still_skipped(cli, tmp_path):
    statement = 'model.vocab = open("data/vocab.txt").read().split()'
    (tmp_path / "train.py").write_text(SCRIPT.format(statement=statement))
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert "FileNotFoundError" in res.out and '"layers.0"' in res.out


def test_a_missing_checkpoint_stands_in_as_the_models_own_state_dict(cli, tmp_path):
    statement = 'model.load_state_dict(torch.load("checkpoints/last.pt"))'
    (tmp_path / "train.py").write_text(SCRIPT.format(statement=statement))
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert "checkpoints/last.pt" in res.out and "not on this machine" in res.out and '"layers.0"' in res.out
