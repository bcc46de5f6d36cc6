"""Plans that frameworks build: Lightning (Fabric, Trainer), accelerate, the HF Trainer, PEFT; the Python API.

The oracle is the installed framework itself: every fixture under ``fixtures/frameworks/`` is replayed a
second time with the real FSDP APIs under the fake process group (``replay(..., real=True)``: FSDP1 on
CPU, FSDP2 on meta), where Lightning/accelerate/transformers run their own code and build real units;
the units torch built (read from torch's objects, as in ``test_idioms``) must equal fsdp-lint's plan.
Where the framework or torch raises instead (accelerate's "Could not find the transformer layer class",
torch's uniform requires_grad/dtype checks), fsdp-lint's finding must quote that error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from conftest import REPO
from fsdp_lint.replay import frameworks
from fsdp_lint.config import Settings
from fsdp_lint.engine import analyse, lint_file
from fsdp_lint.replay.frameworks.options import FrameworkOptions
from fsdp_lint.replay import ReplayError
from test_idioms import strip_wrapper_prefixes, torch_units

F = os.path.join(REPO, "fixtures", "frameworks")
CFG = os.path.join(F, "configs")
ACC = os.path.join(F, "accelerate_sft")


def acc(yaml: str, model: str = "tiny-llama") -> dict:
    return {"accelerate_config": os.path.join(ACC, "configs", yaml), "hf_config": os.path.join(CFG, model)}


def real_units(path: str, settings: Settings, argv=None):
    # accelerate's cpu_ram_efficient_loading sets sync_module_states=True: the real replay on CPU drops the
    # broadcast (it needs GPU tensors and changes no unit), as --run on CPU does
    with frameworks.configured(FrameworkOptions.from_settings(settings)):
        return torch_units(path, settings.world_size, argv)


def _strip(fqn: str) -> str:
    """Fabric keeps the wrapped model as `_forward_module` of its `_FabricModule`."""
    if fqn == "_forward_module":
        return ""
    return fqn[len("_forward_module."):] if fqn.startswith("_forward_module.") else fqn


def assert_framework_plan_matches(path: str, settings: Settings, argv=None):
    res = lint_file(path, settings, argv=argv)
    real, _ = real_units(path, settings, argv)
    plan, tree = res.plan, res.tree
    assert [u.modules for u in plan.units] == [[_strip(m) for m in r["modules"]] for r in real]
    for unit, ref in zip(plan.units, real):
        where = f"unit {unit.modules}"
        assert unit.params == [tree.canonical(_strip(p)) for p in ref["params"]], where
        if ref["params"]:
            assert {tree.params[p].dtype for p in unit.params} == ref["dtypes"], where
            for name, rg in ref["requires_grad"].items():
                assert tree.params[tree.canonical(_strip(name))].requires_grad == rg, f"{where}: {name}"
            assert unit.param_dtype == ref["param_dtype"], where
        if plan.api == "fsdp1":
            assert plan.use_orig_params == ref["use_orig_params"], where
            assert (plan.sharding_strategy or "FULL_SHARD") == ref["sharding_strategy"], where
        elif ref["params"]:
            assert unit.reshard_after_forward == ref["reshard_after_forward"], where
            assert unit.shard_size == ref["shard_size"], where
    return res


CASES = {
    # Lightning Fabric, FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}), tied head
    "fabric-fsdp1": ("lightning_gpt/fabric_train.py", {}, "lightning", []),
    # Lightning Trainer + PEFT LoRA, FSDPStrategy default use_orig_params=True: accepted, FSD202
    "trainer-lora-fsdp1": ("lightning_lora/finetune.py", {}, "lightning", ["FSD202"]),
    # Lightning Trainer, ModelParallelStrategy: configure_model() shards over the strategy's mesh
    "trainer-model-parallel-fsdp2": ("lightning_tp/train.py", {"world_size": 8}, "lightning", []),
    # Lightning Fabric, ModelParallelStrategy(parallelize_fn): TP over "tensor_parallel", FSDP2 over
    # "data_parallel" of Fabric's own 4 x 2 mesh; the optimizer is set up after the model, in one line
    "fabric-model-parallel-tp-fsdp2": ("lightning_tp/fabric_tp.py", {"world_size": 8}, "lightning", []),
    # Fabric ModelParallelStrategy (4 x 1) whose parallelize_fn hands its whole 2-D mesh to fully_shard: HSDP
    # over a shard dimension of 1 rank, nothing sharded (torch's shard size is 1); the data-parallel sub-mesh shards
    "fabric-fsdp2-whole-2d-mesh": ("lightning_tp/fabric_fsdp2_whole_mesh.py", {}, "lightning", ["FSD705"]),
    "fabric-fsdp2-dp-submesh": ("lightning_tp/fabric_fsdp2_whole_mesh.py", {}, "lightning", []),
    # accelerate from its config file (accelerate launch's environment), model via from_pretrained
    "accelerate-fsdp1": ("accelerate_sft/train.py", acc("fsdp1.yaml"), "accelerate", []),
    "accelerate-size-small": ("accelerate_sft/train.py", acc("fsdp1_size_small.yaml"), "accelerate", ["FSD102"]),
    "accelerate-size-0": ("accelerate_sft/train.py", acc("fsdp1_size_0.yaml"), "accelerate", ["FSD101"]),
    "accelerate-size-default": ("accelerate_sft/train.py", acc("fsdp1_size_default.yaml"), "accelerate", ["FSD101"]),
    "accelerate-fsdp2": ("accelerate_sft/train.py", acc("fsdp2.yaml"), "accelerate", []),
    # a config without num_processes (the launcher passes it): launched with --num_processes WORLD_SIZE
    "accelerate-no-process-count": ("accelerate_sft/train.py", acc("fsdp1_no_process_count.yaml"), "accelerate", []),
    "accelerate-fsdp2-tied": ("accelerate_sft/train.py", acc("fsdp2.yaml", "tiny-llama-tied"), "accelerate", []),
    "accelerate-fsdp2-moe": ("accelerate_sft/train.py", acc("fsdp2.yaml", "tiny-mixtral"), "accelerate", []),
    "accelerate-lora-orig-params": ("accelerate_sft/train_lora.py", acc("fsdp1.yaml"), "accelerate", ["FSD202"]),
    # accelerate, FullyShardedDataParallelPlugin in code, GPT-2 (tied), optimizer before prepare with FSDP1
    # and use_orig_params=False: accelerate does not remap it, nothing trains (FSD501; confirmed by --run)
    "accelerate-plugin-gpt2": ("accelerate_plugin/train_gpt2.py", {}, "accelerate", ["FSD501"]),
    # the same optimizer before prepare, with use_orig_params=False from a config: FSD501 too
    "accelerate-fsdp1-no-orig-params": ("accelerate_sft/train.py", acc("fsdp1_no_orig_params.yaml"), "accelerate",
                                        ["FSD501"]),
    # TRL SFTTrainer + LoRA from a local model folder, FSDP1 SHARD_GRAD_OP from an accelerate config: the hub
    # data set stands in (TRL gets a placeholder Dataset), flash-attn is absent, --push_to_hub creates no repo
    "trl-sft-lora-fsdp1": ("trl_sft/sft.py", {"accelerate_config": os.path.join(F, "trl_sft", "configs",
                                                                                 "fsdp1_shard_grad_op.yaml")},
                           "transformers", []),
    # HF Trainer: fsdp and fsdp_config (a JSON file) on the command line, parsed by HfArgumentParser; T5's
    # shared embedding stays in the root
    "hf-trainer-t5": ("hf_trainer/train_t5.py", {}, "transformers", []),
    # HF Trainer + PEFT: the Trainer swaps in PEFT's fsdp_auto_wrap_policy (adapters in their own units)
    "hf-trainer-lora": ("hf_trainer/train_lora.py", {"hf_config": os.path.join(CFG, "tiny-llama")}, "transformers", []),
}


# the script's own command line, where a case is launched with one
ARGV = {
    "trl-sft-lora-fsdp1": ["--model_name_or_path", os.path.join(CFG, "tiny-llama-local"), "--output_dir", "out",
                           "--use_lora", "--flash_attention", "--push_to_hub", "--bf16", "True", "--packing"],
    "fabric-fsdp2-dp-submesh": ["--dp-submesh"],
    "hf-trainer-t5": ["--output_dir", "t5-ro-en", "--per_device_train_batch_size", "8", "--learning_rate", "3e-4",
                      "--max_steps", "1000", "--fsdp", "full_shard auto_wrap",
                      "--fsdp_config", os.path.join(F, "hf_trainer", "fsdp_config.json"), "--report_to", "none"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_framework_plan_equals_what_the_framework_builds(case):
    rel, options, framework, codes = CASES[case]
    settings = Settings(**{"world_size": 4, **options})
    res = assert_framework_plan_matches(os.path.join(F, rel), settings, ARGV.get(case))
    assert res.plan.framework == framework
    assert sorted({f.code for f in res.findings}) == codes, [f.text for f in res.findings]


def test_fabric_sets_up_without_skipped_statements():
    """Fabric refuses an optimizer over meta parameters; what Fabric set up is materialised in a real run,
    so the canonical set-up (model, then the optimizer over its parameters) replays without a skip."""
    for rel in ("lightning_gpt/fabric_train.py", "lightning_tp/fabric_tp.py"):
        res = lint_file(os.path.join(F, rel), Settings(world_size=8))
        assert not [n for n in res.notes if "skipped" in n], (rel, res.notes)


def test_fabric_tensor_parallel_local_shapes_are_torchs():
    """Fabric's parallelize_fn applies TP before FSDP2: every parameter's local shape on rank 0 is the
    one torch builds (TP halves the MLP, FSDP shards dim 0 over the data-parallel dimension)."""
    path = os.path.join(F, "lightning_tp", "fabric_tp.py")
    settings = Settings(world_size=8)
    res = lint_file(path, settings)
    _, real = real_units(path, settings)
    want = {_strip(strip_wrapper_prefixes(n)): list(p.to_local().shape) for n, p in real.model.named_parameters()}
    got = {p.fqn: list(p.local_shape_first) for ul in res.layout.units for p in ul.params}
    assert got == want
    assert got["transformer.h.0.mlp.c_fc.weight"] == [32, 64]     # [256, 64]: rows / 2 (TP), then / 4 (FSDP)
    assert res.plan.mesh.names == ("data_parallel", "tensor_parallel") and res.plan.mesh.shape == (4, 2)


# --------------------------------------------------------------------------------------------
# errors the framework or torch raises, predicted as findings that quote them
# --------------------------------------------------------------------------------------------
def _real_error(path: str, settings: Settings) -> str:
    with pytest.raises(ReplayError) as info:
        real_units(path, settings)
    cause = info.value
    while isinstance(cause, ReplayError) and cause.__cause__ is not None:
        cause = cause.__cause__
    return f"{type(cause).__name__}: {cause}"


def test_accelerate_wrong_class_is_fsd103_quoting_accelerate_at_the_yaml_line():
    path = os.path.join(ACC, "train.py")
    settings = Settings(world_size=4, **acc("fsdp1_wrong_class.yaml"))
    error = _real_error(path, settings)
    assert "Could not find the transformer layer class LLaMADecoderLayer" in error
    res = lint_file(path, settings)
    [f] = [f for f in res.findings if f.code == "FSD103"]
    assert error in f.text and "LlamaDecoderLayer" in f.fix
    assert f.path == settings.accelerate_config
    with open(f.path) as fh:
        assert "fsdp_transformer_layer_cls_to_wrap: LLaMADecoderLayer" in fh.read().splitlines()[f.line - 1]
    assert not [x for x in res.findings if x.code == "FSD101"]     # one cause, one finding


def test_accelerate_lora_without_orig_params_is_fsd201_quoting_torch():
    path = os.path.join(ACC, "train_lora.py")
    settings = Settings(world_size=4, **acc("fsdp1_no_orig_params.yaml"))
    error = _real_error(path, settings)
    res = lint_file(path, settings)
    [f] = [f for f in res.findings if f.code == "FSD201"]
    assert f.details["torch_error"] in error
    assert "fsdp_auto_wrap_policy" in f.fix and "accelerator.state.fsdp_plugin" in f.fix   # speaks PEFT


def test_lora_adapters_in_fp32_on_a_bf16_base_is_fsd203_quoting_torch(tmp_path):
    """Lightning without precision="bf16-true": PEFT keeps the adapters in float32 on the bf16 base."""
    src = os.path.join(F, "lightning_lora")
    for name in ("lit_module.py", "finetune.py"):
        with open(os.path.join(src, name)) as fh:
            text = fh.read().replace('precision="bf16-true"', 'precision="bf16-mixed"')
        text = text.replace('os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "tiny-llama")',
                            repr(os.path.join(CFG, "tiny-llama")))
        (tmp_path / name).write_text(text)
    path = str(tmp_path / "finetune.py")
    settings = Settings(world_size=4)
    error = _real_error(path, settings)
    res = lint_file(path, settings)
    [f] = [f for f in res.findings if f.code == "FSD203"]
    assert f.details["torch_error"] in error
    assert "autocast_adapter_dtype=False" in f.fix


def test_training_never_starts(tmp_path):
    """fit() stops before the first training step; Fabric before the first forward."""
    (tmp_path / "train.py").write_text('''
import lightning as L
import torch
import torch.nn as nn
from lightning.pytorch.strategies import FSDPStrategy


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return self.fc(x)


class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(4)])

    def training_step(self, batch, batch_idx):
        raise RuntimeError("training ran")

    def on_fit_start(self):
        raise RuntimeError("on_fit_start ran")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(accelerator="gpu", devices=2, strategy=FSDPStrategy(auto_wrap_policy={Block}), max_steps=3)
trainer.fit(Lit(), torch.utils.data.DataLoader(torch.randn(16, 32), batch_size=4))
''')
    res = lint_file(str(tmp_path / "train.py"), Settings(world_size=2))
    assert [u.module for u in res.plan.units] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", ""]
    assert not os.listdir(tmp_path / "__pycache__") if (tmp_path / "__pycache__").exists() else True
    assert sorted(os.listdir(tmp_path)) == ["train.py"], "no logs or checkpoints are written"


# --------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------
def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "fsdp_lint", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_cli_accelerate_config_on_a_model_alone():
    proc = _cli("--accelerate-config", "fixtures/frameworks/accelerate_sft/configs/fsdp1_wrong_class.yaml",
                "--hf-config", "fixtures/frameworks/configs/tiny-llama", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    [file] = doc["files"]
    assert file["path"].endswith("fsdp1_wrong_class.yaml")
    assert file["plan"]["framework"] == "accelerate" and file["model"]["class"] == "LlamaForCausalLM"
    [f] = file["findings"]
    assert f["code"] == "FSD103" and f["line"] == 14 and "`LlamaDecoderLayer`" in (f["message"] + " " + str(f.get("detail")))


def test_cli_framework_option_errors_are_one_line():
    for args, expect in [
        (["fixtures/frameworks/accelerate_sft/train.py", "--accelerate-config", "nope.yaml"], "no such file"),
        (["--hf-class", "AutoModelForCausalLM"], "--hf-class needs --hf-config"),
        (["fixtures/frameworks/accelerate_sft/train.py", "--accelerate-config",
          "fixtures/frameworks/accelerate_sft/configs/fsdp1.yaml"],
         "fsdp-lint never downloads: pass --hf-config"),
    ]:
        proc = _cli(*args)
        assert proc.returncode == 2, (args, proc.stdout)
        assert proc.stderr.count("\n") == 1 and expect in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_missing_framework_names_the_extra(monkeypatch):
    import importlib.util

    from fsdp_lint.engine import LintError

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lightning" else real_find_spec(name, *a))
    with pytest.raises(LintError) as info:
        analyse(os.path.join(F, "lightning_gpt", "fabric_train.py"), Settings(world_size=4))
    assert "lightning is not installed here" in str(info.value)
    assert "pip install 'fsdp-lint[lightning]'" in str(info.value)


# --------------------------------------------------------------------------------------------
# the Python API
# --------------------------------------------------------------------------------------------
API_SCRIPT = '''
import torch
import fsdp_lint
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from transformers import AutoConfig, AutoModelForCausalLM

CONFIG = AutoConfig.from_pretrained({config!r})


def build():
    model = AutoModelForCausalLM.from_config(CONFIG)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap={names!r})
    fsdp2_prepare_model(Accelerator(fsdp_plugin=plugin, mixed_precision="bf16"), model)
    return model


def lint(world_size):
    with fsdp_lint.record(world_size=world_size) as rec:
        build()
    return rec.report()


if __name__ == "__main__":
    model = build()
    optimizer = torch.optim.AdamW(model.parameters())
'''


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_record_a_frameworks_own_wrap_function(tmp_path):
    """``fsdp_lint.record()`` around accelerate's ``fsdp2_prepare_model`` (from the installed package): the
    units equal those real FSDP2 builds when the same function runs under the fake process group."""
    path = tmp_path / "api_wrap.py"
    path.write_text(API_SCRIPT.format(config=os.path.join(CFG, "tiny-llama"), names=["LlamaDecoderLayer"]))
    report = _load(path).lint(4)
    real, _ = torch_units(str(path), 4)
    assert [u.modules for u in report.plan.units] == [r["modules"] for r in real]
    assert [u.params for u in report.plan.units] == [r["params"] for r in real]
    assert report.plan.units[0].module == "model.layers.0" and report.plan.units[0].shard_numel > 0
    assert report.plan.units[0].numel == sum(report.tree.params[p].numel for p in report.plan.units[0].params)
    doc = json.loads(report.to_json())
    assert doc["files"][0]["plan"]["units"][0]["module"] == "model.layers.0"


def test_record_reports_a_missing_class_at_the_callers_line(tmp_path):
    path = tmp_path / "api_wrong.py"
    path.write_text(API_SCRIPT.format(config=os.path.join(CFG, "tiny-llama"), names=["LLaMADecoderLayer"]))
    [f] = [f for f in _load(path).lint(8).findings if f.code == "FSD103"]
    assert f.path == str(path) and "LLaMADecoderLayer" in path.read_text().splitlines()[f.line - 1]
    assert "Could not find the transformer layer class LLaMADecoderLayer" in f.text


def test_lint_module_reads_real_units():
    """A model wrapped for real (FSDP1 on CPU, FSDP2 on meta) under the fake process group."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    import fsdp_lint
    from oracle import fake_pg

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return self.b(self.a(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.layers = nn.ModuleList([Block() for _ in range(3)])
            self.head = nn.Linear(16, 32)

    with fake_pg(4):
        net = Net()
        for layer in net.layers:
            layer.a.requires_grad_(False)
        wrapped = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True,
                       device_id=torch.device("cpu"))
        report = fsdp_lint.lint_module(wrapped)
        units = {u.module: u for u in report.plan.units}
        assert list(units) == ["layers.0", "layers.1", "layers.2", ""]
        assert units["layers.0"].numel == 544 and units["layers.0"].shard_numel == 136
        assert [f.code for f in report.findings] == ["FSD202"]

        with torch.device("meta"):
            net2 = Net()
        for layer in net2.layers:
            fully_shard(layer)
        report2 = fsdp_lint.lint_module(net2)
        assert [u.module for u in report2.plan.units] == ["layers.0", "layers.1", "layers.2"]
        assert "FSD301" in [f.code for f in report2.findings]


def test_run_trains_framework_scripts_through_the_framework(cli):
    """`--run` (two gloo ranks, the framework's own code): Fabric's model is stepped through Fabric's
    backward (a plain `loss.backward()` is refused by Lightning); the Lightning Trainer's module through
    its `training_step` (it has no `forward`) on the first batch of the script's own loader; and
    accelerate's FSDP1 with use_orig_params=False leaves an optimizer built before `prepare()` holding
    none of the FlatParameters: FSD501 is confirmed, nothing trains."""
    res = cli(os.path.join(F, "lightning_gpt", "fabric_train.py"), os.path.join(F, "accelerate_plugin", "train_gpt2.py"),
              os.path.join(F, "lightning_lora", "finetune.py"),
              "--run", "--steps", "1", "--world-size", "2", "--format", "json", "--run-timeout", "240")
    doc = json.loads(res.out)
    runs = {os.path.basename(f["path"]): f for f in doc["run"]["files"]}
    findings = {os.path.basename(f["path"]): f["findings"] for f in doc["files"]}
    assert runs["fabric_train.py"]["status"] == "completed", runs["fabric_train.py"]
    assert not findings["fabric_train.py"], findings["fabric_train.py"]
    assert runs["finetune.py"]["status"] == "completed", runs["finetune.py"]
    assert "the first batch of the Trainer's train data loader" in json.dumps(runs["finetune.py"])
    assert [f["code"] for f in findings["finetune.py"]] == ["FSD202"]
    [f] = [f for f in findings["train_gpt2.py"] if f["code"] == "FSD501"]
    assert f["confirmed"] is True, f
    assert res.code == 1


def test_run_gives_seq2seq_models_their_labels():
    """T5/BART (`*ForConditionalGeneration`) derive their decoder inputs from `labels`: --run and
    --simulate give them the token ids as labels, as causal LMs get them."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    from fsdp_lint.model.inputs import make_inputs

    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(os.path.join(CFG, "tiny-t5")))
    spec = {"input_shape": [2, 16], "input_dtype": "long", "params": [n for n, _ in model.named_parameters()]}
    args, kwargs, how = make_inputs(spec, model, torch.device("meta"), 0, 1, None)
    assert kwargs["labels"] is args[0] and "labels = the token ids" in how


def test_trl_sft_notes_what_it_planned_without_and_touches_no_hub(tmp_path):
    settings = Settings(world_size=4, accelerate_config=CASES["trl-sft-lora-fsdp1"][1]["accelerate_config"])
    res = lint_file(os.path.join(F, "trl_sft", "sft.py"), settings, argv=ARGV["trl-sft-lora-fsdp1"], cwd=str(tmp_path))
    assert any("attn_implementation='flash_attention_2' needs `flash_attn`" in n for n in res.notes), res.notes
    assert any("org/chat-data" in n for n in res.notes), res.notes      # the data set that stood in
    assert not os.listdir(tmp_path)                                   # no output_dir, nothing written


def test_a_tokenizer_that_is_not_here_is_named_as_the_cause(cli):
    res = cli("fixtures/frameworks/trl_sft/sft.py", "--hf-config", "fixtures/frameworks/configs/tiny-llama", "--",
              "--model_name_or_path", "org/llama-sft", "--output_dir", "out")
    assert res.code == 2, res.out
    assert res.err.count("\n") == 1 and "Traceback" not in res.err, res.err
    assert "no tokenizer for 'org/llama-sft' here, and fsdp-lint never downloads" in res.err
