"""Causes, not consequences (issue 15, item 5).

* A skipped failing statement that leaves state half-set (a validator that fills in the vocabulary
  size from a tokenizer file this machine lacks; then the model is built from the default -1): the
  error names the skipped statement and its failure first, the later failure after it.
* A package that is not installed, used only by code outside the model -- the SDK base class of a
  checkpoint client (mixed with a config base: the stand-in keeps the MRO), a return annotation
  ``lance.LanceDataset | None`` of a data source -- is a note; the plan equals real torch's.
* A stand-in among a wrap call's arguments (a float8 all-gather policy from torchao, not installed)
  is a refusal naming the package: the precision would be planned without it.
* A stand-in base class instantiated while the model is built is a use by the model.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

REPOS = os.path.join(REPO, "fixtures", "repos")
VALIDATED = os.path.join(REPOS, "validated_cfg")
CKPT = os.path.join(REPOS, "ckpt_client")


def test_a_skipped_validator_is_named_before_its_consequence(cli):
    res = cli("vtrain/train.py", "--world-size", "8", "--", "--config", "configs/small.yaml", cwd=VALIDATED)
    assert res.code == 2, res.out
    [line] = res.err.strip().splitlines()[:1]
    # the skipped statement first (its file, line and failure), the consequence after it
    assert line.startswith("fsdp-lint: error: vtrain/train.py: vtrain/config.py:")
    cause = line.index("FileNotFoundError: [Errno 2] No such file or directory: 'assets/tokenizer.json'")
    later = line.index("vtrain/model.py:17: RuntimeError: Trying to create tensor with negative dimension -1")
    assert cause < later and "(skipped; what it would have set up was used later:" in line


def test_an_unrelated_skip_is_not_blamed(cli, tmp_path):
    """A skipped statement that acted on other objects (a logger, a metrics dict) is not the cause of a
    later failure of the model's own arguments."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(
        "import json\nimport torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n\n"
        "metrics = {}\nmetrics.update(json.load(open('/nonexistent/metrics.json')))\n"
        "dims = {'hidden': -4}\n"
        "model = fully_shard(nn.Linear(8, dims['hidden']))\n")
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2
    assert "train.py:8:" in res.err and "metrics.json" not in res.err and "negative dimension" in res.err


def test_packages_only_non_model_code_uses_are_a_note_and_the_plan_equals_torch(monkeypatch):
    monkeypatch.chdir(CKPT)
    res, _ = assert_plan_matches_torch(os.path.join(CKPT, "ckptrain", "train.py"), 4)
    assert [u.modules for u in res.plan.units] == [["0"], ["1"], ["2"], ["3"], [""]]
    assert "not installed here, stood in for (not used by the model): objstore_sdk, lance" in res.notes


def test_a_stand_in_among_the_wrap_arguments_is_refused(cli, tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"
        "from torchao.float8 import Float8AllGatherPolicy\n\n"
        "model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)])\n"
        "policy = Float8AllGatherPolicy(param_dtype='float8_e4m3fn')\n"
        "for block in model:\n    fully_shard(block, mp_policy=policy)\nfully_shard(model)\n")
    res = cli("train.py", "--world-size", "8", cwd=str(tmp_path))
    assert res.code == 2 and "internal error" not in res.err
    assert res.err.startswith("fsdp-lint: error: train.py:8: the wrap uses `Float8AllGatherPolicy`")
    assert "`torchao` is not installed: pip install torchao" in res.err


def test_a_stand_in_base_class_built_inside_the_model_is_a_model_use(cli, tmp_path):
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"
        "from fastnorm import FusedRMSNorm\n\n\n"
        "class Norm(FusedRMSNorm):\n    pass\n\n\n"
        "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.norm = Norm(64)\n        self.proj = nn.Linear(64, 64)\n\n\n"
        "model = nn.Sequential(Block(), Block())\nfor block in model:\n    fully_shard(block)\nfully_shard(model)\n")
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    assert res.code == 2
    assert "the model uses `FusedRMSNorm`" in res.err and "pip install fastnorm" in res.err


def test_push_to_hub_creates_no_repository_and_says_so(cli, tmp_path):
    """Creating the hub repository (a Trainer's ``init_hf_repo`` with ``push_to_hub=True``, TRL's
    completion logs, a script's own ``HfApi().create_repo``) is taken as done, never attempted."""
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom huggingface_hub import HfApi\nfrom torch.distributed.fsdp import fully_shard\n\n"
        "repo = HfApi().create_repo('me/run-42', exist_ok=True)\n"
        "width = 8 if repo.repo_id == 'me/run-42' else 4\n"
        "model = nn.Sequential(nn.Linear(8, width), nn.Linear(width, 8))\n"
        "for m in model:\n    fully_shard(m)\nfully_shard(model)\n")
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert "note: push_to_hub: the hub repository me/run-42 is not created by a lint" in res.out
    assert "144 params" in res.out


DICT_CFG = os.path.join(REPOS, "dict_cfg_cli")


def test_a_config_class_built_on_a_missing_package_names_the_package(cli):
    # `class DefaultingDict(addict.Dict)` with addict not installed: the stand-in base is an empty class,
    # so the first attribute read of a config key fails; the cause is the missing package, not the
    # subclass (under plain python the import itself fails: the script needs `pip install addict`)
    res = cli("src/dictcfg/cli/train.py", "--world-size", "4", "--", "examples/tiny.yaml", cwd=DICT_CFG)
    assert res.code == 2 and "Traceback" not in res.err
    [line] = res.err.strip().splitlines()[:1]
    assert "'DefaultingDict' object has no attribute" in line
    assert "`addict` is not installed here (pip install addict)" in line


def test_a_name_an_installed_package_lacks_is_a_version_mismatch_never_not_installed(cli, tmp_path):
    # `from torch.nn import FusedBlockNorm` (a name this torch does not have) as the base of a config
    # mix-in: torch is installed, so the cause is its version, named
    import torch

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"
        "from torch.nn import FusedBlockNorm\n\n\n"
        "class Settings(FusedBlockNorm):\n    pass\n\n\n"
        "cfg = Settings()\nmodel = nn.Sequential(*[nn.Linear(cfg.width, 8) for _ in range(2)])\n"
        "fully_shard(model)\n")
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    assert res.code == 2
    assert f"the installed torch {torch.__version__} does not have it" in res.err
    assert "not installed here" not in res.err


SECTIONED = os.path.join(REPOS, "sectioned_cfg")


def test_a_skipped_check_that_sets_a_config_section_is_named_before_the_mesh_it_leaves_wrong(cli):
    """``check_args(args)`` fails (the run's ``out_dir`` is not set: a real node fails there too) and is
    skipped; it would have set ``args.dist.dp_replicate`` from the world size, and the mesh built from the
    section ``args.dist`` then asserts. The error names the check first."""
    res = cli("sectrain/train.py", "--world-size", "8", "--", "config=configs/tiny.yaml", cwd=SECTIONED)
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert line.startswith("fsdp-lint: error: sectrain/train.py:45: ") and "AssertionError: out_dir is not set" in line
    assert line.index("out_dir is not set") < line.index("dp_replicate * dp_shard (1 * 1) != world_size (8)")


def test_with_the_check_passing_the_sectioned_config_plans_as_torch_builds(tmp_path, monkeypatch):
    """The same launch with ``out_dir`` set (the data folders are not here): the check fills in
    ``dp_replicate`` from the world size, and the plan equals real FSDP2's on that mesh."""
    import shutil

    shutil.copytree(SECTIONED, tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "repo")
    res, _ = assert_plan_matches_torch(str(tmp_path / "repo" / "sectrain" / "train.py"), 8,
                                       argv=["config=configs/tiny.yaml", f"out_dir={tmp_path / 'run'}"])
    assert [u.modules for u in res.plan.units] == [["layers.0"], ["layers.1"], ["layers.2"], ["layers.3"], [""]]
    assert res.plan.mesh is not None


def test_a_stand_in_the_model_uses_is_named_at_the_line_of_the_use(cli, tmp_path):
    """The model's ``__init__`` builds a layer from a package that is not installed: the refusal names
    the line of the model's code that uses it (not a line of fsdp-lint's stand-in)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\nfrom fancy_kernels import FusedNorm\n\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(8, 8)\n        self.norm = FusedNorm(8)\n\n\n"
        "model = Net()\nfully_shard(model)\n")
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 2
    assert "train.py:10: the model uses `FusedNorm`, which could not be imported here" in res.err, res.err
    assert "fsdp_lint" not in res.err


PROBE = os.path.join(REPOS, "precision_probe")


def test_a_missing_package_that_decides_the_wraps_precision_is_refused(cli):
    """``get_policies`` asks ``bfloat_support()``, which reads the CUDA version through a package this
    machine lacks: the check fails on its stand-in, and skipping it would plan fp32 where a GPU node with
    the package runs bf16. The statement decides the wrap's arguments (``mixed_precision=``), so the
    failure is a refusal naming the package and the statement, not a skip."""
    res = cli("s2s/train.py", "--world-size", "4", cwd=PROBE)
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert line.startswith("fsdp-lint: error: s2s/train.py: s2s/utils/environment.py:13: "), line
    assert "`nvversions` is not installed here: pip install nvversions" in line
    assert "decides the wrap's arguments (train.py:36)" in line


def install_fake_nvversions(tmp_path, monkeypatch) -> None:
    """The version package the precision probes read the CUDA version through, installed for the test."""
    pkg = tmp_path / "site" / "nvversions"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(
        "class Version:\n    def __init__(self, text):\n"
        "        self.release = tuple(int(p) for p in text.split('.'))\n\n\n"
        "def parse(text):\n    return Version(text)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_with_the_package_installed_the_precision_probe_plans_bf16_as_torch_builds(tmp_path, monkeypatch):
    install_fake_nvversions(tmp_path, monkeypatch)
    monkeypatch.chdir(PROBE)
    res, real = assert_plan_matches_torch(os.path.join(PROBE, "s2s", "train.py"), 4)
    assert [u.modules for u in res.plan.units] == [["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], [""]]
    assert {r["param_dtype"] for r in real} == {"bfloat16"}


def test_a_missing_namespace_package_is_named_by_its_distribution(cli, tmp_path):
    """``from google.cloud import storage`` fails on the missing ``google``: the run config read from the
    bucket decides the precision, and the refusal says what to install (google-cloud-storage, not google)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(
        "import json\n\nimport torch\nimport torch.nn as nn\nfrom google.cloud import storage\n"
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n\n\n"
        "def run_config(bucket):\n"
        "    return json.loads(storage.Client().bucket(bucket).blob('run.json').download_as_text())\n\n\n"
        "cfg = run_config('my-runs')\n"
        "mp = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg['dtype']))\n"
        "model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))\n"
        "for block in model:\n    fully_shard(block, mp_policy=mp)\nfully_shard(model, mp_policy=mp)\n")
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    assert res.code == 2, res.out
    assert "`google` is not installed here: pip install google-cloud-storage" in res.err, res.err


HUB_CHAIN = os.path.join(REPOS, "hub_model_chain")


def test_a_skipped_missing_hub_config_is_named_before_the_none_model_it_leaves(cli):
    """``model = None`` then ``model = AutoModelForCausalLM.from_pretrained(hub_id)`` in a helper: the hub
    config is not here (fsdp-lint never downloads). Skipped, it left ``None`` whose layers were looked up
    later; the model it loads is what the wrap is given, so the replay ends on it, naming the missing
    config, what to pass, and the statement of the entry that the helper's model decides."""
    res = cli("src/llmkit/train.py", "--world-size", "4", cwd=HUB_CHAIN)
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "src/llmkit/models.py:11: " in line and "no config.json for the hub model 'acme-labs/llm-7b'" in line
    assert "pass --hf-config" in line
    assert "what it computes decides the wrap's arguments (train.py:14), so it is not skipped" in line
    assert "NoneType" not in line


def test_with_a_local_model_the_hub_chain_plans_as_torch_builds(monkeypatch):
    config = os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama-local")
    monkeypatch.chdir(HUB_CHAIN)
    res, real = assert_plan_matches_torch(os.path.join(HUB_CHAIN, "src", "llmkit", "train.py"), 4,
                                          argv=["--model", config])
    assert res.plan.units[-1].modules == [""] and len(res.plan.units) == len(real) > 1


ISINSTANCE_OF_A_STAND_IN = 'import torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\nfrom torch.utils.data import DataLoader\nfrom torchdata_x.stateful import StatefulDataLoader\n\n\nclass Tracker:\n    def __init__(self):\n        self.tracked = []\n\n    def __setattr__(self, key, value):\n        if key != "tracked" and (isinstance(value, (nn.Module, StatefulDataLoader))):\n            self.tracked.append(key)\n        object.__setattr__(self, key, value)\n\n\nstate = Tracker()\nstate.model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\nstate.loader = StatefulDataLoader([1, 2, 3])\nstate.plain = DataLoader([1, 2, 3])\nclass Sub(StatefulDataLoader):\n    pass\nassert issubclass(Sub, StatefulDataLoader) and not issubclass(DataLoader, StatefulDataLoader)\nassert state.tracked == ["model", "loader"], state.tracked\nfor m in state.model:\n    fully_shard(m)\nfully_shard(state.model)\n'


def test_isinstance_of_a_class_whose_package_is_missing_answers_as_on_the_node(cli, tmp_path):
    """``isinstance(value, (nn.Module, StatefulDataLoader))`` with the loader's package not installed: what
    was built from the stand-in is one, a subclass of it is a subclass, anything else is not -- the check
    raised ``TypeError`` (arg 2 must be a type) and the statement was skipped, leaving state untracked."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(ISINSTANCE_OF_A_STAND_IN)
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code == 0, res.err
    assert "failed here and" not in res.out and "stood in for (not used by the model): torchdata_x" in res.out


def test_a_stand_in_failing_on_a_config_field_the_wrap_does_not_read_is_still_a_skip(cli, tmp_path):
    """The slice follows attribute chains: ``cfg.seed = tracking.config.seed + rank`` (the tracker's package is
    not installed) stores into the run config, but the wrap reads ``cfg.param_dtype`` only -- the failure is
    skipped and noted, and the plan is built; a failure computing ``cfg.param_dtype`` would be a refusal."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(
        "import types\n\nimport torch\nimport torch.nn as nn\nimport tracking_sdk as tracking\n"
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n\n\n"
        "def main():\n"
        "    cfg = types.SimpleNamespace(param_dtype='bfloat16', seed=0)\n"
        "    cfg.seed = tracking.config.seed + 1\n"
        "    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg.param_dtype))\n"
        "    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))\n"
        "    for block in model:\n        fully_shard(block, mp_policy=mp)\n    fully_shard(model, mp_policy=mp)\n\n\n"
        "main()\n")
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    assert "1 setup statement failed here and was skipped (first: train.py:11:" in res.out


WRAP_HELPER = '''
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpuprobe import supports_bf16


class Config:
    bf16 = False
    layers = 4


def build(cfg: Config) -> nn.Module:
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(cfg.layers)])


def shard(model: nn.Module, cfg: Config) -> nn.Module:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cfg.bf16 else None)
    for block in model:
        fully_shard(block, mp_policy=mp)
    return fully_shard(model, mp_policy=mp)


def main():
    cfg = Config()
    cfg.bf16 = supports_bf16()
    model = shard(build(cfg), cfg)
    torch.optim.AdamW(model.parameters())


if __name__ == "__main__":
    main()
'''


def test_a_missing_package_deciding_a_wrap_made_in_a_helper_of_the_file_is_refused(cli, tmp_path):
    """``cfg.bf16 = supports_bf16()`` (a package this machine lacks) in ``main``, the wrap in ``shard(model,
    cfg)``, whose ``param_dtype=torch.bfloat16 if cfg.bf16 else None`` asks the stand-in's truth: falsy, it
    planned float32 where a node with the package runs bfloat16 (exit 0, "not used by the model"). Where its
    truth decides a wrap's arguments a stand-in has no truth value, and the failure is a refusal."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(WRAP_HELPER)
    res = cli("train.py", "--world-size", "4", cwd=str(tmp_path))
    assert res.code == 2, res.out
    line = res.err.strip().splitlines()[0]
    assert "`gpuprobe` is not installed here: pip install gpuprobe" in line, line
    assert "decides the wrap's arguments (train.py:21)" in line, line


def test_the_install_hint_names_the_distribution_the_project_declares(cli, tmp_path):
    """``olmo_core`` is not installed: its distribution is the ``ai2-olmo-core`` the project's pyproject
    depends on, not a guessed ``olmo-core`` (which is not it); an undeclared module keeps the guess. The
    line named is the file's (it was fsdp-lint's own modwalk.py, where the recorder walked the stand-in)."""
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'trainer'\ndependencies = [\n    \"torch>=2.6\",\n    \"ai2-olmo-core>=2.1\",\n]\n")
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nfrom olmo_core.nn.transformer import TransformerConfig\n"
        "from torch.distributed.fsdp import fully_shard\n\n"
        "model = TransformerConfig.llama2_271M(vocab_size=100).build()\nfully_shard(model)\n")
    res = cli("train.py", "--world-size", "2", cwd=str(tmp_path))
    assert res.code == 2, res.out
    # the model is the package's: named at the import (the use is inside fsdp-lint's walk of the stand-in)
    assert res.err.startswith("fsdp-lint: error: train.py:2: the model uses `TransformerConfig"), res.err
    assert "(`olmo_core` is not installed: pip install ai2-olmo-core)" in res.err, res.err
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'trainer'\n")
    res = cli("train.py", "--world-size", "2", "--no-cache", cwd=str(tmp_path))
    assert "pip install olmo-core" in res.err, res.err
    # a requirements file's line, a direct reference as uv and pip write them: installed from where the
    # repository gets it (its commit; a name on PyPI may be another project)
    (tmp_path / "requirements.txt").write_text(
        "# training\ntorch>=2.6\nai2_olmo_core @ git+https://github.com/allenai/OLMo-core.git@fa6c501\n")
    res = cli("train.py", "--world-size", "2", "--no-cache", cwd=str(tmp_path))
    assert "pip install 'ai2_olmo_core @ git+https://github.com/allenai/OLMo-core.git@fa6c501'" in res.err, res.err
