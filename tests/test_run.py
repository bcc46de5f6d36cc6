"""`--run` (issue 4): short real FSDP sessions on CPU (2 gloo ranks) confirm the static findings.

Most runs go through the CLI in this process (torch is imported once; the ranks are forked from
it); torchrun and Ctrl-C go through real subprocesses. After every test no process started by it
may be left (checked through /proc).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO

BAD = os.path.join(REPO, "fixtures", "bad")
RUN_FIX = os.path.join(REPO, "fixtures", "run")
SMALL_ARTICLE = "Transformer(num_layers=2, hidden_dim=128, num_heads=4, ffn_dim=256)"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="--run tests use /proc and fork")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _children(pid: int):
    """PIDs of the live (non-zombie) processes whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return out


def _with_marker(marker: str):
    """PIDs of live processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if marker in cmd and stat[stat.rindex(")") + 2:].split()[0] != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes():
    import multiprocessing

    from fsdp_lint import isolation

    before = set(_children(os.getpid()))
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # the fork server that lints files lives as long as this process (it is not a rank)
        left = set(_children(os.getpid())) - before - {isolation.server_pid()}
        if not left and not multiprocessing.active_children():
            return
        time.sleep(0.1)
    pytest.fail(f"processes left behind: {sorted(left)} {multiprocessing.active_children()}")


def _cli(*argv: str):
    """fsdp-lint in this process: (exit code, stdout, stderr)."""
    from fsdp_lint.cli import main

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(argv))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def _findings(doc, name):
    for f in doc["files"]:
        if f["path"].endswith(name):
            return f["findings"]
    raise AssertionError(f"{name} not in the report: {[f['path'] for f in doc['files']]}")


def _run_file(doc, name):
    for f in doc["run"]["files"]:
        if f["path"].endswith(name):
            return f
    raise AssertionError(f"{name} not in the run summary")


def _only(findings, code):
    hits = [f for f in findings if f["code"] == code]
    assert hits, f"no {code} among {[(f['code'], f['message']) for f in findings]}"
    return hits


# --------------------------------------------------------------------------------------------
# one run over four bad fixtures: a torch exception, two silent divergences, a stale optimizer
# --------------------------------------------------------------------------------------------
BAD_FILES = ["fsdp1_lora_mixed.py", "fsdp2_no_root.py", "fsdp1_tied_split.py", "fsdp2_optimizer_before.py"]


@pytest.fixture(scope="module")
def bad_run():
    code, out, err = _cli(*[os.path.join("fixtures", "bad", f) for f in BAD_FILES], "--run", "--format", "json",
                          "--run-timeout", "240")
    assert code == 1, err
    return json.loads(out)


def test_fsd201_confirmed_by_torchs_exception_at_wrap(bad_run):
    for f in _only(_findings(bad_run, "fsdp1_lora_mixed.py"), "FSD201"):
        assert f["confirmed"] is True
        # what torch raised, in the wrap phase
        assert "ValueError" in f["evidence"] and "in wrap" in f["evidence"]
        assert "requires_grad" in f["evidence"] and "use_orig_params=False" in f["evidence"]
    run = _run_file(bad_run, "fsdp1_lora_mixed.py")
    assert run["status"] == "raised in wrap" and run["error"]["type"] == "ValueError"


def test_fsd301_confirmed_leftover_parameters_differ_across_ranks(bad_run):
    (f,) = _only(_findings(bad_run, "fsdp2_no_root.py"), "FSD301")
    assert f["confirmed"] is True
    assert "differ across ranks" in f["evidence"]
    for name in ("tok_embeddings.weight", "norm.weight", "output.weight"):
        assert name in f["evidence"]
    run = _run_file(bad_run, "fsdp2_no_root.py")
    assert run["status"] == "completed" and run["steps_done"] == 2
    # exactly the leftovers diverged: the sharded blocks are identical on both ranks
    assert {d["fqn"] for d in run["diverged"]} == {"tok_embeddings.weight", "norm.weight", "output.weight"}
    assert all(d["max_diff"] > 0 for d in run["diverged"])


def test_fsd401_fsdp1_confirmed_tied_weights_diverge(bad_run):
    findings = _findings(bad_run, "fsdp1_tied_split.py")
    (f,) = _only(findings, "FSD401")
    assert f["confirmed"] is True
    assert "tied weights are no longer equal" in f["evidence"]
    assert "wte.weight" in f["evidence"] and "lm_head.weight" in f["evidence"]
    # a silent failure: torch raised nothing
    assert _run_file(bad_run, "fsdp1_tied_split.py")["status"] == "completed"
    assert not [x for x in findings if x["code"] == "RUN"]


def test_fsd501_confirmed_optimizer_holds_stale_tensors(bad_run):
    (f,) = _only(_findings(bad_run, "fsdp2_optimizer_before.py"), "FSD501")
    assert f["confirmed"] is True
    assert "0 of them the model's parameters after wrapping" in f["evidence"]
    # and the consequence: nothing trains
    assert re.search(r"; 0 of the [1-9]\d* trainable model parameters rank 0 holds changed in 2 steps", f["evidence"])


FSDP1_ORIG_PARAMS_OPTIMIZER_FIRST = """
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


class Block(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.fc2(self.fc1(x).relu())


class Net(nn.Module):
    def __init__(self, vocab=100, dim=32, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.Sequential(*[Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.layers(self.embed(tokens)))


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
"""


def test_fsd501_not_confirmed_when_torch_keeps_the_parameter_objects(tmp_path):
    # FSDP1 with use_orig_params=True keeps the Parameter objects: the early optimizer still trains
    path = tmp_path / "train.py"
    path.write_text(FSDP1_ORIG_PARAMS_OPTIMIZER_FIRST)
    code, out, err = _cli(str(path), "--run", "--format", "json")
    doc = json.loads(out)
    (f,) = _only(doc["files"][0]["findings"], "FSD501")
    assert f["confirmed"] is False, f["evidence"]
    assert "holds only the model's parameters" in f["evidence"]
    changed, held = map(int, re.search(r"(\d+) of the (\d+) trainable", f["evidence"]).groups())
    assert changed == held > 0


def test_run_summary_and_exit_code(bad_run):
    run = bad_run["run"]
    assert (run["backend"], run["device"], run["ranks"], run["steps"], run["mode"]) == ("gloo", "cpu", 2, 2, "spawn")
    assert run["wall_time_s"] > 0
    assert run["confirmed"] >= 4
    assert [f["path"] for f in run["files"]] == [os.path.join("fixtures", "bad", f) for f in BAD_FILES]
    for f in run["files"]:
        if f["status"] == "completed":
            # on CPU: the tensor memory torch's tracker counted, by category; RSS only beside it
            assert f["memory_measure"].endswith("tensor memory")
            assert len(f["peak_memory_bytes"]) == 2 and all(p > 0 for p in f["peak_memory_bytes"])
            assert sum(f["memory_breakdown"].values()) == f["peak_memory_bytes"][0]
            assert len(f["rss_peak_bytes"]) == 2
            assert all(rss > p for rss, p in zip(f["rss_peak_bytes"], f["peak_memory_bytes"]))


# --------------------------------------------------------------------------------------------
# the article's fixtures: nothing confirmed as an error, collectives as the static layout says
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture,extra", [("article_fsdp1.py", ()), ("article_fsdp2.py", ("--world-size", "8"))])
def test_article_fixtures_measured_collectives_equal_static(fixture, extra):
    path = os.path.join("fixtures", fixture)
    code, out, err = _cli(path, "--model", f"{path}:{SMALL_ARTICLE}", "--run", "--format", "json",
                          "--run-timeout", "240", *extra)
    assert code in (0, 1), err
    doc = json.loads(out)
    (res,) = doc["files"]
    assert res["model"]["numel"] < 1_000_000        # the small variant really ran
    assert not [f for f in res["findings"] if f["severity"] == "error" and f["confirmed"]]
    run = _run_file(doc, fixture)
    assert run["status"] == "completed" and run["error"] is None
    # like with like: the static side is recomputed for the run's 2 ranks (the report's plan is
    # for --world-size), with activations for the run's own inputs, beside the tracker's tensor memory
    static = run["static"]
    assert static["world_size"] == doc["run"]["ranks"] == 2
    assert res["plan"]["world_size"] == (8 if extra else 2)
    peak = max(run["peak_memory_bytes"])
    assert abs(static["memory_per_rank_bytes"] - peak) <= 0.25 * peak, (static["memory_per_rank_bytes"], peak)
    measured = run["measured"]
    for key in ("all_gathers_per_step", "reduce_scatters_per_step", "all_gather_bytes_per_step",
                "reduce_scatter_bytes_per_step"):
        assert measured[key] == static[key] > 0, key
    if extra:
        return
    plan = res["plan"]
    assert measured["all_gathers_per_step"] == plan["all_gathers_per_step"] > 0
    assert measured["reduce_scatters_per_step"] == plan["reduce_scatters_per_step"] > 0
    static_ag = sum(u["all_gather_bytes"] * u["all_gathers_per_step"] for u in plan["units"])
    static_rs = sum(u["reduce_scatter_bytes"] * u["reduce_scatters_per_step"] for u in plan["units"])
    assert measured["all_gather_bytes_per_step"] == static_ag
    assert measured["reduce_scatter_bytes_per_step"] == static_rs
    # every step, not only the last, issued the same collectives
    assert all(s["all_gather"] == plan["all_gathers_per_step"] for s in measured["per_step"])


FABRIC_FSDP = os.path.join("fixtures", "repos", "fabric_devices", "examples", "fsdp", "train.py")


def test_run_starts_as_many_ranks_as_the_launch_it_followed():
    """``Fabric(devices=4)`` run as ``python train.py`` starts 4 processes: the lint plans 4 ranks, and
    ``--run`` without ``--nproc`` runs those 4 (it ran 2 and compared them with a 2-rank estimate);
    ``--nproc`` still decides; files whose launches differ are refused in one line, naming each."""
    code, out, err = _cli(FABRIC_FSDP, "--run", "--format", "json", "--steps", "1", "--run-timeout", "240")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["files"][0]["plan"]["world_size"] == 4
    assert doc["run"]["ranks"] == 4 and doc["run"]["files"][0]["status"] == "completed", doc["run"]
    assert doc["run"]["files"][0]["static"]["world_size"] == 4
    code, out, err = _cli(FABRIC_FSDP, "--run", "--nproc", "2", "--format", "json", "--steps", "1")
    assert code in (0, 1), err
    assert json.loads(out)["run"]["ranks"] == 2
    code, out, err = _cli(FABRIC_FSDP, os.path.join("fixtures", "bad", "fsdp2_no_root.py"), "--run",
                          "--format", "concise")
    assert code == 2
    line = next(x for x in err.splitlines() if x.startswith("fsdp-lint: error: --run:"))
    assert "different world sizes" in line and "train.py: 4" in line and "fsdp2_no_root.py: 2" in line
    assert "--nproc" in line


# --------------------------------------------------------------------------------------------
# what no rule predicts, inputs, bad options
# --------------------------------------------------------------------------------------------
def test_unpredicted_error_is_its_own_finding():
    path = os.path.join("fixtures", "run", "fsdp2_forward_bug.py")
    code, out, err = _cli(path, "--run", "--format", "json")
    assert code == 1, err
    doc = json.loads(out)
    (f,) = _only(doc["files"][0]["findings"], "RUN")
    with open(os.path.join(REPO, path)) as fh:
        bug_line = next(i for i, line in enumerate(fh, 1) if ".reshape(" in line)
    assert f["severity"] == "error" and f["confirmed"] is True
    assert f["line"] == bug_line
    assert "RuntimeError" in f["message"] and "forward (step 1)" in f["message"]
    assert f"fsdp2_forward_bug.py:{bug_line} in forward" in f["message"]     # the traceback's last frame
    # SARIF describes the code no rule owns
    code, out, _ = _cli(path, "--run", "--format", "sarif")
    sarif = json.loads(out)["runs"][0]
    (result,) = [r for r in sarif["results"] if r["ruleId"] == "RUN"]
    assert sarif["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "RUN"
    assert result["properties"]["confirmed"] is True
    # text: the finding line says it is confirmed, the statistics table has a confirmed column
    code, out, _ = _cli(path, "--run", "--format", "concise", "--statistics")
    assert f"fsdp2_forward_bug.py:{bug_line}:1: RUN [error]" in out and out.split("\n")[0].endswith("(confirmed)")
    header = next(line for line in out.splitlines() if line.startswith("count"))
    assert header.split() == ["count", "code", "name", "severity", "confirmed"]
    assert "--run: gloo on cpu, 2 ranks (spawn), 2 steps" in out


def test_inputs_that_cannot_be_inferred_ask_for_input_shape():
    path = os.path.join("fixtures", "run", "fsdp2_custom_first_layer.py")
    code, out, err = _cli(path, "--run", "--format", "concise")
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("fsdp-lint: error: --run: cannot infer inputs for Encoder (first layer: PatchEmbed)")
    assert "--input-shape" in line and "example_inputs()" in line
    code, out, err = _cli(path, "--run", "--format", "json", "--input-shape", "2,8,24")
    assert code == 0, err
    run = _run_file(json.loads(out), "fsdp2_custom_first_layer.py")
    assert run["status"] == "completed" and run["inputs"].startswith("--input-shape 2,8,24")


@pytest.mark.parametrize("args,needle", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--input-shape", "2,x"], "--input-shape must be positive integers"),
    (["--run-timeout", "0"], "--run-timeout must be a positive number of seconds"),
])
def test_bad_run_options_are_one_line_exit_2(args, needle):
    code, out, err = _cli(os.path.join("fixtures", "bad", "fsdp2_no_root.py"), "--run", *args)
    assert code == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], err


# --------------------------------------------------------------------------------------------
# never hang, never leak
# --------------------------------------------------------------------------------------------
def test_rank_past_the_timeout_is_killed_and_named():
    path = os.path.join("fixtures", "run", "fsdp2_slow_rank.py")
    start = time.monotonic()
    code, out, err = _cli(path, "--run", "--run-timeout", "15", "--format", "concise")
    elapsed = time.monotonic() - start
    assert code == 2
    assert ("--run: rank 1 did not finish within 15 s (last phase: inputs (step 1)); "
            "waiting for it: rank 0 in forward (step 1); all ranks were stopped") in err
    assert elapsed < 15 + 45          # the deadline held (the static pass is not counted in it)
    # (the autouse fixture checks that both ranks are gone)


def test_rank_that_dies_is_named_at_once():
    path = os.path.join("fixtures", "run", "fsdp2_rank_dies.py")
    start = time.monotonic()
    code, out, err = _cli(path, "--run", "--run-timeout", "240", "--format", "concise")
    assert code == 2
    assert "--run: rank 1 exited with code 7 during phase 'inputs (step 1)'; all ranks were stopped" in err
    assert time.monotonic() - start < 120     # not the 240 s deadline: rank 0 was stopped at once


def _unique_copy(src: str, tmp_path) -> str:
    """A copy of a fixture under a name no other process has in its command line."""
    import shutil
    import uuid

    dst = tmp_path / f"{os.path.splitext(os.path.basename(src))[0]}_{uuid.uuid4().hex[:10]}.py"
    shutil.copy(os.path.join(REPO, src), dst)
    return str(dst)


def _default_sigint():
    # a test session started in the background (`python -m pytest &` in a script) inherits SIGINT
    # ignored, and so would fsdp-lint: give it the terminal's default, as an interactive shell does
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_no_process(tmp_path):
    marker = _unique_copy(os.path.join("fixtures", "run", "fsdp2_slow_rank.py"), tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "fsdp_lint", marker, "--run", "--run-timeout", "300"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)

    def ranks():   # forks of fsdp-lint (its command line); not the lint server or the watchdog
        return [p for p in _children(proc.pid) if p in _with_marker(marker)]

    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(ranks()) < 2 and proc.poll() is None:
            time.sleep(0.2)
        assert len(ranks()) >= 2, "the ranks never started"
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)        # what a terminal's Ctrl-C does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    time.sleep(0.5)
    assert _with_marker(marker) == []


@pytest.fixture
def torchrun_env(tmp_path):
    """The environment for a torchrun: its log folders (``torchelastic_*``) go to a temporary folder
    of the test, removed afterwards, not to the machine's /tmp."""
    import shutil

    tmp = tmp_path / "torchrun-tmp"
    tmp.mkdir()
    yield dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp))
    shutil.rmtree(tmp, ignore_errors=True)


def test_under_torchrun_each_process_is_one_rank(tmp_path, torchrun_env):
    path = _unique_copy(os.path.join("fixtures", "bad", "fsdp2_no_root.py"), tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fsdp_lint", "--", path, "--run", "--format", "json", "--exit-zero"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=torchrun_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)                 # only rank 0 printed a report
    run = doc["run"]
    assert (run["mode"], run["ranks"], run["backend"]) == ("torchrun", 2, "gloo")
    (f,) = _only(doc["files"][0]["findings"], "FSD301")
    assert f["confirmed"] is True and "differ across ranks" in f["evidence"]
    assert _with_marker(os.path.basename(path)) == []
    # torchrun's log folders went to the test's temporary folder (the fixture removes it)
    assert [d for d in os.listdir(torchrun_env["TMPDIR"]) if d.startswith("torchelastic_")]


def _json_paths(obj, prefix=""):
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            if not p.endswith("breakdown"):       # a map: category -> bytes
                out |= _json_paths(v, p)
    elif isinstance(obj, list):
        for v in obj:
            out |= _json_paths(v, prefix + "[]")
    return out


def test_every_run_field_is_documented_in_the_readme(bad_run):
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        section = fh.read().split("<!-- json-schema:start -->")[1].split("<!-- json-schema:end -->")[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))
    produced = _json_paths({"run": bad_run["run"]})
    assert "run.files[].error.phase" in produced and "run.files[].diverged[].max_diff" in produced
    assert produced - documented == set()
    assert {p for p in documented if p.startswith("run")} - produced == set()


def test_under_torchrun_a_late_rank_is_named_and_every_rank_exits(tmp_path, torchrun_env):
    marker = _unique_copy(os.path.join("fixtures", "run", "fsdp2_slow_rank.py"), tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fsdp_lint", "--", marker, "--run", "--run-timeout", "60", "--format", "concise"]
    # rank 1 never finishes whatever the deadline: a deadline that leaves time for the ranks to start
    # (import torch, replay) on a loaded machine keeps the test independent of the machine's speed
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400, env=torchrun_env)
    assert proc.returncode != 0
    assert ("fsdp-lint: error: --run: rank 1 did not finish within 60 s (last phase: inputs (step 1)); "
            "waiting for it: rank 0 in forward (step 1)") in proc.stderr, proc.stderr[-3000:]
    assert _with_marker(marker) == []


def test_run_after_the_parent_used_parallel_cpu_ops(tmp_path):
    """Forked ranks of a process that already ran a parallel CPU op (a test session, a notebook)
    must not deadlock in their first parallel op (the parent's OpenMP pool does not survive fork)."""
    script = tmp_path / "warm_then_run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        x = torch.randn(1500, 1500)
        (x @ x).sum()
        from fsdp_lint.cli import main
        sys.argv = ["fsdp-lint", {os.path.join(BAD, "fsdp2_no_root.py")!r}, "--run", "--format", "json",
                    "--run-timeout", "90"]
        main()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [f["confirmed"] for f in _findings(doc, "fsdp2_no_root.py") if f["code"] == "FSD301"] == [True]
