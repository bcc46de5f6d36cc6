"""fsdp-lint as a gate: exit codes, rule selection, configuration, suppression, many paths, and one
clear line on stderr (exit 2, no traceback) for every kind of bad input.

Most tests run ``fsdp_lint.cli.main`` in this process (the ``cli`` fixture in conftest.py); the ones
about imports and the console entry points run a subprocess.
"""
import json
import os
import sys
import textwrap

import pytest

from conftest import REPO, run_subprocess

MODEL = '''
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())


class Net(nn.Module):
    def __init__(self, vocab=1000, dim=64, layers=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


model = Net()
'''

# FSD301 as an error: trainable embeddings/head left outside every unit
NO_ROOT = MODEL + '''
for layer in model.layers:
    fully_shard(layer)
'''
# FSD301 as a warning: only frozen parameters are left outside
NO_ROOT_FROZEN = MODEL + '''
model.embed.requires_grad_(False)
model.head.requires_grad_(False)
for layer in model.layers:
    fully_shard(layer)
'''
GOOD = MODEL + '''
for layer in model.layers:
    fully_shard(layer)
fully_shard(model)
'''
PLAIN = '''
import os


def helper(x):
    return os.path.join(x, "data")
'''


def write(directory, name, text):
    path = os.path.join(str(directory), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(text))
    return path


def line_of(path, needle, occurrence=-1):
    with open(path) as fh:
        lines = [i for i, text in enumerate(fh, start=1) if needle in text]
    return lines[occurrence]


def assert_one_line_error(res, *needles):
    assert res.code == 2, (res.code, res.out, res.err)
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("fsdp-lint: error: "), res.err
    assert "Traceback" not in res.err and "Traceback" not in res.out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------------------------
# exit codes
# ------------------------------------------------------------------------------------------------
def test_error_finding_exits_1_and_names_the_line(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    res = cli(path, "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1, res.err
    line = line_of(path, "fully_shard(layer)")
    assert f"train.py:{line}:" in res.out and "FSD301 [*] [error]" in res.out
    assert res.err == ""


def test_exit_zero_keeps_the_report(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    res = cli(path, "--select", "FSD301", "--exit-zero", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 0
    assert "FSD301" in res.out


def test_fail_on_sets_the_threshold(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT_FROZEN)
    default = cli(path, "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert default.code == 1 and "FSD301 [*] [warning]" in default.out  # default --fail-on warning
    assert cli(path, "--select", "FSD301", "--fail-on", "error", cwd=str(tmp_path)).code == 0
    assert cli(path, "--select", "FSD301", "--fail-on", "info", cwd=str(tmp_path)).code == 1
    errors = write(tmp_path, "errors.py", NO_ROOT)
    assert cli(errors, "--select", "FSD301", "--fail-on", "error", cwd=str(tmp_path)).code == 1


def test_correct_plan_exits_0(cli):
    res = cli("fixtures/article_fsdp2.py", "--world-size", "4")
    assert res.code == 0, res.out + res.err
    assert "[error]" not in res.out and "[warning]" not in res.out
    assert "Found 0 findings" in res.out or "0 error, 0 warning" in res.out


def test_bad_fixture_fails_the_gate(cli):
    res = cli("fixtures/bad/fsdp2_no_root.py", "--world-size", "4", "--format", "concise")
    assert res.code == 1, res.err
    assert "FSD301" in res.out


# ------------------------------------------------------------------------------------------------
# selection
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,fires", [
    (["--ignore", "FSD301"], False),
    (["--ignore", "FSD3"], False),                       # prefix
    (["--select", "FSD1"], False),
    (["--select", "FSD1", "--extend-select", "FSD3"], True),
    (["--select", "ALL", "--ignore", "FSD301"], False),
    (["--select", "FSD301", "--ignore", "FSD3"], True),  # the more specific selector wins
    (["--select", "fsd301"], True),                      # case-insensitive
    (["--select", "FSD102,FSD301"], True),               # comma-separated
])
def test_select_ignore_extend_select(cli, tmp_path, args, fires):
    path = write(tmp_path, "train.py", NO_ROOT)
    res = cli(path, *args, "--format", "concise", cwd=str(tmp_path))
    assert ("FSD301" in res.out) == fires, res.out
    if fires:
        assert res.code == 1


def test_noqa_on_the_reported_line(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    line = line_of(path, "fully_shard(layer)")
    with open(path) as fh:
        lines = fh.read().splitlines()
    base = lines[line - 1]

    lines[line - 1] = base + "  # noqa: FSD301"
    write(tmp_path, "train.py", "\n".join(lines) + "\n")
    res = cli(path, "--select", "FSD301", cwd=str(tmp_path))
    assert res.code == 0 and "FSD301" not in res.out

    lines[line - 1] = base + "  # noqa: FSD101"  # another code does not hide it
    write(tmp_path, "train.py", "\n".join(lines) + "\n")
    res = cli(path, "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1 and "FSD301" in res.out

    lines[line - 1] = base + "  # noqa"  # a bare noqa hides everything on the line
    write(tmp_path, "train.py", "\n".join(lines) + "\n")
    assert cli(path, "--select", "FSD301", cwd=str(tmp_path)).code == 0


def test_statistics_counts_per_code(cli, tmp_path):
    write(tmp_path, "a.py", NO_ROOT)
    write(tmp_path, "b.py", NO_ROOT)
    res = cli(str(tmp_path), "--select", "FSD301", "--statistics", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1
    stats = [ln.split() for ln in res.out.splitlines() if "missing-root-wrap" in ln and ":" not in ln]
    assert stats == [["2", "FSD301", "missing-root-wrap", "error"]], res.out


# ------------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------------
def test_pyproject_select_ignore_and_world_size(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    write(tmp_path, "pyproject.toml", '[tool.fsdp-lint]\nworld-size = 2\nignore = ["FSD301"]\n')
    res = cli(path, "--format", "json", cwd=str(tmp_path))
    doc = json.loads(res.out)
    assert doc["files"][0]["plan"]["world_size"] == 2
    assert not [f for f in doc["files"][0]["findings"] if f["code"] == "FSD301"]
    # the command line wins over the file
    res = cli(path, "--world-size", "3", "--select", "FSD301", "--format", "json", cwd=str(tmp_path))
    doc = json.loads(res.out)
    assert doc["files"][0]["plan"]["world_size"] == 3
    assert [f["code"] for f in doc["files"][0]["findings"]] == ["FSD301"]
    res = cli(path, "--extend-select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert "FSD301" in res.out and res.code == 1


def test_pyproject_per_file_ignores(cli, tmp_path):
    write(tmp_path, "scripts/train.py", NO_ROOT)
    write(tmp_path, "other.py", NO_ROOT)
    write(tmp_path, "pyproject.toml", '[tool.fsdp-lint]\nselect = ["FSD301"]\n'
                                      '[tool.fsdp-lint.per-file-ignores]\n"scripts/*.py" = ["FSD3"]\n')
    res = cli(str(tmp_path), "--format", "concise", cwd=str(tmp_path))
    assert res.code == 1
    assert "other.py" in res.out and "scripts/train.py" not in res.out


def test_pyproject_thresholds_and_explicit_config(cli, tmp_path):
    path = write(tmp_path, "train.py", GOOD)
    cfg = write(tmp_path, "conf/fsdp.toml", '[tool.fsdp-lint]\nworld-size = 5\npadding-fraction = 0.2\n'
                                            'fail-on = "error"\n')
    res = cli(path, "--config", cfg, "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert json.loads(res.out)["files"][0]["plan"]["world_size"] == 5


def test_pyproject_model_key(cli, tmp_path):
    write(tmp_path, "model.py", MODEL.replace("model = Net()\n", ""))
    path = write(tmp_path, "train.py", '''
        from torch.distributed.fsdp import fully_shard

        def apply_fsdp(model):
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            return model
        ''')
    write(tmp_path, "pyproject.toml", '[tool.fsdp-lint]\nmodel = "model.py:Net(layers=3)"\nselect = ["FSD3"]\n')
    res = cli(path, "--format", "json", cwd=str(tmp_path))
    assert res.code == 0, res.err
    units = json.loads(res.out)["files"][0]["plan"]["units"]
    assert [u["module"] for u in units] == ["layers.0", "layers.1", "layers.2", ""]


@pytest.mark.parametrize("toml,needle", [
    ('[tool.fsdp-lint]\nworld-sise = 4\n', "world-sise"),
    ('[tool.fsdp-lint]\nworld-size = "four"\n', "world-size"),
    ('[tool.fsdp-lint]\nworld-size = 0\n', "world-size"),
    ('[tool.fsdp-lint]\nselect = ["FSD999"]\n', "FSD999"),
    ('[tool.fsdp-lint]\nfail-on = "fatal"\n', "fail-on"),
    ('[tool.fsdp-lint]\npadding-fraction = "5%"\n', "padding-fraction"),
    ('[tool.fsdp-lint.per-file-ignores]\n"*.py" = ["NOPE"]\n', "NOPE"),
    ('[tool.fsdp-lint\nworld-size = 4\n', "invalid TOML"),
])
def test_bad_config_is_one_line_exit_2(cli, tmp_path, toml, needle):
    path = write(tmp_path, "train.py", GOOD)
    write(tmp_path, "pyproject.toml", toml)
    res = cli(path, cwd=str(tmp_path))
    assert_one_line_error(res, needle, "pyproject.toml")


# ------------------------------------------------------------------------------------------------
# bad input (issue 2 §7)
# ------------------------------------------------------------------------------------------------
SYNTAX_ERROR = '''
import torch.nn as nn
class Net(nn.Module)
    pass
'''
CTOR_NEEDS_ARGS = '''
import torch.nn as nn
class Net(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.dim, config.dim)
'''
FAILS_IN_WRAPPED_MODEL = '''
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        raise RuntimeError("unsupported configuration")
model = Net()
fully_shard(model)
'''
UNIMPORTABLE_MODEL = '''
from torch.distributed.fsdp import fully_shard
from some_private_package import build_model
model = build_model()
fully_shard(model)
'''
FSDP_WITHOUT_MODEL = '''
from torch.distributed.fsdp import fully_shard

def apply_fsdp(model, mesh):
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
'''


@pytest.mark.parametrize("name,source,extra,needles", [
    ("syntax.py", SYNTAX_ERROR, [], ["syntax.py", "3"]),
    ("needs_args.py", CTOR_NEEDS_ARGS, [], ["needs_args.py", "Net", "--model"]),
    ("no_model.py", FSDP_WITHOUT_MODEL, [], ["no_model.py", "model"]),
    # issue 15: `.item()` of a meta tensor answers 0 with a note (tests/test_data_standins.py)
    ("raises.py", FAILS_IN_WRAPPED_MODEL, [], ["raises.py", "unsupported configuration"]),
    ("private.py", UNIMPORTABLE_MODEL, [], ["private.py", "some_private_package"]),
    ("train.py", GOOD, ["--model", "train.py:Nope"], ["Nope"]),
    ("train.py", GOOD, ["--model", "missing_file.py:Net"], ["missing_file.py"]),
    ("train.py", GOOD, ["--model", "no_such_pkg.models:Net"], ["no_such_pkg"]),
    ("train.py", GOOD, ["--world-size", "0"], ["--world-size", "0"]),
    ("train.py", GOOD, ["--world-size", "-3"], ["--world-size"]),
    ("train.py", GOOD, ["--select", "FSD9"], ["FSD9"]),
    ("train.py", GOOD, ["--ignore", "E501"], ["E501"]),
    ("train.py", GOOD, ["--extend-select", "FSD05"], ["FSD05"]),  # FSD7xx exist since issue 11, FSD8xx since 19, FSD001
    ("train.py", GOOD, ["--format", "xml"], ["xml"]),
    ("train.py", GOOD, ["--no-such-option"], ["--no-such-option"]),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, name, source, extra, needles):
    path = write(tmp_path, name, source)
    res = cli(path, *extra, cwd=str(tmp_path))
    assert_one_line_error(res, *needles)


def test_model_that_fails_on_meta_names_the_cause(cli, tmp_path):
    path = write(tmp_path, "net.py", CTOR_NEEDS_ARGS)
    res = cli(path, cwd=str(tmp_path))
    assert_one_line_error(res, "meta")


def test_missing_path_and_no_path(cli, tmp_path):
    assert_one_line_error(cli(str(tmp_path / "nope.py"), cwd=str(tmp_path)), "nope.py")
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli(cwd=str(empty))        # no paths: `.`, as ruff does -- nothing to lint there
    assert res.code == 0 and "in 0 files" in res.out, res.out + res.err


def test_explain_and_list_rules(cli):
    from fsdp_lint.check.rule import all_rules

    res = cli("--list-rules")
    assert res.code == 0
    rows = {ln.split()[0]: ln for ln in res.out.splitlines()[2:] if ln.startswith("FSD")}  # wrapped summaries
    assert max(len(ln) for ln in res.out.splitlines()) <= 80
    rules = all_rules()
    assert rules and set(rows) == {r.code for r in rules}
    for r in rules:
        assert r.name in rows[r.code] and r.severity in rows[r.code]

    res = cli("--explain", "FSD301")
    assert res.code == 0
    for section in ("What it does", "Why is this bad?", "Example", "Fix"):
        assert section in res.out
    assert "missing-root-wrap" in res.out
    assert cli("--explain", "fsd301").out == res.out
    assert_one_line_error(cli("--explain", "FSD999"), "FSD999")


def test_errors_do_not_hide_other_files(cli, tmp_path):
    write(tmp_path, "a_broken.py", SYNTAX_ERROR)
    write(tmp_path, "b_train.py", NO_ROOT)
    res = cli(str(tmp_path), "--select", "FSD301", "--format", "concise", cwd=str(tmp_path))
    assert res.code == 2  # an error outranks findings
    assert "a_broken.py" in res.err and "Traceback" not in res.err
    assert "b_train.py" in res.out and "FSD301" in res.out
    assert "1 could not be linted" in res.out


def test_output_file(cli, tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    out = tmp_path / "report.json"
    res = cli(path, "--select", "FSD301", "--format", "json", "-o", str(out), cwd=str(tmp_path))
    assert res.code == 1 and res.out == ""
    assert json.loads(out.read_text())["summary"]["error"] == 1


# ------------------------------------------------------------------------------------------------
# many paths; directories; files that are skipped without importing torch
# ------------------------------------------------------------------------------------------------
def test_directories_are_walked_for_python_files(cli, tmp_path):
    write(tmp_path, "src/pkg/train.py", NO_ROOT)
    write(tmp_path, "src/pkg/util.py", PLAIN)
    write(tmp_path, "src/.venv/lib/bad.py", NO_ROOT)          # hidden/virtualenv folders are not walked
    write(tmp_path, "src/pkg/__pycache__/x.py", NO_ROOT)
    write(tmp_path, "src/notes.txt", "fully_shard(model)")
    other = write(tmp_path, "good.py", GOOD)
    res = cli("src", other, "--select", "FSD301", "--format", "json", cwd=str(tmp_path))
    doc = json.loads(res.out)
    paths = sorted(f["path"] for f in doc["files"])
    assert paths == ["good.py", "src/pkg/train.py", "src/pkg/util.py"]
    by_path = {f["path"]: f for f in doc["files"]}
    assert by_path["src/pkg/util.py"]["skipped"]
    assert [f["code"] for f in by_path["src/pkg/train.py"]["findings"]] == ["FSD301"]
    assert by_path["good.py"]["findings"] == []
    assert res.code == 1


NO_TORCH_PROBE = '''
import sys
from fsdp_lint.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print("exit", exc.code)
from fsdp_lint import isolation
# torch is imported by the process that lints model files (the fork server), never by this one
print("torch imported:", "torch" in sys.modules or isolation.server_pid() is not None)
'''


def test_plain_files_are_skipped_without_importing_torch(tmp_path):
    for i in range(3):
        write(tmp_path, f"util_{i}.py", PLAIN + f"\nVALUE = {i}\n")
    write(tmp_path, "data/loader.py", "import json\n\ndef load(p):\n    return json.load(open(p))\n")
    write(tmp_path, "pyproject.toml", '[tool.fsdp-lint]\nselect = ["FSD3"]\n')
    for fmt in ("full", "json", "sarif"):
        proc = run_subprocess(["-c", NO_TORCH_PROBE, str(tmp_path), "--format", fmt], cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        assert "exit 0" in proc.stdout, proc.stdout
        assert "torch imported: False" in proc.stdout, (fmt, proc.stdout)
    # the probe can fail: a model file does import torch
    write(tmp_path, "model.py", GOOD)
    proc = run_subprocess(["-c", NO_TORCH_PROBE, str(tmp_path / "model.py")], cwd=str(tmp_path))
    assert "torch imported: True" in proc.stdout, proc.stdout + proc.stderr


def test_console_entry_points(tmp_path):
    path = write(tmp_path, "train.py", NO_ROOT)
    proc = run_subprocess(["-m", "fsdp_lint", path, "--select", "FSD301", "--format", "github"], cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    line = line_of(path, "fully_shard(layer)")
    assert proc.stdout.startswith(f"::error file=train.py,line={line},")
    assert "title=fsdp-lint (FSD301)::" in proc.stdout
    proc = run_subprocess(["-m", "fsdp_lint", "--version"])
    assert proc.returncode == 0 and "fsdp-lint" in proc.stdout


def test_debug_shows_the_traceback_of_an_internal_error(tmp_path):
    """A bug in fsdp-lint is still one line without --debug, and a traceback with it -- also when
    the bug is met in the process that lints the file (the fork server's child)."""
    path = write(tmp_path, "train.py", GOOD)
    # a sitecustomize puts the simulated bug in every python process the command starts
    write(tmp_path, "site/sitecustomize.py", '''
        import fsdp_lint.engine as engine

        def boom(screened, settings, **kwargs):
            raise ValueError("simulated bug\\nsecond line")

        engine.lint_facts = boom
        ''')
    env = {"PYTHONPATH": str(tmp_path / "site")}
    proc = run_subprocess(["-m", "fsdp_lint", path], cwd=str(tmp_path), env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error: ValueError: simulated bug (rerun with --debug" in proc.stderr
    proc = run_subprocess(["-m", "fsdp_lint", path, "--debug"], cwd=str(tmp_path), env=env)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
    assert "in boom" in proc.stderr           # the child's own traceback


# ------------------------------------------------------------------------------------------------
# the README contract: documented configuration keys, the CI command, the pre-commit hook
# ------------------------------------------------------------------------------------------------
def _readme():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def test_every_config_key_is_documented():
    from fsdp_lint.config import _INTERNAL, _KEYS

    section = _readme().split("<!-- config-keys:start -->")[1].split("<!-- config-keys:end -->")[0]
    import re

    documented = set(re.findall(r"^\| `([a-z-]+)` \|", section, re.MULTILINE))
    keys = {k for k, name in _KEYS.items() if name not in _INTERNAL}
    assert documented == keys


def test_ci_runs_the_readme_test_command():
    readme = _readme()
    test_cmd = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest"
    assert test_cmd in readme
    assert "pip install torch==2.13.0 && pip install -e . && fsdp-lint fixtures/article_fsdp2.py --world-size 4" in readme
    with open(os.path.join(REPO, ".ci", "run")) as fh:
        script = fh.read()
    commands = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert "set -euo pipefail" in commands
    steps = [c for c in commands if c.startswith(("pip ", "python "))]
    assert " && ".join(steps) == test_cmd
    assert os.access(os.path.join(REPO, ".ci", "run"), os.X_OK)


def test_pre_commit_hook_definition():
    with open(os.path.join(REPO, ".pre-commit-hooks.yaml")) as fh:
        text = fh.read()
    hooks = {}
    for block in text.split("\n- ")[1:]:
        lines = {ln.strip() for ln in block.splitlines()}
        hooks[block.split("\n", 1)[0].replace("id:", "").strip()] = lines
    assert set(hooks) == {"fsdp-lint", "fsdp-lint-fix", "fsdp-lint-isolated"}
    for hook_id, lines in hooks.items():
        for required in ("types: [python]", "require_serial: true", "args: [--format, concise]"):
            assert required in lines, (hook_id, required)
    # the default runs the user's environment (the repository's dependencies, its torch)
    assert {"entry: fsdp-lint", "language: system"} <= hooks["fsdp-lint"]
    assert {"entry: fsdp-lint --fix", "language: system"} <= hooks["fsdp-lint-fix"]
    assert {"entry: fsdp-lint", "language: python"} <= hooks["fsdp-lint-isolated"]
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in text    # the CPU-torch note


def test_stderr_stays_clean_without_numpy():
    """torch CPU wheels do not need numpy and warn at import without it; a clean lint prints nothing
    on stderr (pre-commit and CI logs show stderr)."""
    probe = textwrap.dedent('''
        import sys
        sys.modules["numpy"] = None  # as in a fresh venv with only torch installed
        from fsdp_lint.cli import main
        main(["fixtures/article_fsdp1.py", "--world-size", "2", "--format", "concise"])
        ''')
    proc = run_subprocess(["-c", probe])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "Found 0 findings" in proc.stdout


def test_show_settings_names_the_config_world_size_and_rules(cli, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.fsdp-lint]\nworld-size = 16\nignore = ["FSD6"]\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    res = cli("--show-settings", "train.py", "--select", "FSD3", cwd=str(tmp_path))
    assert res.code == 0, res.err
    rows = dict(line.split(None, 1) if " " not in line.split("  ")[0] else
                (line.split("  ")[0], line.split("  ", 1)[1].strip()) for line in res.out.splitlines())
    assert rows["config file"] == "pyproject.toml"
    assert rows["world size"] == "16 (config)"
    assert rows["rules enabled"] == "2: FSD301, FSD302"


def test_quiet_drops_the_line_per_skipped_file_and_no_paths_lints_the_directory(cli, tmp_path):
    (tmp_path / "util.py").write_text("def add(a, b):\n    return a + b\n")
    loud = cli("util.py", cwd=str(tmp_path))
    assert loud.code == 0 and "not linted" in loud.err
    quiet = cli("util.py", "--quiet", cwd=str(tmp_path))
    assert quiet.code == 0 and quiet.err == ""
    walked = cli(cwd=str(tmp_path))             # ruff's default: `.`
    assert walked.code == 0 and "1 skipped" in walked.out


def test_bad_selector_hint_lists_every_code_family(cli):
    from fsdp_lint.check.rule import all_rules

    res = cli("fixtures/bad/fsdp2_no_root.py", "--select", "FSD999")
    assert res.code == 2
    families = sorted({r.code[:4] for r in all_rules()})
    hint = res.err.split("codes are ", 1)[1]
    assert [part.strip()[:4] for part in hint.split(";")[0].split(",")] == families
