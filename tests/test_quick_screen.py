"""The quick screen (``fsdp_lint.entry.quick``) skips exactly the files the full screen skips for
"no nn.Module and no FSDP use", with the same message, on every file of the fixtures (real-shaped
repositories, frameworks, bad plans) and on the benchmark's plain files."""
from __future__ import annotations

import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))


def _files(tmp):
    import bench_lint

    bench_lint.make_plain_tree(tmp, 30)
    out = []
    for top in (os.path.join(REPO, "fixtures"), os.path.join(REPO, "benchmarks"), tmp):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return out


def test_the_quick_screen_skips_what_the_full_screen_skips(tmp_path):
    from fsdp_lint import engine
    from fsdp_lint.config import Settings
    from fsdp_lint.entry import project
    from fsdp_lint.entry.source import SourceError, read_source

    project.forget()
    quick = full = 0
    for path in _files(str(tmp_path)):
        try:
            facts = read_source(path)
        except SourceError:
            with pytest.raises(engine.LintError):
                engine.screen(path, Settings(), explicit=False)
            continue
        for explicit in (False, True):
            expected = engine.skip_reason(project.reach(path, facts), explicit)
            got = engine.screen(path, Settings(), explicit=explicit)
            assert (got.skipped if isinstance(got, engine.FileResult) else None) == expected, path
            if isinstance(got, engine.FileResult) and got.facts is None:
                quick += 1
            full += 1
    assert quick >= 30, "the benchmark's plain files, at least, take the quick path"
    assert full > 200
