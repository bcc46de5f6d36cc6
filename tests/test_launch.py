"""Launch as the project launches (issue 15, item 4).

* A recipe folder whose ``__init__.py`` refuses to be imported (torchtune's "isn't a package"):
  the file runs as a script, as the project's ``run`` command does, and the note says so; the plan
  equals what real torch builds for the same launch.
* A module of a namespace package (no ``__init__.py``) with relative imports: run as ``python -m
  apps.mt.train`` from the repository root (a script launch fails on its first relative import); the
  plan equals real torch's, the note and any error name that launch.
* A module without a ``__main__`` block that a project command line calls (``litlm pretrain``, a
  console script over jsonargparse subcommands): the error names the command and the file to lint.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

REPOS = os.path.join(REPO, "fixtures", "repos")
TUNE = os.path.join(REPOS, "tune_like")
RECIPE = os.path.join(TUNE, "recipes", "full_finetune_distributed.py")
NS = os.path.join(REPOS, "ns_translate")
NS_TRAIN = os.path.join(NS, "apps", "mt", "train.py")
LIT = os.path.join(REPOS, "lit_pretrain_like")


def test_a_recipe_whose_package_refuses_runs_as_a_script_and_equals_torch(monkeypatch):
    monkeypatch.chdir(TUNE)
    argv = ["--config", "recipes/configs/tiny_full.yaml"]
    res, real = assert_plan_matches_torch(RECIPE, 8, argv=argv)
    assert [u.modules for u in res.plan.units] == [["layers.2"], ["layers.1"], ["layers.0"], [""]]
    note = next(n for n in res.notes if "ran full_finetune_distributed.py as a script" in n)
    assert "importing its package `recipes` failed" in note and "recipes/__init__.py:3" in note
    assert "isn't a package" in note


def test_a_recipe_with_relative_imports_is_not_run_as_a_script(cli, tmp_path):
    """A file that needs its package (a relative import) cannot run as a script: the package's own
    failure is the error, as with `python -m`."""
    pkg = tmp_path / "recipes"
    pkg.mkdir()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (pkg / "__init__.py").write_text("raise ImportError('recipes: run the recipe files as scripts')\n")
    (pkg / "helpers.py").write_text("DIM = 8\n")
    (pkg / "train.py").write_text("import torch\nfrom torch.distributed.fsdp import fully_shard\n\nfrom .helpers import DIM\n\n"
                                  "model = fully_shard(torch.nn.Linear(DIM, DIM))\n")
    res = cli("recipes/train.py", cwd=str(tmp_path))
    assert res.code == 2 and "recipes: run the recipe files as scripts" in res.err and "Traceback" not in res.err


def test_a_namespace_package_module_runs_as_python_dash_m_and_equals_torch(monkeypatch):
    monkeypatch.chdir(NS)
    res, _ = assert_plan_matches_torch(NS_TRAIN, 4)
    assert [u.modules for u in res.plan.units] == [["layers.0"], ["layers.1"], ["layers.2"], [""]]
    assert any("run as `python -m apps.mt.train` from" in n and "namespace package apps.mt" in n for n in res.notes)


def test_a_namespace_package_modules_error_names_the_launch(cli):
    # the model refuses --depth 0: the error is the model's, and names the launch it was replayed as
    res = cli(NS_TRAIN, "--world-size", "4", "--", "--depth", "0", cwd=NS)
    assert res.code == 2, res.out
    assert "ValueError: depth must be at least 1, got 0" in res.err
    assert f"run as `python -m apps.mt.train` from {NS}" in res.err and "Traceback" not in res.err


def test_a_module_called_by_the_projects_command_line_names_that_launch(cli):
    res = cli("litlm/pretrain.py", cwd=LIT)
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "no `if __name__ == \"__main__\"` block" in line
    assert "command line `litlm pretrain` (litlm/__main__.py)" in line
    assert line.endswith("lint that launch: fsdp-lint litlm/__main__.py -- pretrain ARGS")
    # the launch it names lints
    res = cli("litlm/__main__.py", "--", "pretrain", cwd=LIT)
    assert res.code in (0, 1), res.err


def test_cli_launches_reads_console_scripts_and_the_packages_main():
    from fsdp_lint.entry.launches import cli_launches
    from fsdp_lint.entry.project import entry_for

    [launch] = cli_launches(entry_for(os.path.join(LIT, "litlm", "pretrain.py")))
    assert (launch.command, os.path.relpath(launch.cli_path, LIT), launch.subcommand) == \
        ("litlm pretrain", os.path.join("litlm", "__main__.py"), "pretrain")
    # a module the command line does not import is not called by it
    assert cli_launches(entry_for(os.path.join(LIT, "litlm", "model.py"))) == []
