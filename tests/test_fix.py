"""`--fix`, `--unsafe-fixes`, `--diff`: each mechanical fix applied to a copy of a fixture written
with comments and odd formatting; the fixed file keeps them, re-linted no longer has the finding,
and builds and steps under real torch (FSDP1/FSDP2 on CPU, fake process group)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

import oracle
from conftest import REPO

FIXTURES = os.path.join(REPO, "fixtures", "fix")


def _copy(tmp_path, name: str) -> str:
    for f in ("model.py", name):
        shutil.copy(os.path.join(FIXTURES, f), tmp_path / f)
    return str(tmp_path / name)


def _codes(cli, path, *args):
    res = cli(path, "--output-format", "json", "--world-size", "2", *args)
    assert res.code in (0, 1), res.err
    return [f["code"] for f in json.loads(res.out)["files"][0]["findings"]]


def _load(path: str) -> dict:
    """The fixed file's functions (its training loop sits behind `if __name__ == "__main__"`)."""
    sys.path.insert(0, os.path.dirname(path))
    sys.modules.pop("model", None)
    try:
        ns: dict = {"__name__": "fixed"}
        exec(compile(open(path).read(), path, "exec"), ns)
        return ns
    finally:
        sys.path.pop(0)
        sys.modules.pop("model", None)


def _step(model) -> None:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(torch.randint(0, 256, (2, 16))).float().mean().backward()
    optimizer.step()


def _fsdp2(path: str):
    """shard(TinyDecoder(), mesh) of the file, then a step; returns the model."""
    from torch.distributed.device_mesh import init_device_mesh

    ns = _load(path)
    with oracle.fake_pg(2):
        mesh = init_device_mesh("cpu", (2,))
        model = ns["shard"](ns.get("build", ns["TinyDecoder"])(), mesh)
        _step(model)
        return model


def test_fsd301_fix_adds_the_root_wrap_with_the_blocks_arguments(cli, tmp_path):
    from torch.distributed.fsdp import FSDPModule

    path = _copy(tmp_path, "fsdp2_no_root.py")
    before = open(path).read()
    res = cli(path, "--output-format", "concise", "--world-size", "2")
    assert res.code == 1 and "FSD301 [*] [error]" in res.out and "[*] 1 fixable with the `--fix` option." in res.out

    res = cli(path, "--fix", "--output-format", "concise", "--world-size", "2")
    assert res.code == 0, res.out + res.err
    assert "Found 1 finding (1 fixed, 0 remaining) in 1 file." in res.out
    after = open(path).read()
    assert after == before.replace(
        "        )\n    return model\n",
        "        )\n    fully_shard(model, mesh=mesh)\n    return model\n")   # comments, spacing kept
    assert "FSD301" not in _codes(cli, path)
    assert isinstance(_fsdp2(path), FSDPModule)         # the root is a unit now; a step runs


def test_fsd105_fix_shards_the_elements_of_the_container(cli, tmp_path):
    path = _copy(tmp_path, "fsdp2_container_unit.py")
    before = open(path).read()
    assert isinstance(oracle.raises(lambda: _fsdp2(path)), ValueError)    # torch refuses the container
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    assert open(path).read() == before.replace(
        "        fully_shard(model.layers, mesh=mesh)  # meant: one group per block\n",
        "        for block in model.layers:\n            fully_shard(block, mesh=mesh)  # meant: one group per block\n")
    assert _codes(cli, path) == []
    _fsdp2(path)


def test_fsd201_fix_is_unsafe_and_applied_only_with_unsafe_fixes(cli, tmp_path):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    path = _copy(tmp_path, "fsdp1_frozen_mix.py")
    before = open(path).read()

    def build():
        ns = _load(path)
        with oracle.fake_pg(2):
            model = ns["wrap"](ns["freeze"](ns["TinyDecoder"]()), torch.device("cpu"))
            _step(model)
            return model

    assert isinstance(oracle.raises(build), ValueError)       # torch: uniform requires_grad needed
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 1 and open(path).read() == before       # unsafe: not applied, and said so
    assert "FSD201 [error]" in res.out and "1 hidden fix can be enabled with the `--unsafe-fixes` option." in res.out
    res = cli(path, "--diff", "--unsafe-fixes", "--world-size", "2")
    assert res.code == 1 and "-                use_orig_params=False)" in res.out \
        and "+                use_orig_params=True)" in res.out and open(path).read() == before
    res = cli(path, "--fix", "--unsafe-fixes", "--world-size", "2", "--output-format", "json")
    fixed = open(path).read()
    assert fixed == before.replace("use_orig_params=False)", "use_orig_params=True)")
    assert "FSD201" not in _codes(cli, path)
    assert isinstance(build(), FSDP)


def test_fix_edits_are_in_the_json_with_their_applicability(cli, tmp_path):
    path = _copy(tmp_path, "fsdp1_frozen_mix.py")
    res = cli(path, "--output-format", "json", "--world-size", "2")
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD201"]
    assert f["fix_applicability"] == "unsafe" and "gradient memory" in f["fix_edits"]["title"]
    (edit,) = f["fix_edits"]["edits"]
    assert edit["content"] == "True" and edit["line"] == before_line(path, "use_orig_params=False)")


def before_line(path: str, needle: str) -> int:
    return next(i for i, line in enumerate(open(path), start=1) if needle in line)


def test_diff_exits_zero_when_there_is_nothing_to_fix(cli, tmp_path):
    path = _copy(tmp_path, "fsdp2_no_root.py")
    cli(path, "--fix", "--world-size", "2")
    res = cli(path, "--diff", "--world-size", "2")
    assert res.code == 0 and res.out == ""


def test_fsd501_fix_moves_the_optimizer_below_the_wrap(cli, tmp_path):
    from torch.distributed.device_mesh import init_device_mesh

    path = _copy(tmp_path, "fsdp2_optimizer_first.py")
    before = open(path).read()

    def optimizer_holds_the_model_parameters() -> bool:
        ns = _load(path)
        with oracle.fake_pg(2):
            model, optimizer = ns["setup"](init_device_mesh("cpu", (2,)))
            held = {id(p) for g in optimizer.param_groups for p in g["params"]}
            model(torch.randint(0, 256, (2, 16))).float().mean().backward()
            optimizer.step()
            return held == {id(p) for p in model.parameters()}

    assert not optimizer_holds_the_model_parameters()       # torch: fully_shard replaced them
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    moved = ("    optimizer = torch.optim.AdamW(model.parameters(),\n"
             "                                  lr=lr, weight_decay=0.1)   # AdamW, decoupled decay\n")
    assert open(path).read() == before.replace(moved, "").replace(
        "    fully_shard(model, mesh=mesh)\n", "    fully_shard(model, mesh=mesh)\n" + moved)
    assert "FSD501" not in _codes(cli, path)
    assert optimizer_holds_the_model_parameters()


def test_fsd501_no_edit_when_the_optimizer_is_used_before_the_wrap(cli, tmp_path):
    path = _copy(tmp_path, "fsdp2_optimizer_first.py")
    src = open(path).read().replace("    for block in model.layers:\n",
                                    "    lr0 = optimizer.param_groups[0][\"lr\"]\n    for block in model.layers:\n", 1)
    open(path, "w").write(src)
    res = cli(path, "--output-format", "json", "--world-size", "2")
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD501"]
    assert f["fix_edits"] is None and "move the `AdamW(...)`" in f["fix"]     # the text fix only


def test_fsd401_fix_groups_the_tied_modules(cli, tmp_path):
    path = _copy(tmp_path, "fsdp2_tied_split.py")
    before = open(path).read()
    exc = oracle.raises(lambda: _fsdp2(path))
    assert exc is not None and "shared with a parameter already managed" in str(exc)    # torch refuses
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert "FSD401" not in res.out, res.out
    assert open(path).read() == before.replace(
        "    fully_shard(model.tok_embeddings, mesh=mesh)   # the embedding alone\n", "").replace(
        "    fully_shard( model.output ,mesh=mesh )  # odd spacing, kept\n",
        "    fully_shard( [model.tok_embeddings, model.output] ,mesh=mesh )  # odd spacing, kept\n")
    assert _codes(cli, path) == []
    _fsdp2(path)


def test_sarif_results_carry_the_fix_as_artifact_changes(cli, tmp_path):
    """SARIF 2.1.0 §3.55: `fixes[].artifactChanges[].replacements[]` with the deleted region and the
    inserted text; applying them gives the file `--fix` writes."""
    from fsdp_lint.fix.codemods import apply_to_text
    from fsdp_lint.fix.edits import Edit

    path = _copy(tmp_path, "fsdp2_no_root.py")
    res = cli(path, "--output-format", "sarif", "--world-size", "2")
    (result,) = [r for r in json.loads(res.out)["runs"][0]["results"] if r["ruleId"] == "FSD301"]
    assert result["properties"]["fixApplicability"] == "safe"
    (fix,) = result["fixes"]
    (change,) = fix["artifactChanges"]
    assert change["artifactLocation"]["uri"].endswith("fsdp2_no_root.py")
    edits = [Edit(path, r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"],
                  r["deletedRegion"]["endLine"], r["deletedRegion"]["endColumn"], r["insertedContent"]["text"])
             for r in change["replacements"]]
    expected = apply_to_text(open(path).read(), edits)
    cli(path, "--fix", "--world-size", "2")
    assert open(path).read() == expected


def test_fsd103_fix_in_the_accelerate_yaml_keeps_its_layout_and_accelerate_then_wraps(cli, tmp_path):
    """The unique close class name replaces the misspelt one in the YAML, nothing else of the file
    changes; linted again, the real accelerate wraps the model (its own ValueError is gone) with one
    unit per decoder layer. Unsafe: applied with --unsafe-fixes only."""
    src = os.path.join(REPO, "fixtures", "frameworks", "accelerate_sft")
    shutil.copytree(src, tmp_path / "acc")
    yaml = tmp_path / "acc" / "configs" / "fsdp1_wrong_class.yaml"
    before = yaml.read_text()
    args = (str(tmp_path / "acc" / "train.py"), "--accelerate-config", str(yaml), "--hf-config",
            os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama"), "--world-size", "4")
    res = cli(*args, "--fix", "--output-format", "concise")
    assert res.code == 1 and yaml.read_text() == before and "FSD103 [error]" in res.out
    res = cli(*args, "--fix", "--unsafe-fixes", "--output-format", "concise")
    assert yaml.read_text() == before.replace("cls_to_wrap: LLaMADecoderLayer\n", "cls_to_wrap: LlamaDecoderLayer\n")
    res = cli(*args, "--output-format", "json")
    doc = json.loads(res.out)["files"][0]
    assert not [f for f in doc["findings"] if f["code"] == "FSD103"]
    assert [u["class"] for u in doc["plan"]["units"]].count("LlamaDecoderLayer") == 4


def test_fsd302_fix_moves_the_root_call_below_the_blocks(cli, tmp_path):
    from torch.distributed.fsdp import FSDPModule

    path = _copy(tmp_path, "fsdp2_root_first.py")
    before = open(path).read()
    assert oracle.raises(lambda: _fsdp2(path)) is not None          # torch fails on the blocks
    res = cli(path, "--fix", "--world-size", "2", "--output-format", "concise")
    assert res.code == 0, res.out + res.err
    root = "    fully_shard(model,\n                mesh=mesh)      # the root first: torch fails on the blocks below\n"
    loop = "    for block in model.layers:\n        fully_shard(block, mesh=mesh)\n"
    assert open(path).read() == before.replace(root + loop, loop + root)
    assert _codes(cli, path) == []
    model = _fsdp2(path)
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.layers)


def test_fsd201_under_accelerate_edits_the_yaml_not_the_script(cli, tmp_path):
    """The plan is accelerate's: the edit sets `fsdp_use_orig_params: true` in its config (the script's
    `accelerator.prepare(...)` is left alone), and the real accelerate then wraps without the mix error."""
    shutil.copytree(os.path.join(REPO, "fixtures", "frameworks", "accelerate_sft"), tmp_path / "acc")
    script = tmp_path / "acc" / "train_lora.py"
    yaml = tmp_path / "acc" / "configs" / "fsdp1_no_orig_params.yaml"
    script_before, yaml_before = script.read_text(), yaml.read_text()
    args = (str(script), "--accelerate-config", str(yaml), "--hf-config",
            os.path.join(REPO, "fixtures", "frameworks", "configs", "tiny-llama"), "--world-size", "4")
    res = cli(*args, "--output-format", "json")
    (f,) = [x for x in json.loads(res.out)["files"][0]["findings"] if x["code"] == "FSD201"]
    assert "`fsdp_use_orig_params: true` in the accelerate config" in f["fix"]
    cli(*args, "--fix", "--unsafe-fixes")
    assert script.read_text() == script_before
    assert yaml.read_text() == yaml_before.replace("fsdp_use_orig_params: false\n", "fsdp_use_orig_params: true\n")
    assert "FSD201" not in _codes(cli, *args[:1], *args[1:-2])
