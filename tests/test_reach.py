"""fsdp-lint follows real entry points the way `python train.py ARGS` runs them.

The fixtures under ``fixtures/repos/`` are laid out like public training repositories: packages with
relative imports, ``src/`` layouts, helpers and wrap code in other modules, trainer classes, callbacks,
configs chosen on the command line. For each, the plan fsdp-lint reports equals what real FSDP builds
when the same entry point runs with the same arguments under the fake process group
(``replay(..., real=True)``), and the training loop -- wherever it lives -- never runs.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from fsdp_lint.config import Settings
from fsdp_lint.engine import analyse

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

REPOS = os.path.join(REPO, "fixtures", "repos")
TITAN = os.path.join(REPOS, "titan_like")
TITAN_TRAIN = os.path.join(TITAN, "titan_like", "train.py")
TITAN_DEBUG = ["--config", os.path.join(TITAN, "configs", "debug.yaml")]
TITAN_SMALL = TITAN_DEBUG + ["--model.flavor", "small", "--parallelism.reshard_after_forward", "never"]


def markers(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.startswith("TRAINING_STARTED")]


# --------------------------------------------------------------------------------------------
# a torchtitan-shaped package: registry, Trainer.__init__ builds everything, --config YAML
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,world_size", [(TITAN_DEBUG, 8), (TITAN_SMALL, 4)], ids=["debug-ws8", "small-ws4"])
def test_package_entry_point_plan_equals_real_torch(argv, world_size):
    res, real = assert_plan_matches_torch(TITAN_TRAIN, world_size, argv=argv)
    flavor_layers = 4 if argv is TITAN_DEBUG else 6
    assert [u.modules for u in res.plan.units] == [[f"layers.{i}"] for i in range(flavor_layers)] + [[""]]
    # the config and the command line chose the settings, as at launch
    raf = [u.reshard_after_forward for u in res.plan.units]
    assert raf == ([True, True, True, False, False] if argv is TITAN_DEBUG else [False] * 7)
    assert {u.param_dtype for u in res.plan.units} == {"bfloat16"}
    assert not markers(TITAN)


def test_package_module_runs_as_its_dotted_name_and_a_sibling_does_not_shadow_a_package():
    """`titan_like/train.py` runs as `titan_like.train` (its relative imports work); the package's own
    `tokenizers.py` does not hide the installed Hugging Face `tokenizers` that it imports: the tokenizer
    file is what is missing here, not the package's `Tokenizer` class."""
    from fsdp_lint.replay import replay

    res = replay(TITAN_TRAIN, 8, argv=TITAN_DEBUG)
    assert res.run_as == "module titan_like.train"
    first = res.skipped[0]
    assert first.path.endswith(os.path.join("titan_like", "train.py"))
    assert "No such file" in first.error and "Tokenizer" not in first.error
    # the wrap is reached through the registered spec (`train_spec.parallelize_fn(...)`), so `trainer.train()`
    # after it is past the last statement the plan depends on: not run, or stopped at its training loop
    assert res.stopped is None or "training loop" in res.stopped[0]
    assert res.wrap_calls


def test_unit_from_a_helper_module_reports_the_wrap_line_and_the_call_site(cli):
    res = cli(TITAN_TRAIN, "--world-size", "8", "--format", "json", "--fail-on", "info", "--", *TITAN_DEBUG)
    assert res.code == 1, res.err           # FSD104 (info: its root is far below 5 % of the device)
    doc = json.loads(res.out)
    unit = doc["files"][0]["plan"]["units"][0]
    assert unit["path"].endswith("titan_like/models/llama/parallelize.py")
    src = open(os.path.join(TITAN, "titan_like", "models", "llama", "parallelize.py")).read().splitlines()
    assert src[unit["line"] - 1].strip().startswith("fully_shard(transformer_block")
    train_src = open(TITAN_TRAIN).read().splitlines()
    assert unit["call_site"]["path"].endswith("titan_like/train.py")
    assert "parallelize_fn(" in train_src[unit["call_site"]["line"] - 1]
    finding = doc["files"][0]["findings"][0]
    assert finding["code"] == "FSD104" and finding["call_site"] == unit["call_site"]
    text = cli(TITAN_TRAIN, "--world-size", "8", "--", *TITAN_DEBUG).out
    assert f"= called from: {unit['call_site']['path']}:{unit['call_site']['line']}" in text


def test_entries_in_pyproject_lint_the_launch_commands(cli):
    res = cli("--format", "json", cwd=TITAN)
    doc = json.loads(res.out)
    assert [(f["args"], f["plan"]["world_size"], len(f["plan"]["units"])) for f in doc["files"]] == [
        (["--config", "configs/debug.yaml"], 8, 5),
        (["--config", "configs/debug.yaml", "--model.flavor", "small", "--parallelism.reshard_after_forward",
          "never"], 4, 7)]
    assert not markers(TITAN)


def test_a_script_stopped_by_its_argument_parser_says_so_and_how_to_pass_arguments(cli):
    # `--` with nothing after it: the script's own arguments are empty (the entries' are not used)
    res = cli(TITAN_TRAIN, "--world-size", "8", "--")
    assert res.code == 2
    assert len(res.err.strip().splitlines()) == 1
    assert "the following arguments are required: --config" in res.err
    assert "fsdp-lint train.py -- ARGS" in res.err


def test_a_script_asked_for_its_help_is_not_a_model_search(cli):
    # argparse prints the help and exits 0 before any model exists: say so, not "cannot build the model"
    res = cli(TITAN_TRAIN, "--world-size", "8", "--", "--help")
    assert res.code == 2
    assert len(res.err.strip().splitlines()) == 1
    assert "printed its help and exited (arguments --help)" in res.err
    assert "fsdp-lint train.py -- ARGS" in res.err


def test_a_config_named_in_the_arguments_that_does_not_exist_is_the_error_not_a_default_plan(cli):
    res = cli(TITAN_TRAIN, "--world-size", "8", "--", "--config", "configs/8b.yaml")
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1
    assert "`configs/8b.yaml`, named in the script's arguments, cannot be read" in res.err


# --------------------------------------------------------------------------------------------
# an llama-recipes-shaped src/ package: fire entry point, policies and configs in other modules
# --------------------------------------------------------------------------------------------
RECIPES = os.path.join(REPOS, "recipes_like")
FINETUNING = os.path.join(RECIPES, "src", "recipes_like", "finetuning.py")


@pytest.mark.parametrize("argv", [[], ["--model_name", "small", "--freeze_layers", "True", "--num_freeze_layers", "2",
                                       "--use_orig_params", "True"]], ids=["defaults", "frozen-orig-params"])
def test_fire_entry_point_in_a_src_layout_plan_equals_real_torch(argv):
    res, real = assert_plan_matches_torch(FINETUNING, 4, argv=argv)
    layers = 6 if argv else 4
    assert [u.modules for u in res.plan.units] == [[f"layers.{i}"] for i in range(layers)] + [[""]]
    assert res.plan.api == "fsdp1" and res.plan.use_orig_params is bool(argv)
    assert not markers(RECIPES)


# --------------------------------------------------------------------------------------------
# a trainer class: a wrap in a method, a wrap function handed over as a callback, a callback object,
# click options; a helper module that forgets the root; the optimizer built before the wrap
# --------------------------------------------------------------------------------------------
MINI = os.path.join(REPOS, "mini_trainer")
MINI_TRAIN = os.path.join(MINI, "scripts", "train.py")


@pytest.mark.parametrize("argv", [[], ["--strategy", "fsdp1"], ["--strategy", "callback", "--depth", "3"]],
                         ids=["wrap-fn-fsdp2", "trainer-method-fsdp1", "callback-fsdp1"])
def test_trainer_method_and_callback_wraps_plan_equals_real_torch(argv):
    res, real = assert_plan_matches_torch(MINI_TRAIN, 4, argv=argv)
    depth = 3 if "--depth" in argv else 4
    blocks = [[f"blocks.{i}"] for i in range(depth)]
    assert [u.modules for u in res.plan.units] == (blocks if not argv else blocks + [[""]])
    assert not markers(MINI)


def test_a_helper_module_that_forgets_the_root_is_fsd301_at_the_helper_with_the_call_site(cli):
    res = cli(MINI_TRAIN, "--world-size", "4", "--format", "json", "--")
    doc = json.loads(res.out)
    (finding,) = doc["files"][0]["findings"]
    assert finding["code"] == "FSD301" and finding["path"].endswith("mini_trainer/sharding.py")
    assert finding["call_site"]["path"].endswith("scripts/train.py")
    src = open(MINI_TRAIN).read().splitlines()
    assert src[finding["call_site"]["line"] - 1].strip() == "trainer.setup()"
    assert res.code == 1


def test_an_optimizer_built_before_a_helpers_wrap_is_fsd501(cli):
    res = cli(MINI_TRAIN, "--world-size", "4", "--format", "json", "--", "--optimizer-first")
    codes = sorted(f["code"] for f in json.loads(res.out)["files"][0]["findings"])
    assert codes == ["FSD301", "FSD501"]


# --------------------------------------------------------------------------------------------
# Hydra: config groups and overrides chosen on the command line; Hydra writes nothing
# --------------------------------------------------------------------------------------------
HYDRA = os.path.join(REPOS, "hydra_app")
HYDRA_TRAIN = os.path.join(HYDRA, "train.py")


@pytest.mark.parametrize("argv", [[], ["model=tied", "trainer.fsdp.reshard_after_forward=false"]],
                         ids=["defaults", "overrides"])
def test_hydra_overrides_choose_the_plan_as_at_launch(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res, real = assert_plan_matches_torch(HYDRA_TRAIN, 4, argv=argv)
    layers = 3 if argv else 4
    assert [u.modules for u in res.plan.units] == [[f"blocks.{i}"] for i in range(layers)] + [[""]]
    assert [u.reshard_after_forward for u in res.plan.units[:-1]] == [not argv] * layers
    assert res.tree.params["embed.weight"].aliases == (["head.weight"] if argv else [])
    assert os.listdir(tmp_path) == [] and not markers(HYDRA)       # no outputs/ run folder, no log


# --------------------------------------------------------------------------------------------
# shard_placement_fn: evaluated per parameter, exact local shapes, no false FSD601
# --------------------------------------------------------------------------------------------
MOE = os.path.join(REPO, "fixtures", "idioms", "fsdp2_moe_shard_placement.py")


@pytest.mark.parametrize("rank", [0, 7])
def test_shard_placement_fn_gives_torchs_local_shapes(rank):
    import runpy

    from oracle_nd import fsdp2_nd

    ns = runpy.run_path(MOE)

    def wrap(model, mesh):
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block.moe.experts, mesh=mesh, shard_placement_fn=ns["_experts_shard_placement_fn"])
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)

    real = fsdp2_nd(ns["MoEModel"], wrap, world_size=8, rank=rank, mesh_shape=(8,), mesh_dim_names=None)
    res = analyse(MOE, Settings(world_size=8))
    mine = {p.fqn: p for ul in res.layout.units for p in ul.params}
    for group in real:
        for p in group["params"]:
            lp = mine[p["fqn"]]
            local = lp.local_shape_first if rank == 0 else lp.local_shape_last
            assert list(local) == p["local_shape"], p["fqn"]
            dim = int(p["placements"][0].split("dim=")[1].split(")")[0])
            assert lp.shard_dim == dim, p["fqn"]
            # the collective moves the padded shard of every rank
            padded = 1
            for d in p["padded_local_shape"]:
                padded *= d
            assert lp.padded_numel == padded * 8, p["fqn"]
    # experts sharded on dim 1 leave no rank empty: FSD601 only names the 4-row router
    (fsd601,) = [f for f in __import__("fsdp_lint.engine", fromlist=["lint_file"]).lint_file(
        MOE, Settings(world_size=8)).findings if f.code == "FSD601"]
    assert "router" in fsd601.text and "experts" not in fsd601.text


# --------------------------------------------------------------------------------------------
# a Hugging Face example-shaped recipe: HfArgumentParser dataclasses checked in __post_init__, a
# hub data set whose splits are checked, the Trainer wrapping with --fsdp/--fsdp_config
# --------------------------------------------------------------------------------------------
LM_RECIPE = os.path.join(REPOS, "hf_lm_recipe")
LM_FINETUNE = os.path.join(LM_RECIPE, "lm_recipe", "finetune.py")
TINY_GPT2 = os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-gpt2")
LM_LAUNCH = ["--model_name_or_path", "gpt2", "--do_train", "--output_dir", "out",
             "--fsdp", "full_shard auto_wrap", "--fsdp_config", os.path.join(LM_RECIPE, "configs", "fsdp.json")]


def test_hf_recipe_whose_data_set_is_not_here_plan_equals_the_trainers():
    # the data set stands in (not installed / offline) and has the split the recipe checks for
    from test_frameworks import assert_framework_plan_matches

    settings = Settings(world_size=4, hf_config=TINY_GPT2)
    res = assert_framework_plan_matches(LM_FINETUNE, settings, ["--corpus", "wikitext", *LM_LAUNCH])
    assert res.plan.framework == "transformers"
    assert [u.modules for u in res.plan.units][:2] == [["transformer.h.0"], ["transformer.h.1"]]


def test_arguments_an_argument_dataclass_refuses_are_the_error_not_skipped(cli):
    # python would stop in CorpusOptions.__post_init__; skipping it used to end in a later
    # consequence ('NoneType' object has no attribute 'rsplit')
    res = cli(LM_FINETUNE, "--hf-config", TINY_GPT2, "--", *LM_LAUNCH, cwd=LM_RECIPE)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert "lm_recipe/options.py:22: the script's arguments were refused while they were parsed" in res.err
    assert "ValueError: give --corpus or --text_file" in res.err
    # the arguments were given (after --): no hint to pass them, the parser's own line says what is missing
    assert "-- ARGS" not in res.err


def test_a_wrap_class_the_model_lacks_is_fsd103_at_the_fsdp_config_file_named_in_the_arguments(cli):
    # the HF Trainer reads transformer_layer_cls_to_wrap from --fsdp_config FILE: the finding points
    # there, and the fix names the repeated block, not the class spelled most alike (GPT2MLP)
    launch = [a if not a.endswith("fsdp.json") else "configs/fsdp_renamed_block.json" for a in LM_LAUNCH]
    res = cli(LM_FINETUNE, "--hf-config", TINY_GPT2, "--format", "json", "--", "--corpus", "wikitext", *launch,
              cwd=LM_RECIPE)
    assert res.code == 1, res.err
    [f] = [f for f in json.loads(res.out)["files"][0]["findings"] if f["code"] == "FSD103"]
    assert (f["path"], f["line"]) == ("configs/fsdp_renamed_block.json", 3)
    text = f["message"] + " " + str(f.get("detail"))
    assert "`GPT2Layer`" in text and "Could not find the transformer layer class GPT2Layer" in text
    assert f["fix"] == ("write `GPT2Block` instead of `GPT2Layer` in the `transformer_layer_cls_to_wrap` key of "
                        "fsdp_renamed_block.json (the `fsdp_config` file)")


# --------------------------------------------------------------------------------------------
# a litgpt-shaped package: `python -m litlm pretrain ...` (jsonargparse CLI over a dict of commands),
# the logger from a helper module, Fabric FSDPStrategy(HYBRID_SHARD), data prepared in rank_zero_first()
# --------------------------------------------------------------------------------------------
LITLM = os.path.join(REPOS, "lit_pretrain_like")
LITLM_MAIN = os.path.join(LITLM, "litlm", "__main__.py")


def test_cli_of_subcommands_with_fabric_fsdp_plan_equals_lightnings(tmp_path):
    from test_frameworks import assert_framework_plan_matches

    # (the oracle's FSDP1 runs on CPU, where HYBRID_SHARD's node is one device: compared with FULL_SHARD)
    argv = ["pretrain", "--devices", "8", "--out_dir", str(tmp_path / "out"), "--sharding_strategy", "FULL_SHARD"]
    res = assert_framework_plan_matches(LITLM_MAIN, Settings(world_size=8), argv)
    assert res.plan.framework == "lightning"
    assert [u.modules for u in res.plan.units][:4] == [[f"blocks.{i}"] for i in range(4)]


def test_fabric_hybrid_shard_with_data_prepared_rank_zero_first_skips_nothing(cli, tmp_path):
    # rank_zero_first()'s gloo barrier waits on nothing: prepare_data() runs, no statement is skipped
    res = cli(LITLM_MAIN, "--format", "json", "--", "pretrain", "--out_dir", str(tmp_path / "out"), cwd=LITLM)
    assert res.code == 0, res.err
    [doc] = json.loads(res.out)["files"]
    assert doc["plan"]["sharding_strategy"] == "HYBRID_SHARD" and doc["plan"]["framework"] == "lightning"
    assert doc["replay"]["skipped_statements"] == [], doc["replay"]


def test_setup_that_never_reaches_the_model_names_the_failure_that_started_it(cli, tmp_path):
    # `--logger_name bogus`: choose_logger raises (a node fails there too), the call is skipped, `logger` and
    # then `fabric` stay unbound and every later statement fails in turn: the error names the failure that
    # started it, and the skipped call
    res = cli(LITLM_MAIN, "--", "pretrain", "--logger_name", "bogus", "--out_dir", str(tmp_path / "out"), cwd=LITLM)
    assert res.code == 2, res.out
    assert len(res.err.strip().splitlines()) == 1, res.err
    assert ("the setup never reached a model or its wrap code: litlm/utils.py:16: ValueError: `--logger_name=bogus` "
            "is not a valid option (the statement at litlm/pretrain.py:30 was skipped") in res.err


def test_a_tracker_imported_inside_a_function_and_not_installed_here_is_a_note(cli, tmp_path):
    # the experiment tracker is an optional dependency imported inside choose_logger's branch: not installed
    # here, it gets a stand-in as a module-level import does (its ModuleNotFoundError left `logger` and then
    # `fabric` unbound, and the lint never reached the model); a logger does not change the plan
    res = cli(LITLM_MAIN, "--format", "json", "--", "pretrain", "--logger_name", "aim", "--out_dir",
              str(tmp_path / "out"), cwd=LITLM)
    assert res.code in (0, 1), res.err
    f = json.loads(res.out)["files"][0]
    assert f["plan"]["framework"] == "lightning" and len(f["plan"]["units"]) > 1
    assert any("aim_tracker_for_litlm" in n for n in f["notes"]), f["notes"]


def test_packages_installed_with_pip_target_on_pythonpath_are_libraries_not_project_code(tmp_path, monkeypatch):
    """`pip install --target deps ...; PYTHONPATH=deps python train.py`: the packages in deps/ (pip
    wrote their `*.dist-info` next to them) are installed libraries, imported as they are; the
    replay's transform (failing statements skipped) is for the project's own code only. A project
    folder on sys.path without distribution metadata (src/) stays the project's."""
    from fsdp_lint.entry import project

    deps, src = tmp_path / "deps", tmp_path / "src"
    (deps / "cfgstore").mkdir(parents=True)
    (deps / "cfgstore" / "__init__.py").write_text("def width():\n    return 64\n")
    info = deps / "cfgstore-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cfgstore\nVersion: 1.0\n")
    (info / "RECORD").write_text("cfgstore/__init__.py,,\ncfgstore-1.0.dist-info/METADATA,,\n")
    (info / "top_level.txt").write_text("cfgstore\n")
    (src / "mypkg").mkdir(parents=True)
    (src / "mypkg" / "model.py").write_text("import torch\n")
    (tmp_path / "train.py").write_text("import cfgstore\nimport mypkg.model\n")
    monkeypatch.setattr(sys, "path", [str(deps), str(src)] + sys.path)
    monkeypatch.setattr(project, "_LIB_DIRS", None)
    monkeypatch.setattr(project, "_IS_LOCAL", {})
    assert not project.is_local(str(deps / "cfgstore" / "__init__.py"))
    assert project.is_local(str(src / "mypkg" / "model.py"))
    assert project.is_local(str(tmp_path / "train.py"))
