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


@pytest.mark.parametrize("args, cause", [
    (["--steps", "-1"], "--steps must be at least 1, got -1"),
    (["--run-timeout", "-5"], "--run-timeout must be a positive number of seconds"),
    (["--run-timeout", "inf"], "--run-timeout must be a positive number of seconds"),
    (["-o", "/missing/dir/x.json"], "cannot write /missing/dir/x.json: the folder /missing/dir does not exist"),
])
def test_bad_options_are_refused_before_the_static_pass(cli, tmp_path, monkeypatch, args, cause):
    import fsdp_lint.cli as cli_mod

    (tmp_path / "train.py").write_text(TRAIN)
    # refused before a file is even collected (a bad value found after minutes of linting wastes them)
    monkeypatch.setattr(cli_mod, "collect_files", lambda *a, **k: pytest.fail("the files were collected"))
    one_line_error(cli("train.py", *args, cwd=str(tmp_path)), cause)


@pytest.mark.parametrize("toml, cause", [
    ('select = "ALL"', '[tool.fsdp-lint] select must be a list of strings (select = ["ALL"]), got \'ALL\''),
    ('ignore = "FSD601"', "[tool.fsdp-lint] ignore must be a list of strings"),
    ('per-file-ignores = "FSD1"', "[tool.fsdp-lint] per-file-ignores must be a table of glob = [codes]"),
    ('per-file-ignores = { "tests/*" = "FSD1" }', "[tool.fsdp-lint] per-file-ignores must be a table"),
    ("replay-timeout = inf", "replay-timeout must be at most 86,400 seconds (a day), got inf"),
    ("replay-timeout = 1e308", "replay-timeout must be at most 86,400 seconds (a day), got 1e+308"),
    ('hf-config = "README.md"', "hf-config"),
    ('hf-config = "nothing-here"', "hf-config"),
])
def test_bad_config_values_name_the_key(cli, tmp_path, toml, cause):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "README.md").write_text("# a training repository\n")
    (tmp_path / "pyproject.toml").write_text(f"[tool.fsdp-lint]\n{toml}\n")
    line = one_line_error(cli("train.py", cwd=str(tmp_path)), "pyproject.toml", cause)
    if "hf-config" in toml:
        assert "README.md: not a model config" in line or "nothing-here: no such file" in line


def test_hf_config_names_a_model_config(cli, tmp_path):
    one_line_error(cli("--hf-config", "pyproject.toml"), "hf-config pyproject.toml: not a model config")
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    one_line_error(cli("--hf-config", str(tmp_path)), "a Hugging Face config.json is a JSON object with a `model_type`")


def test_ctrl_c_while_the_command_line_is_imported_exits_130(tmp_path):
    """Ctrl-C in the first tenths of a second lands in the imports of the command line's modules: the
    console script (and `python -m fsdp_lint`) end with one line and 130 there too. The interrupt is
    raised by an import hook at `import click`, where a real Ctrl-C lands (no timing involved)."""
    import tomllib

    from conftest import REPO, run_subprocess

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        assert tomllib.load(fh)["project"]["scripts"]["fsdp-lint"] == "fsdp_lint.console:main"
    hook = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, *a):\n"
            "        if name == 'click':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.modules.pop('click', None)\n"
            "sys.argv = ['fsdp-lint', 'train.py']\n"
            "from fsdp_lint.console import main\n"
            "main()\n")
    res = run_subprocess(["-c", hook], cwd=str(tmp_path))
    assert res.returncode == 130 and res.stderr == "fsdp-lint: interrupted\n", res.stderr
