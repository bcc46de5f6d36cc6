"""`# noqa` as ruff has it: a line's `# noqa: CODES`, a file-level `# fsdp-lint: noqa[: CODES]` on a line
of its own, only in real comments; FSD001 reports fsdp-lint codes that suppressed nothing or that no rule
has (other tools' codes and bare `# noqa` are left alone), and `--fix` removes them."""
from __future__ import annotations

import json
import os

from fsdp_lint.entry.noqa import _noqa_lines, file_noqa_lines

MODEL = '''import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(256, 256)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


model = Net()
for layer in model.layers:
    fully_shard(layer)
'''
ROOT = "fully_shard(model)\n"


def _findings(cli, tmp_path, text, *args):
    path = tmp_path / "train.py"
    path.write_text(text)
    res = cli(str(path), "--output-format", "json", "--world-size", "2", *args)
    assert res.code in (0, 1), res.err
    return [(f["code"], f["line"], f["message"]) for f in json.loads(res.out)["files"][0]["findings"]]


def test_the_model_without_root_wrap_has_fsd301(cli, tmp_path):
    assert [c for c, _, _ in _findings(cli, tmp_path, MODEL)] == ["FSD301"]


def test_file_level_noqa_suppresses_its_codes_anywhere_in_the_file(cli, tmp_path):
    assert _findings(cli, tmp_path, "# fsdp-lint: noqa: FSD301\n" + MODEL) == []
    assert _findings(cli, tmp_path, "# fsdp-lint: noqa\n" + MODEL) == []
    assert _findings(cli, tmp_path, MODEL + "# fsdp-lint: noqa: FSD3 -- the trainer wraps the root\n") == []
    # another code's file-level noqa keeps FSD301, and is itself unused
    codes = [c for c, _, _ in _findings(cli, tmp_path, "# fsdp-lint: noqa: FSD105\n" + MODEL)]
    assert codes == ["FSD001", "FSD301"]


def test_file_level_noqa_only_on_a_line_of_its_own_and_only_in_comments():
    assert file_noqa_lines("x = 1  # fsdp-lint: noqa\n") == {}
    assert file_noqa_lines('"""\n# fsdp-lint: noqa\n"""\n') == {}
    assert file_noqa_lines("    # FSDP-Lint: NOQA: fsd301, FSD2\n") == {1: {"FSD301", "FSD2"}}
    assert _noqa_lines('doc = "add # noqa: FSD301 to the line"\nf()  # noqa: FSD301\n') == {2: {"FSD301"}}


def test_unused_and_unknown_noqa_codes_are_fsd001_info_and_fixed(cli, tmp_path):
    text = MODEL.replace("    fully_shard(layer)\n", "    fully_shard(layer)  # noqa: E501, FSD31, FSD301\n").replace(
        "model = Net()\n", "model = Net()  # noqa: FSD105\n")
    found = _findings(cli, tmp_path, text)
    lines = text.splitlines()
    net, block = lines.index("model = Net()  # noqa: FSD105") + 1, lines.index("for layer in model.layers:") + 2
    assert [(c, ln) for c, ln, _ in found] == [("FSD001", net), ("FSD001", block)], found   # FSD301 suppressed
    assert "unused `# noqa` code `FSD105`" in found[0][2] and "unknown code `FSD31`" in found[1][2]
    path = tmp_path / "train.py"
    res = cli(str(path), "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    assert path.read_text() == text.replace("E501, FSD31, FSD301", "E501, FSD301").replace(
        "model = Net()  # noqa: FSD105\n", "model = Net()\n")
    assert _findings(cli, tmp_path, path.read_text()) == []


def test_noqa_of_a_rule_that_did_not_run_or_of_other_tools_is_not_judged(cli, tmp_path):
    text = MODEL + ROOT.replace("\n", "  # noqa: FSD105, BLE001\n")
    assert _findings(cli, tmp_path, text, "--ignore", "FSD105") == []
    assert _findings(cli, tmp_path, MODEL + ROOT.replace("\n", "  # noqa\n")) == []    # bare: shared with ruff
    assert [c for c, _, _ in _findings(cli, tmp_path, text, "--ignore", "FSD001")] == []


HELPER_MODEL = MODEL.split("\n\nmodel = Net()")[0] + "\n"
HELPER = '''"""Sharding for the trainer."""
from torch.distributed.fsdp import fully_shard


def shard(model, wrap_root=True):
    for layer in model.layers:
        fully_shard(layer)
    if wrap_root:
        fully_shard(model)  # noqa: FSD301
    return model
'''
ENTRY = '''import argparse

from mypkg.model import Net
from mypkg.parallel import shard

parser = argparse.ArgumentParser()
parser.add_argument("--no-root", action="store_true")
args = parser.parse_args()
model = shard(Net(), wrap_root=not args.no_root)  # noqa: FSD105
'''


def _repo(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(HELPER_MODEL)
    (pkg / "parallel.py").write_text(HELPER)
    (tmp_path / "train.py").write_text(ENTRY)
    return tmp_path


def test_noqa_in_a_helper_module_is_judged_by_fsd001_and_fixed(cli, tmp_path):
    """A repository whose entry calls `mypkg.parallel.shard`: the `# noqa: FSD301` on the helper's root
    wrap suppresses nothing (the root is wrapped), so FSD001 reports it there, at the helper's line;
    the entry's own unused noqa is reported too, and `--fix` removes both."""
    repo = _repo(tmp_path)
    res = cli("train.py", "--output-format", "json", "--world-size", "2", cwd=str(repo))
    found = [(f["code"], os.path.basename(f["path"]), f["line"]) for f in json.loads(res.out)["files"][0]["findings"]]
    helper_line = HELPER.splitlines().index("        fully_shard(model)  # noqa: FSD301") + 1
    assert sorted(found) == [("FSD001", "parallel.py", helper_line), ("FSD001", "train.py", 9)], found
    res = cli("train.py", "--fix", "--world-size", "2", cwd=str(repo))
    assert res.code == 0, res.out + res.err
    assert (repo / "mypkg" / "parallel.py").read_text() == HELPER.replace("  # noqa: FSD301", "")
    # launched without the root wrap, FSD301 is at the helper's first wrap call: a noqa there suppresses it
    # and is used; the one left on the root wrap's line is not
    (repo / "mypkg" / "parallel.py").write_text(HELPER.replace("fully_shard(layer)", "fully_shard(layer)  # noqa: FSD301"))
    (repo / "train.py").write_text(ENTRY.replace("  # noqa: FSD105", ""))
    res = cli("train.py", "--output-format", "json", "--world-size", "2", "--", "--no-root", cwd=str(repo))
    found = [(f["code"], os.path.basename(f["path"]), f["line"]) for f in json.loads(res.out)["files"][0]["findings"]]
    assert found == [("FSD001", "parallel.py", helper_line)], found


def test_noqa_in_a_module_the_plan_does_not_touch_is_not_judged(cli, tmp_path):
    """A project module that holds none of the plan's calls (the model's file here) is another entry's
    business: its noqa comments are left alone."""
    repo = _repo(tmp_path)
    (repo / "mypkg" / "model.py").write_text(HELPER_MODEL.replace("class Net(nn.Module):",
                                                                  "class Net(nn.Module):  # noqa: FSD104"))
    (repo / "train.py").write_text(ENTRY.replace("  # noqa: FSD105", ""))
    (repo / "mypkg" / "parallel.py").write_text(HELPER.replace("  # noqa: FSD301", ""))
    res = cli("train.py", "--output-format", "json", "--world-size", "2", cwd=str(repo))
    assert json.loads(res.out)["files"][0]["findings"] == [], res.out
