"""Round 3 of the real-launch survey (benchmarks/realworld.md, "Round 3"): classes of setup code that a
simulated node answered differently from a real one.

Oracles: real torch (FSDP2 under the fake process group, via the replay with the real APIs), the real
framework where one is named."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

STAGE = os.path.join(REPO, "fixtures", "repos", "stage_engine")


@pytest.fixture
def in_stage(monkeypatch):
    monkeypatch.chdir(STAGE)
    yield
    for name in [n for n in sys.modules if n == "stagelm" or n.startswith("stagelm.")]:
        sys.modules.pop(name, None)


def test_a_project_helper_that_builds_the_mesh_in_module_globals_runs_before_the_stages_are_read(in_stage):
    # `init_distributed(...)` (from .utils) binds nothing, but the mesh it keeps in a module global is what
    # `get_model_container` reads back (the pipeline stages of this rank): left out of the setup slice,
    # the stage list was empty and the container's [0] failed (IndexError)
    res, _ = assert_plan_matches_torch(os.path.join(STAGE, "stagelm", "pretrain.py"), 8)
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], [""]]
    assert {u.shard_size for u in res.plan.units} == {8}
    assert not res.plan.unsupported        # a pipeline dimension of size 1 is one stage: the whole model
    assert not res.skipped_statements, res.skipped_statements


def test_a_pipeline_dimension_of_more_than_one_stage_is_still_refused(in_stage, cli):
    res = cli("stagelm/pretrain.py", "--world-size", "8", "--", "--pipeline-parallel-world-size", "2",
              "--num-pipeline-stages", "2", cwd=STAGE)
    assert res.code == 2
    assert "pipeline parallelism (mesh dimension 'pp')" in res.err


TELEMETRY = os.path.join(REPO, "fixtures", "repos", "telemetry_cli")


def test_configuring_a_client_package_that_is_not_installed_works_as_on_a_module(cli):
    # `usage_beacon.host = URL` in a telemetry manager (the client is an optional package, not installed):
    # the stand-in takes the attribute as the module would, and reads it back; the statement is not
    # skipped ('Missing' object has no attribute 'host') and the plan is the one torch builds
    import json

    import torch.nn as nn

    res = cli("src/trainkit/cli/train.py", "--world-size", "4", "--format", "json", cwd=TELEMETRY)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["replay"]["skipped_statements"] == []
    assert any("usage_beacon" in n and "not used by the model" in n for n in f["notes"]), f["notes"]
    assert [u["modules"] for u in f["plan"]["units"]] == [["blocks.0"], ["blocks.1"], ["blocks.2"], [""]]
    sys.path.insert(0, os.path.join(TELEMETRY, "src"))
    try:
        from trainkit.model import Net
    finally:
        sys.path.remove(os.path.join(TELEMETRY, "src"))
        for name in [n for n in sys.modules if n == "trainkit" or n.startswith("trainkit.")]:
            sys.modules.pop(name, None)
    assert f["model"]["numel"] == sum(p.numel() for p in Net(32).parameters())
    assert isinstance(Net(32), nn.Module)


def test_a_stand_in_module_keeps_the_attributes_set_on_it_as_a_module_does():
    import types

    from fsdp_lint.replay.imports import Missing

    uses = []
    real, stand_in = types.ModuleType("usage_beacon"), Missing("usage_beacon", lambda name, **kw: uses.append(name))
    for mod in (real, stand_in):
        mod.host = "https://beacon.example.com"
        mod.api_key = "pk"
        del mod.api_key
    assert stand_in.host == real.host
    assert isinstance(stand_in.api_key, Missing) and not hasattr(real, "api_key")
    assert "usage_beacon.host" in uses


STREAM_ARGS = os.path.join(REPO, "fixtures", "repos", "stream_args")


def test_a_project_module_that_refuses_to_import_without_a_data_package_is_a_note(cli):
    # training/trainer.py: `try: from shardstream import ... except ImportError: raise ImportError("needs the
    # shard streaming package") from exc`; the statement is skipped, and only the Trainer subclass's own
    # `get_train_dataloader` uses the name it should have bound: a data loader never changes the plan
    # (issue 15: a missing package is a refusal only where the model or the wrap uses it), so the plan is
    # reported and the skipped import is named in a note (it stopped the lint, exit 2, before)
    import importlib.util

    assert importlib.util.find_spec("shardstream") is None
    res = cli("training/train_lm.py", "--world-size", "8", "--", "--output_dir", "/tmp/stream_args_out",
              cwd=STREAM_ARGS)
    assert res.code in (0, 1), res.err
    assert "first: training/trainer.py:7: ImportError: training.trainer needs the shard streaming package" in res.out


def test_the_package_behind_a_chain_of_import_errors_is_the_one_python_could_not_find():
    from fsdp_lint.replay.imports import package_behind

    def chained(missing):
        try:
            try:
                __import__(missing)
            except ImportError as exc:
                raise ImportError("the project needs it") from exc
        except ImportError as outer:
            return outer

    assert package_behind(chained("shardstream.loader")) == "shardstream"
    assert package_behind(chained("json")) is None           # imported: nothing is missing
    assert package_behind(ValueError("no import involved")) is None


SUBMIT_JOB = os.path.join(REPO, "fixtures", "repos", "submit_job")


@pytest.fixture
def in_submit_job(monkeypatch):
    import submitit  # noqa: F401  the real launcher (the project's test extras install it)
    monkeypatch.chdir(SUBMIT_JOB)
    yield
    for name in [n for n in sys.modules if n == "vitrun" or n.startswith("vitrun.")]:
        sys.modules.pop(name, None)


def test_a_training_function_submitted_as_a_slurm_job_is_linted_as_task_0_of_that_job(in_submit_job, tmp_path):
    # `submitit.AutoExecutor(...).submit(Trainer(args))`: on the cluster the job's tasks run the pickled
    # callable with SLURM's environment; here it runs in the replay as task 0 of 16 (2 nodes), and the
    # worker's FSDP1 plan is the one real torch builds from the same file
    res, _ = assert_plan_matches_torch(os.path.join(SUBMIT_JOB, "vitrun", "run", "train.py"), 16,
                                       argv=["--nodes", "2", "--output-dir", str(tmp_path / "%j")])
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], [""]]
    assert res.plan.world_size == 16
    assert any("submits `Trainer` as a cluster job (submitit)" in n and "SLURM_NTASKS=16, 2 node(s)" in n
               for n in res.notes), res.notes
    assert "SLURM_PROCID" not in os.environ and "SUBMITIT_EXECUTOR" not in os.environ   # put back


def test_submitit_reads_the_simulated_job_environment_as_slurm_sets_it(monkeypatch):
    import submitit
    from fsdp_lint.replay.job_submission import slurm_env

    for key, value in slurm_env(32, 8, nodes=4).items():
        monkeypatch.setenv(key, value)
    env = submitit.JobEnvironment()
    assert (env.cluster, env.job_id, env.global_rank, env.local_rank, env.num_tasks, env.num_nodes, env.node) == \
        ("slurm", "1", 0, 0, 32, 4, 0)
    assert env.hostnames == ["node0", "node1", "node2", "node3"]


def test_a_stand_in_copies_as_an_object_does():
    # `copy.deepcopy(modality_transforms)` of a config holding stand-ins (torchvision not installed)
    import copy

    from fsdp_lint.replay.imports import Missing

    stand_in = Missing("T.Compose()", lambda name, **kw: None)
    stand_in.size = 224
    copied = copy.deepcopy({"rgb": stand_in})["rgb"]
    assert isinstance(copied, Missing) and copied.size == 224 and repr(copied) == repr(stand_in)


REMOTE_DATA = os.path.join(REPO, "fixtures", "repos", "remote_data")


def test_a_setup_that_waits_on_the_network_skips_that_statement_naming_it(cli):
    # a data set of remote shards asks each shard's size over HTTPS through a session that retries with
    # back-off (urllib3's Retry): on a node without network every attempt waited on name resolution until
    # the replay's deadline; then the first refusals failed at once and the replay ended, naming the
    # request (no plan, OLMo's remote .npy mixture). A GPU node has the network: the statement that needs
    # it is skipped as any statement needing what the simulated node lacks, named, and the model and its
    # wrap, which do not depend on it, give torch's plan
    import json

    import torch.nn as nn

    res = cli("remotedata/train.py", "--world-size", "4", "--format", "json", cwd=REMOTE_DATA)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    first = f["replay"]["skipped_statements"][0]
    assert (first["path"], first["line"]) == ("remotedata/io.py", 37)
    assert "the setup code waits on the network: it asks for data.example.org:443 at remotedata/io.py:37" in first["error"]
    assert any("setup statements failed here and were skipped" in n and "waits on the network" in n for n in f["notes"])
    layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
    assert f["model"]["numel"] == 1024 * 64 + 2 * sum(p.numel() for p in layer.parameters())
    assert [u["modules"] for u in f["plan"]["units"]] == [["layers.0"], ["layers.1"], [""]]
    assert "Traceback" not in res.err


def test_a_network_request_with_an_offline_fallback_answers_as_an_offline_machine(cli):
    # `requests.get(...)` in a try/except ConnectionError: refused at once (an ordinary error), the
    # script's default is used (vocabulary 1024) and the note names the request; the plan is torch's
    import json

    import torch.nn as nn

    res = cli("remotedata/train.py", "--world-size", "4", "--format", "json", "--", "--data", "none", cwd=REMOTE_DATA)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert any("the setup asked for the network (hub.example.org:443, at remotedata/io.py:50)" in n for n in f["notes"])
    layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
    assert f["model"]["numel"] == 1024 * 64 + 2 * sum(p.numel() for p in layer.parameters())
    assert [u["modules"] for u in f["plan"]["units"]] == [["layers.0"], ["layers.1"], [""]]


REMOTE_PRECISION = '''
import requests
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

CARD = "https://hub.example.org/models/lm/training.json"


def remote_dtype(url):
    for _ in range(6):
        try:
            return requests.get(url, timeout=5).json()["param_dtype"]
        except requests.exceptions.ConnectionError:
            continue
    return "float32"


def main():
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
    name = remote_dtype(CARD)
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, name))
    for layer in model:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


if __name__ == "__main__":
    main()
'''


def test_a_network_wait_that_decides_the_wrap_ends_the_replay_naming_it(cli, tmp_path):
    # the precision comes from a remote card, asked again and again: skipping the statement would plan
    # what the node never runs, so the replay ends on it, in one line
    (tmp_path / "train.py").write_text(REMOTE_PRECISION)
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "train.py: the setup code waits on the network: it asks for hub.example.org:443" in line
    assert "Traceback" not in res.err


def test_a_network_wait_that_decides_the_models_shape_through_a_trainer_class_is_refused(cli):
    # the depth comes from a remote card; the model is wrapped inside a Trainer class it is handed to:
    # skipping the statement would plan the config's default depth, so the replay ends on it
    res = cli("remotedata/train.py", "--world-size", "4", "--", "--depth", "card", cwd=REMOTE_DATA)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    assert "the setup code waits on the network: it asks for hub.example.org:443 at remotedata/io.py:44" in line
    assert line.endswith("what it computes decides the wrap's arguments (remotedata/train.py:48), so it is not skipped")


VOCAB_DATA = '''"""Tokens and their vocabulary, downloaded once into the run's data folder."""
from __future__ import annotations

import os

import requests


def vocabulary(url: str, root: str = "data") -> list[str]:
    path = os.path.join(root, os.path.basename(url))
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        with open(path, "w") as fh:
            fh.write(requests.get(url, timeout=5).text)
    with open(path) as fh:
        return fh.read().split()
'''

VOCAB_TRAIN = '''from __future__ import annotations

import argparse

import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from lmtrain.data import vocabulary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab-url", default="https://data.example.org/lm/vocab.txt")
    parser.add_argument("--dim", type=int, default=16)
    args = parser.parse_args()
    words = vocabulary(args.vocab_url)
    model = nn.Sequential(nn.Embedding(len(words), args.dim), nn.Linear(args.dim, args.dim))
    fully_shard(model)


if __name__ == "__main__":
    main()
'''


def test_a_download_refused_names_the_network_and_leaves_no_empty_file_behind(cli, tmp_path):
    # the download helper opens its file, then asks the network: refused, the statement was skipped and
    # the file left empty, and the vocabulary read from it planned an embedding of 0 rows (exit 0); now
    # the empty file is removed when the statement is skipped, so the read fails as on a node whose
    # download failed, and each lint names the network first
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'lmtrain'\n")
    (tmp_path / "lmtrain").mkdir()
    (tmp_path / "lmtrain" / "__init__.py").write_text("")
    (tmp_path / "lmtrain" / "data.py").write_text(VOCAB_DATA)
    (tmp_path / "lmtrain" / "train.py").write_text(VOCAB_TRAIN)
    for _ in range(2):
        res = cli("lmtrain/train.py", "--world-size", "2", "--no-cache", "--", "--dim", "32", cwd=str(tmp_path))
        assert res.code == 2, res.out
        line = res.err.strip().splitlines()[0]
        # the download's statement first, then the read of the file it would have written
        # the helper's `if not os.path.exists(path):` block (line 11), then the read of the file that failed in
        # the entry's skipped `words = ...` (line 16): the helper's line that opens it (line 15), as an error
        # that ends the replay is located (the innermost line of the project)
        assert ("lmtrain/train.py: lmtrain/data.py:11: the setup reads over the network (ConnectionError asking "
                "for data.example.org:443)") in line, line
        assert line.endswith("used later: lmtrain/data.py:15: FileNotFoundError: [Errno 2] No such file or "
                             "directory: 'data/vocab.txt')"), line
        assert not (tmp_path / "data" / "vocab.txt").exists()
