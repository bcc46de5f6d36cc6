"""The simulated node's GPU (``--gpu``): every probe a script or library makes answers as that GPU does,
consistently (torch's own ``is_bf16_supported``/``is_tf32_supported``, transformers' and accelerate's checks
agree with the profile), the job's precision follows it, and nothing outlives the replay.

Oracles: the profile's data-sheet values (`fsdp_lint.gpus`), torch's and the libraries' own functions run
against the simulated node, and the real HF Trainer building real FSDP on the same node (test_frameworks'
`assert_framework_plan_matches`)."""
from __future__ import annotations

import functools
import os
import shutil

import pytest
import torch

from conftest import REPO
from fsdp_lint import gpus
from fsdp_lint.config import Settings
from fsdp_lint.engine import LintError, lint_file
from fsdp_lint.entry.source import read_source
from fsdp_lint.replay import frameworks, replay
from fsdp_lint.replay.frameworks.options import FrameworkOptions

PROBES = os.path.join(REPO, "fixtures", "repos", "node_probes")
PROBES_TRAIN = os.path.join(PROBES, "pretrain", "train.py")
CHAT = os.path.join(REPO, "fixtures", "repos", "chat_sft")
CHAT_TRAIN = os.path.join(CHAT, "src", "chat_sft", "train.py")
TINY_LLAMA = os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama-local")


def _replay_node(gpu, world_size=4):
    with frameworks.configured(FrameworkOptions(gpu=gpu)):
        res = replay(read_source(PROBES_TRAIN), world_size, cwd=PROBES)
    return res.namespace["NODE"]


@functools.lru_cache(maxsize=None)
def _node(gpu):
    """What the fixture's node report says on `gpu` (one replay per GPU for the whole module)."""
    return _replay_node(gpu)


@pytest.mark.parametrize("gpu", ["h100", "a100-40gb", "v100", "mi300x", "b200"])
def test_every_probe_answers_as_the_profiles_gpu(gpu):
    profile = gpus.profile(gpu)
    node = _node(gpu)
    assert node["available"] and node["count"] == 4 and node["accelerator"] == "cuda"
    assert (node["cuda"], node["hip"]) == (profile.cuda_version, profile.hip_version)
    assert node["name"] == node["props_name"] == profile.device_name
    assert node["capability"] == node["props_capability"] == profile.capability
    assert node["total_memory"] == node["mem_get_info"][1] == profile.memory_bytes
    assert node["multi_processor_count"] == profile.multi_processor_count
    assert node["arch_list"] == list(profile.arch_list)
    # torch's own functions, reading the simulated properties, agree with the profile's data sheet
    assert node["bf16_native"] == profile.bf16
    assert node["tf32"] == profile.tf32
    # ... and the libraries' checks with torch's (HF asks torch.cuda.is_bf16_supported(), which counts
    # the bf16 a V100 emulates; its TF32 check is the capability, as torch's is)
    assert node["hf_bf16"] == node["accelerate_bf16"] == node["bf16"]
    assert node["hf_tf32"] == (profile.tf32 and profile.vendor == "nvidia")
    assert node["cudnn"] and node["nccl"]


@pytest.mark.parametrize("gpu", ["h100", "t4", "mi300x"])
def test_nvidia_smi_answers_as_the_profiles_gpus(gpu):
    """Setup code and libraries ask nvidia-smi (it does not initialise CUDA): it lists the node's GPUs,
    one per rank as torch.cuda counts them, with the profile's memory; accelerate's own get_gpu_info and
    driver check read it; an AMD node has no nvidia-smi."""
    profile = gpus.profile(gpu)
    node = _node(gpu)
    if profile.vendor != "nvidia":
        assert node["smi_list"] is None and node["accelerate_gpu_info"] is None
        return
    assert node["smi_list"] == [f"GPU {i}: {profile.device_name} (UUID: GPU-00000000-0000-0000-0000-{i:012d})"
                                for i in range(node["count"])]
    assert node["smi_memory_mib"] == [node["total_memory"] >> 20] * node["count"]
    assert node["accelerate_gpu_info"] == ([profile.device_name] * node["count"], node["count"])
    from packaging.version import parse

    assert parse(node["accelerate_driver"]) >= parse("550.40.07")   # accelerate's own floor for its P2P check


def test_the_precision_a_script_picks_follows_the_gpu():
    # `torch.version.cuda and capability >= (8, 0)`: bf16 on Ampere and later, fp16 on a V100 or on ROCm
    assert _node("h100")["dtype"] == _node("a100-80gb")["dtype"] == torch.bfloat16
    assert _node("v100")["dtype"] == _node("t4")["dtype"] == _node("mi300x")["dtype"] == torch.float16


def test_nothing_the_node_answered_outlives_the_replay():
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_tf32_available

    before = (torch.version.cuda, torch.version.hip, torch.cuda.is_available(), torch.cuda.device_count(),
              torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision(), is_torch_bf16_gpu_available(), is_torch_tf32_available(),
              os.environ.get("PATH"), shutil.which("nvidia-smi"))
    node = _replay_node("h100")
    assert node["allow_tf32"] is True and node["hf_tf32"] is True     # the script turned TF32 on
    after = (torch.version.cuda, torch.version.hip, torch.cuda.is_available(), torch.cuda.device_count(),
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision(), is_torch_bf16_gpu_available(), is_torch_tf32_available(),
             os.environ.get("PATH"), shutil.which("nvidia-smi"))
    assert after == before
    assert node["smi_list"]       # the replay's nvidia-smi answered, and is gone with its folder


def test_gpu_reaches_the_linted_file_from_the_command_line_and_the_config(cli, tmp_path):
    import json
    import shutil

    def dtypes(res):
        assert res.code == 0, res.err
        return {u["param_dtype"] for u in json.loads(res.out)["files"][0]["plan"]["units"] if u["numel"]}

    assert dtypes(cli(PROBES_TRAIN, "--format", "json", cwd=PROBES)) == {"bfloat16"}     # h100 by default
    assert dtypes(cli(PROBES_TRAIN, "--gpu", "v100", "--format", "json", cwd=PROBES)) == {"float16"}
    repo = shutil.copytree(PROBES, tmp_path / "node_probes")
    with open(repo / "pyproject.toml", "a", encoding="utf-8") as fh:
        fh.write('\n[tool.fsdp-lint]\ngpu = "t4"\n')
    assert dtypes(cli(str(repo / "pretrain" / "train.py"), "--format", "json", cwd=str(repo))) == {"float16"}


CHAT_ARGS = ["--model_name_or_path", TINY_LLAMA, "--extra_tokens", "500", "--output_dir", "out",
             "--fsdp", "full_shard auto_wrap", "--fsdp_config", os.path.join(CHAT, "configs", "fsdp.json"),
             "--dataset_mixer", os.path.join(CHAT, "configs", "mixture.json"), "--report_to", "none"]


@pytest.mark.parametrize("gpu,tf32,dtype", [("h100", True, "bfloat16"), ("v100", False, "float16")])
def test_the_hf_trainer_on_the_node_builds_what_the_fsdp_lint_plan_says(gpu, tf32, dtype, monkeypatch):
    # the real Trainer, with the real FSDP under the fake process group on the same node, is the oracle;
    # the script picks bf16 or fp16 from the capability, `--tf32 True` is accepted by HF's own check
    from test_frameworks import assert_framework_plan_matches

    monkeypatch.chdir(CHAT)
    argv = CHAT_ARGS + (["--tf32", "True"] if tf32 else [])
    res = assert_framework_plan_matches(CHAT_TRAIN, Settings(world_size=4, gpu=gpu), argv)
    assert {u.param_dtype or res.tree.params[u.params[0]].dtype for u in res.plan.units if u.params} == {dtype}


def test_tf32_on_a_gpu_without_it_is_refused_as_hf_refuses_it(monkeypatch):
    monkeypatch.chdir(CHAT)
    with pytest.raises(LintError, match="--tf32 requires Ampere"):
        lint_file(CHAT_TRAIN, Settings(world_size=4, gpu="v100"), argv=CHAT_ARGS + ["--tf32", "True"])


def _chat_tokens():
    import ast

    tree = ast.parse(open(CHAT_TRAIN, encoding="utf-8").read())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CHAT_TOKENS")


def test_resize_token_embeddings_to_the_tokenizer_gives_the_real_models_shapes(monkeypatch):
    # the new rows' mean initialisation reads values (`positive_definite.check(cov).all()`) from meta
    # tensors; the plan must have the vocabulary of the real model, resized on CPU by transformers itself
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_LLAMA)
    tokenizer.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": _chat_tokens()})
    tokenizer.add_tokens([f"<reserved_{i}>" for i in range(500)])
    real = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY_LLAMA))
    before = real.get_input_embeddings().weight.shape[0]
    real.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8)
    expected = {name: tuple(p.shape) for name, p in real.named_parameters()}
    assert real.get_input_embeddings().weight.shape[0] > before      # the resize grows the vocabulary

    monkeypatch.chdir(CHAT)
    res = lint_file(CHAT_TRAIN, Settings(world_size=4), argv=CHAT_ARGS)
    assert {name: tuple(p.shape) for name, p in res.tree.params.items()} == expected
    assert any(n.startswith("train.py:") and "no data here" in n for n in res.notes), res.notes


def test_a_run_rank_on_a_real_gpu_asks_the_real_cuda_and_a_cpu_rank_the_profile():
    # --run on GPUs: the rank's device is CUDA, and the probes reach the real device (no GPU here: the
    # patches the node would install are recorded instead of applied)
    from fsdp_lint.replay import node
    from fsdp_lint.replay.recorders import Recorder

    def patched(device):
        rec = Recorder("train.py", 4, real=True)
        rec.device = device
        names = []
        node.simulate_cuda(rec, lambda obj, name, value: names.append(name), gpus.profile("h100"))
        return set(names)

    probes = {"get_device_name", "get_device_capability", "get_device_properties", "is_available", "cuda"}
    assert not probes & patched(torch.device("cuda", 1))
    assert probes <= patched(torch.device("cpu"))


@pytest.mark.parametrize("gpu", ["h100", "mi300x", "l4", "a10g"])
def test_peer_access_between_the_nodes_gpus_answers_as_the_board_does(gpu):
    # a script asks before its first collective whether the GPUs reach each other directly (NCCL hangs
    # where they do not): NVLink / Infinity Fabric boards do, the PCIe cards of cloud nodes do not; a
    # device and itself is no peer, as CUDA answers
    node = _node(gpu)
    assert node["p2p"] is gpus.profile(gpu).peer_access
    assert node["self_peer"] is False
    assert "PyTorch CUDA memory summary" in node["memory_report"] and node["busy"] == 0


def _public_cuda_functions():
    import inspect

    return sorted(n for n in dir(torch.cuda) if not n.startswith("_") and callable(getattr(torch.cuda, n))
                  and not inspect.isclass(getattr(torch.cuda, n)) and not inspect.ismodule(getattr(torch.cuda, n)))


def test_every_public_torch_cuda_function_answers_on_the_simulated_node(monkeypatch):
    # the CPU build has no torch._C._cuda_* bindings: each public function of the installed torch.cuda
    # (a new torch adds some) must answer as a node's GPU does, never raise AttributeError/RuntimeError
    from fsdp_lint.replay import node
    from fsdp_lint.replay.recorders import Recorder

    rec = Recorder("train.py", 8)
    # (raising=False: the node adds the private bindings a CPU build lacks)
    node.simulate_cuda(rec, functools.partial(monkeypatch.setattr, raising=False), gpus.profile("h100"))
    args = {"can_device_access_peer": (0, 1), "caching_allocator_alloc": (1024,), "caching_allocator_delete": (0,),
            "check_error": (0,), "set_rng_state": (torch.get_rng_state(),),
            "set_rng_state_all": ([torch.get_rng_state()] * 8,), "set_stream": (torch.cuda.current_stream(),),
            "set_sync_debug_mode": (0,), "get_stream_from_external": (0,), "device_of": (torch.zeros(1),),
            "caching_allocator_enable": (True,), "make_graphed_callables": (torch.nn.Linear(2, 2), (torch.zeros(1, 2),)),
            "change_current_allocator": (None,), "use_mem_pool": (None,)}
    failed = {}
    for name in _public_cuda_functions():
        if name in {"Optional", "cast", "classproperty", "lru_cache"}:
            continue                 # typing / decorator helpers torch.cuda re-exports
        try:
            value = getattr(torch.cuda, name)(*args.get(name, ()))
            if name in {"caching_allocator_disabled", "use_mem_pool", "device", "stream"}:
                with value:
                    pass
        except Exception as exc:  # noqa: BLE001  every failure is listed
            failed[name] = f"{type(exc).__name__}: {exc}"
    assert not failed, failed
    assert torch.cuda.can_device_access_peer(0, 7) is True and torch.cuda.can_device_access_peer(3, 3) is False
    # the device as scripts name it: an index, "cuda", "cuda:N", a torch.device
    for device in (0, "cuda", "cuda:1", torch.device("cuda", 2), None):
        assert torch.cuda.get_device_properties(device).total_memory == gpus.profile("h100").memory_bytes
    with pytest.raises(AssertionError):          # torch's own check of the device ids, as on a node
        torch.cuda.can_device_access_peer(0, 8)


def test_a_cuda_extension_that_binds_torchs_private_cuda_functions_at_import_loads(cli, tmp_path):
    """An extension binding ``torch._C._cuda_getCurrentRawStream`` at import (bitsandbytes' CUDA backend:
    ``_get_raw_stream = torch._C._cuda_getCurrentRawStream``) imports on the node, where the CPU build
    raised AttributeError and the file could not be linted. The raw handle of the current stream is the
    default stream's, NULL; the device and the count are the node's; nothing outlives the replay."""
    (tmp_path / "quantkit").mkdir()
    (tmp_path / "quantkit" / "__init__.py").write_text('''
import torch

_get_raw_stream = torch._C._cuda_getCurrentRawStream
STREAM = _get_raw_stream(torch.cuda.current_device())
DEVICES = (torch._C._cuda_getDevice(), torch._C._cuda_getDeviceCount())
''')
    (tmp_path / "train.py").write_text('''
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

import quantkit

assert quantkit.STREAM == 0 and quantkit.DEVICES == (0, 4), (quantkit.STREAM, quantkit.DEVICES)
model = FSDP(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)))
''')
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    res = cli("train.py", "--world-size", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    import json

    f = json.loads(res.out)["files"][0]
    assert f["model"]["numel"] == 2 * (16 * 16 + 16) and not f.get("skipped_statements")
    assert not hasattr(torch._C, "_cuda_getCurrentRawStream") or torch.cuda.is_available()


NCCL_OPTIONS_SCRIPT = '''import datetime

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=30))
override = {}
if dist.is_nccl_available():     # per-dimension group timeouts: NCCL options for the mesh's own groups
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(minutes=30)
    options.is_high_priority_stream = True
    override["dp_shard"] = ("nccl", options)
mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp_replicate", "dp_shard"), backend_override=override)
model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
for block in model:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
'''


def test_nccl_is_available_and_so_are_its_group_options(tmp_path, monkeypatch):
    """The node says NCCL is available (``dist.is_nccl_available()``), so ``dist.ProcessGroupNCCL.Options``
    is there too (a CPU build of torch has no such class: the statement failed and was skipped); the
    options reach the mesh's groups and the plan is real FSDP2's on that mesh; nothing is left behind."""
    from test_idioms import assert_plan_matches_torch
    import torch.distributed as dist

    (tmp_path / "train.py").write_text(NCCL_OPTIONS_SCRIPT)
    monkeypatch.chdir(tmp_path)
    had = hasattr(dist, "ProcessGroupNCCL")
    res, _ = assert_plan_matches_torch(str(tmp_path / "train.py"), 8)
    assert not res.skipped_statements, res.skipped_statements
    assert res.plan.mesh is not None and res.plan.mesh.size == 8
    assert hasattr(dist, "ProcessGroupNCCL") == had
