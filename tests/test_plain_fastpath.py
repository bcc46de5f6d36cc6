"""A command whose files are all plain prints its report before click is imported
(``fastpath.plain_output``), byte for byte what the full command line prints, with the same exit code;
and the text-only screen (``entry.scan``) reads import statements as the syntax tree does, or says it
cannot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO

_CONSOLE = textwrap.dedent('''
    import json, sys
    from fsdp_lint.console import main
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"code": code, "click": "click" in sys.modules}), file=sys.stderr)
''')
_FULL = "import sys; from fsdp_lint.cli import main; main()"


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return {**env, "PYTHONPATH": REPO, "FSDP_LINT_NO_CACHE": "1"}


def _both(root, *argv):
    fast = subprocess.run([sys.executable, "-c", _CONSOLE, *argv], cwd=root, capture_output=True, text=True,
                          timeout=600, env=_env())
    lines = fast.stderr.splitlines(keepends=True)
    status = json.loads(lines[-1])
    full = subprocess.run([sys.executable, "-c", _FULL, *argv], cwd=root, capture_output=True, text=True,
                          timeout=600, env=_env())
    assert (fast.stdout, "".join(lines[:-1]), status["code"]) == (full.stdout, full.stderr, full.returncode), argv
    return fast.stdout, "".join(lines[:-1]), status


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(text))


def test_plain_files_print_as_the_full_command_line_without_click(tmp_path):
    root = str(tmp_path / "repo")
    _write(root, "pyproject.toml", "[tool.fsdp-lint]\nworld-size = 4\nignore = ['FSD001']\n")
    _write(root, "tools/paths.py", '''\
        """Path helpers."""
        import os  # noqa: F401
        from os.path import (join,  # the one we use
                             exists)


        def data_dir():
            return join("/data", "x") if exists("/data") else None
        ''')
    _write(root, "tools/cli.py", '"""Say import things in prose: the syntax tree decides."""\nimport sys\n')
    _write(root, "tools/rel.py", "from . import paths\n")          # a project import: the full screen
    _write(root, "notes.py", 'VERSION = "1.0"  # fsdp-lint: noqa: FSD301\n')
    out, err, status = _both(root, "tools", "notes.py")
    assert status["code"] == 0 and not status["click"], (out, err)
    assert "4 skipped" in out and "notes.py: not linted" in err
    out, err, status = _both(root, "-q", "--format", "concise", "--world-size", "8", "tools", "notes.py")
    assert not status["click"] and not err

    # a syntax error: reported as before (the full command line), exit code 2
    _write(root, "tools/broken.py", "def f(:\n    pass\n")
    out, err, status = _both(root, "tools")
    assert status["code"] == 2 and status["click"] and "broken.py:1:7: syntax error" in err
    os.unlink(os.path.join(root, "tools", "broken.py"))
    # a model among them: linted by the full command line, the plain files skipped as before
    _write(root, "model.py", "import torch.nn as nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n"
                             "        super().__init__()\n        self.l = nn.Linear(4, 4)\n")
    out, err, status = _both(root, "tools", "model.py")
    assert status["click"] and "3 skipped" in out and "in 1 file;" in out
    # a wrong setting, an option the fast path does not read: the full command line
    _, err, status = _both(root, "tools", "--world-size", "0")
    assert status["code"] == 2 and status["click"]
    _, _, status = _both(root, "tools", "--statistics")
    assert status["click"]


def test_import_candidates_read_what_the_syntax_tree_reads():
    from fsdp_lint.entry.quick import ImportsOnly
    from fsdp_lint.entry.scan import import_candidates

    def same(text):
        got = import_candidates(text)
        want = [(i.module, i.level, i.names) for i in ImportsOnly("x.py", text).imports]
        assert got is not None, text
        assert sorted((i.module, i.level, i.names) for i in got) == sorted(want), text

    same("import os\nimport a . b as c, d\nfrom ..m import x as y, z\nfrom . import (p,  # c\n  q,\n)\n")
    same("def f():\n    from a.b import *\n    # import nothing here\n")
    same("from.x import y\n")
    for text in ('s = """\nimport os  # """; import sys\n',     # a string ends in what reads as a comment
                 "x = 1; import os\n", "if x: import os\n", "from a \\\n    import b\n",
                 '"""We import data."""\nimport os\n', "import ﬁle\n"):
        assert import_candidates(text) is None, text


def test_parses_only_where_ast_parse_certainly_succeeds():
    from fsdp_lint.entry.scan import parses

    assert parses("x.py", "import os\nx = [i for i in range(3)]\n")
    assert not parses("x.py", "def f(:\n")
    assert not parses("x.py", "x = '\\d'\n")                  # a warning: ast.parse shows it
    assert not parses("x.py", "x = " + "-" * 2000 + "1\n")     # deep enough to near the limit
