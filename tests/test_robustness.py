"""Small defects of issue 10 §6: what an unusual but valid input, or a bad value, does.

Source encodings as Python reads them, a missing path among others, ``# noqa:`` with something that
is not a code, configuration values out of range, an absurd world size, and ``--api`` overriding the
file's own API. Each bad input is one line on stderr and exit code 2; the other files are still linted.
"""
from __future__ import annotations

import json
import os

import pytest

from test_cli import GOOD, NO_ROOT, assert_one_line_error, line_of, write


def _json(res):
    return json.loads(res.out)


@pytest.mark.parametrize("prefix,encoding", [
    (b"\xef\xbb\xbf", "utf-8"),                                    # a BOM (Windows editors)
    (b"# -*- coding: latin-1 -*-\n# Modell f\xfcr Tests\n", None),  # a declared encoding, as Python reads it
])
def test_sources_are_read_as_python_reads_them(cli, tmp_path, prefix, encoding):
    path = tmp_path / "train.py"
    path.write_bytes(prefix + NO_ROOT.encode("utf-8"))
    res = cli(str(path), "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1, res.err
    line = line_of(str(path), "fully_shard(layer)") if encoding else None
    assert "FSD301" in res.out and res.err == ""
    if line:
        assert f"train.py:{line}:" in res.out
    full = cli(str(path), "--select", "FSD301", cwd=str(tmp_path))
    assert "\ufeff" not in full.out                       # the source lines shown carry no BOM


def test_a_missing_path_is_reported_and_the_others_are_linted(cli, tmp_path):
    write(tmp_path, "train.py", NO_ROOT)
    res = cli("nope.py", "train.py", "missing_dir", "--select", "FSD301", "--format", "json", cwd=str(tmp_path))
    assert res.code == 2
    assert res.err.splitlines() == ["fsdp-lint: error: nope.py: no such file or directory",
                                    "fsdp-lint: error: missing_dir: no such file or directory"]
    doc = _json(res)
    by_path = {f["path"]: f for f in doc["files"]}
    assert [f["code"] for f in by_path["train.py"]["findings"]] == ["FSD301"]
    assert "no such file" in by_path["nope.py"]["error"]
    assert doc["summary"]["failed"] == 2
    # a single missing path: still one line, exit 2
    assert_one_line_error(cli("nope.py", cwd=str(tmp_path)), "nope.py", "no such file")


@pytest.mark.parametrize("comment,suppressed", [
    ("# noqa", True),
    ("# noqa: FSD301", True),
    ("# noqa:FSD3 the root is wrapped by the trainer", True),
    ("# NOQA : fsd301", True),
    ("# noqa: FSD101, FSD301", True),
    ("# noqa: FSD101", False),
    ("# noqa: see the wiki", False),         # not codes: suppresses nothing (as ruff)
    ("# noqa:", False),
    ("# noqa: 301", False),
    ("# noqa: FSD", False),                  # letters only is not a code or a prefix
])
def test_noqa_suppresses_only_what_it_names(cli, tmp_path, comment, suppressed):
    path = write(tmp_path, "train.py", NO_ROOT)
    line = line_of(path, "fully_shard(layer)")
    lines = open(path).read().splitlines()
    lines[line - 1] += "  " + comment
    write(tmp_path, "train.py", "\n".join(lines) + "\n")
    res = cli(path, "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert ("FSD301" not in res.out) == suppressed, (comment, res.out)
    assert res.code == (0 if suppressed else 1)


@pytest.mark.parametrize("toml,needle", [
    ("replay-timeout = 0", "replay-timeout must be a positive number of seconds, got 0.0"),
    ("replay-timeout = -5", "replay-timeout must be a positive number of seconds"),
    ("whole-model-fraction = 1.5", "whole-model-fraction must be between 0 and 1, got 1.5"),
    ("over-fine-fraction = -0.1", "over-fine-fraction must be between 0 and 1"),
    ("padding-fraction = 5", "padding-fraction must be between 0 and 1, got 5.0"),
    ("collective-floor-bytes = -1", "collective-floor-bytes must be 0 or more, got -1"),
    ("world-size = 2000000", "world-size must be at most 1,048,576"),
])
def test_config_values_out_of_range_name_the_key(cli, tmp_path, toml, needle):
    path = write(tmp_path, "train.py", GOOD)
    write(tmp_path, "pyproject.toml", f"[tool.fsdp-lint]\n{toml}\n")
    assert_one_line_error(cli(path, cwd=str(tmp_path)), "pyproject.toml", needle)


def test_an_absurd_world_size_is_refused(cli, tmp_path):
    path = write(tmp_path, "train.py", GOOD)
    assert_one_line_error(cli(path, "--world-size", str(1 << 30), cwd=str(tmp_path)),
                          "--world-size must be at most 1,048,576 (2^20), got 1,073,741,824")
    assert cli(path, "--world-size", str(1 << 20), "--format", "json", cwd=str(tmp_path)).code in (0, 1)


def test_api_that_differs_from_the_files_says_it_overrides(cli, tmp_path):
    path = write(tmp_path, "train.py", GOOD)                       # FSDP2: fully_shard
    res = cli(path, "--api", "fsdp1", "--world-size", "4", cwd=str(tmp_path))
    note = "--api fsdp1 overrides the file's FSDP2 wrap calls"
    assert note in res.out
    assert note in " ".join(_json(cli(path, "--api", "fsdp1", "--format", "json", cwd=str(tmp_path)))
                            ["files"][0]["notes"])
    assert "overrides" not in cli(path, "--api", "fsdp2", cwd=str(tmp_path)).out   # the file's own API
    assert os.path.exists(path)


def test_help_and_readme_say_what_runs(cli):
    """The README's advice for untrusted code is the same sentence as in --help."""
    import re

    from conftest import REPO

    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    section = readme.split("## What linting runs")[1].split("\n## ")[0]
    advice = re.search(r"\*\*(Linting runs the repository's code.*?)\*\*", section, re.S).group(1)
    help_text = " ".join(cli("--help").out.split())
    assert " ".join(advice.split()).rstrip(".") in help_text
    for what in ("training boundary", "replay-timeout", "FSDP_LINT_JOBS", "no sandbox", "pull_request_target"):
        assert what in section, what
