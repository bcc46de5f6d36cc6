"""Golden outputs for the article fixtures: the exact text/JSON a user sees.

A change to any stage (plan, layout, report, a rule firing on a correct plan) shows up here as a diff.
When the change is intended, regenerate every golden file with one command and review the diff:

    python -m pytest tests/test_golden.py --update-goldens
    git diff tests/golden/
"""
import difflib
import os

import pytest

from conftest import REPO

GOLDEN_DIR = os.path.join(REPO, "tests", "golden")

# golden file -> fsdp-lint arguments (run from the repository root)
CASES = {
    "article_fsdp2.txt": ["fixtures/article_fsdp2.py", "--world-size", "4"],
    "article_fsdp2_params.txt": ["fixtures/article_fsdp2.py", "--world-size", "4", "--layout", "params"],
    "article_fsdp1_ranks.txt": ["fixtures/article_fsdp1.py", "--world-size", "4", "--layout", "ranks"],
    "article_fsdp2.json": ["fixtures/article_fsdp2.py", "--world-size", "4", "--format", "json"],
    "article_fsdp1.json": ["fixtures/article_fsdp1.py", "--world-size", "4", "--format", "json", "--layout", "ranks"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(cli, update_goldens, name):
    res = cli(*CASES[name])
    assert res.code == 0, f"fsdp-lint {' '.join(CASES[name])} exited {res.code}: {res.err}"
    path = os.path.join(GOLDEN_DIR, name)
    if update_goldens:
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(res.out)
        return
    assert os.path.exists(path), f"{path} is missing: run python -m pytest tests/test_golden.py --update-goldens"
    with open(path, encoding="utf-8") as fh:
        expected = fh.read()
    if res.out != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), res.out.splitlines(True),
                                            f"tests/golden/{name}", "fsdp-lint " + " ".join(CASES[name])))
        pytest.fail(f"output differs from tests/golden/{name}; if intended, run "
                    f"`python -m pytest tests/test_golden.py --update-goldens` and review the diff\n{diff[:6000]}")


def test_no_stale_golden_files():
    present = {n for n in os.listdir(GOLDEN_DIR) if not n.startswith(".")} if os.path.isdir(GOLDEN_DIR) else set()
    assert present == set(CASES), "tests/golden/ and CASES disagree"
