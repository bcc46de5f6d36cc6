"""What the result cache and pre-commit cost, as ratios against floors, in one run.

    python benchmarks/bench_cache.py                 # 5 rounds, prints a Markdown table
    python benchmarks/bench_cache.py --repeat 9 --json cache.json

Cases (each a fresh subprocess, rounds interleaved so background load hits all cases alike; the
minimum over rounds, wall-clock and CPU (user+sys) of the child):

* ``hit``: ``fsdp-lint fixtures/article_fsdp2.py --world-size 4`` re-run with nothing changed (the
  cache warmed once before the rounds) against ``python -c pass`` -- goal <= 3x -- and against the
  same lint with ``--no-cache``;
* ``plain``: ``fsdp-lint DIR --no-cache`` on the 300 plain files of ``bench_lint.py`` (screened and
  skipped, torch never imported) against ``ruff check --no-cache DIR`` (``pip install ruff``) --
  goal <= 3x in CPU;
* ``pre-commit``: ``pre-commit run --files ...`` on a sample repository (the article's model and
  training file, 40 plain modules; ``pip install pre-commit``) with the default ``fsdp-lint`` hook
  (``language: system``, this checkout as the hook repository): the first run after a change to the
  model (a miss) and a re-run (a hit), against ``pre-commit run`` of a hook that runs ``true``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_lint import compile_bytecode, make_plain_tree, measure   # noqa: E402

ARTICLE = ["fixtures/article_fsdp2.py", "--world-size", "4"]


def _tool(name: str):
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    return found


def _sample_repo(root: str) -> list:
    """A training repository under git with pre-commit configured: the article's model and training
    file, 40 plain modules; returns the files a commit touching all of them passes."""
    os.makedirs(os.path.join(root, "src", "utils"), exist_ok=True)
    for name in ("article_model.py", "article_fsdp2.py"):
        shutil.copy(os.path.join(REPO, "fixtures", name), os.path.join(root, "src", name))
    make_plain_tree(os.path.join(root, "src", "utils"), 40)
    hook_repo = os.path.join(root, "..", "hookrepo")
    if not os.path.isdir(hook_repo):   # the hook definitions of this checkout, as a git repository
        os.makedirs(hook_repo)
        shutil.copy(os.path.join(REPO, ".pre-commit-hooks.yaml"), hook_repo)
        for args in (["init", "-q"], ["add", "."], ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "hooks"]):
            subprocess.run(["git", *args], cwd=hook_repo, check=True)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(root, ".pre-commit-config.yaml"), "w") as fh:
        fh.write(f"repos:\n  - repo: {os.path.abspath(hook_repo)}\n    rev: {rev}\n    hooks:\n"
                 f"      - id: fsdp-lint\n        args: [--format, concise, --world-size, '4']\n"
                 f"  - repo: local\n    hooks:\n      - id: floor\n        name: floor\n        entry: 'true'\n"
                 f"        language: system\n        types: [python]\n")
    with open(os.path.join(root, "pyproject.toml"), "w") as fh:
        fh.write('[project]\nname = "sample"\n')
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    files = []
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        files += [os.path.relpath(os.path.join(dirpath, n), root) for n in sorted(names) if n.endswith(".py")]
    return sorted(files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args()
    py = sys.executable
    compile_bytecode()
    env_path = os.path.dirname(py) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PATH"] = env_path              # the hook's `fsdp-lint` is this environment's
    os.environ.pop("FSDP_LINT_NO_CACHE", None)
    ruff, pre_commit = _tool("ruff"), _tool("pre-commit")
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        plain = os.path.join(tmp, "plain")
        make_plain_tree(plain, 300)
        lint = [py, "-m", "fsdp_lint", *ARTICLE, "--cache-dir", cache]
        subprocess.run(lint, cwd=REPO, check=True, capture_output=True)     # warm the cache once
        cases = {
            "python -c pass": ([py, "-c", "pass"], None),
            "hit": (lint, "13 units"),
            "no cache": ([py, "-m", "fsdp_lint", *ARTICLE, "--no-cache"], "13 units"),
            "plain": ([py, "-m", "fsdp_lint", plain, "--no-cache"], "300 skipped"),
        }
        if ruff:
            cases["ruff"] = ([ruff, "check", "--no-cache", "--quiet", "--exit-zero", plain], None)
        if pre_commit:
            sample = os.path.join(tmp, "sample")
            files = _sample_repo(sample)
            pc_env = dict(os.environ, PRE_COMMIT_HOME=os.path.join(tmp, "pc-home"))
            os.environ.update(PRE_COMMIT_HOME=pc_env["PRE_COMMIT_HOME"])
            subprocess.run([pre_commit, "install-hooks"], cwd=sample, check=True, capture_output=True)
            run = [pre_commit, "run", "--hook-stage", "pre-commit", "--files", *files]
            model = os.path.join(sample, "src", "article_model.py")
            touch = ("import sys; p = sys.argv[1]; t = open(p).read(); "
                     "open(p, 'w').write(t + '\\n# edited %d\\n' % t.count('# edited'))")
            cases["pre-commit floor"] = (["sh", "-c", f"cd {sample} && {pre_commit} run floor --files {' '.join(files)}"], None)
            cases["pre-commit miss"] = (["sh", "-c", f"cd {sample} && {py} -c \"{touch}\" {model} && "
                                              f"{pre_commit} run fsdp-lint --files {' '.join(files)}"], None)
            cases["pre-commit hit"] = (["sh", "-c", f"cd {sample} && {pre_commit} run fsdp-lint --files {' '.join(files)}"],
                                       None)
        res = measure(cases, args.repeat)

    def row(label, case, floor, key):
        a, b = res[case][key], res[floor][key]
        return f"| {label} | {a:.3f} s | {b:.3f} s | {a / b:.2f}× |"

    print(f"\n{args.repeat} rounds, minimum per case; python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print("| case | time | floor | ratio |\n|---|---|---|---|")
    for key, unit in (("wall_min", "wall"), ("cpu_min", "CPU")):
        print(row(f"cache hit, article_fsdp2.py ÷ `python -c pass` ({unit})", "hit", "python -c pass", key))
        print(row(f"cache hit ÷ `--no-cache` ({unit})", "hit", "no cache", key))
        if ruff:
            print(row(f"300 plain files `--no-cache` ÷ `ruff check --no-cache` ({unit})", "plain", "ruff", key))
        if pre_commit:
            print(row(f"pre-commit, model changed (miss) ÷ a `true` hook ({unit})", "pre-commit miss", "pre-commit floor", key))
            print(row(f"pre-commit, nothing changed (hit) ÷ a `true` hook ({unit})", "pre-commit hit", "pre-commit floor", key))
    print()
    for name, r in res.items():
        print(f"  {name:20s} wall min {r['wall_min']:.3f} s  median {r['wall_median']:.3f} s   "
              f"CPU min {r['cpu_min']:.3f} s  median {r['cpu_median']:.3f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"repeat": args.repeat, "cases": res}, fh, indent=2)


if __name__ == "__main__":
    main()
