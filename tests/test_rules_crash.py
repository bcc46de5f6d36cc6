"""The rules whose mistakes make torch itself fail (FSD201, FSD203, FSD204 on FSDP1; FSD203, FSD302
on FSDP2), checked against real torch under the fake process group.

For every INVALID example of those rules: real torch raises, with the message the finding quotes,
at the line the finding points at; the VALID counterpart runs. The fixes the findings print (a
policy, a grouping) are applied and run too. FSD202's numbers are torch's own
(`_validate_frozen_params` warning text, FlatParameter shard sizes). The realistic fixtures are
checked the same way.

FSDP1 files run through ``replay(real=True)`` (the file's own statements, real FSDP1 on CPU);
FSDP2 examples are executed as they are with real ``fully_shard`` on CPU, followed by the root's
lazy init (what the first forward runs), because FSDP2 checks dtypes only then.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import fake_pg, fsdp1_units  # noqa: E402

from fsdp_lint.config import Settings  # noqa: E402
from fsdp_lint.engine import lint_file  # noqa: E402
from fsdp_lint.replay import ReplayError, replay  # noqa: E402
from fsdp_lint.check.rule import rule_by_code  # noqa: E402
from fsdp_lint.entry.source import read_source  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BAD = REPO / "fixtures" / "bad"
IDIOMS = REPO / "fixtures" / "idioms"
WS = 4

# INVALID index -> VALID index of its fixed counterpart, where it is not the same index
PAIRS = {("FSD302", 2): 1}   # the duplicate fully_shard call removed = the children-first plan
CRASH_RULES = ("FSD201", "FSD203", "FSD204", "FSD302")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _write(tmp_path: Path, source: str, name: str = "example.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def _findings(path: Path, code: str):
    res = lint_file(str(path), Settings(world_size=WS))
    return [f for f in res.findings if f.code == code]


def _norm(text: str) -> str:
    """torch prints sets of dtypes in hash order: compare them sorted."""
    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(x.strip() for x in m.group(1).split(","))) + "}",
                  text)


def _run_fsdp1(path: Path):
    """(exception torch raised, line of the file where it raised) for the file's own wrap code."""
    try:
        replay(read_source(str(path)), WS, real=True)
    except ReplayError as exc:
        cause = exc.__cause__
        assert cause is not None, f"the replay failed without a torch error: {exc}"
        m = re.match(rf"{re.escape(path.name)}:(\d+):", str(exc))
        return cause, int(m.group(1)) if m else None
    return None, None


def _run_fsdp2(path: Path, source: str):
    """Execute an FSDP2 example as it is (real fully_shard on CPU), then the root's lazy init."""
    with fake_pg(WS):
        ns = {"__name__": "example", "__file__": str(path)}
        try:
            exec(compile(source, str(path), "exec"), ns)
            model = ns["model"]
            from torch.distributed.fsdp import FSDPModule

            if isinstance(model, FSDPModule):
                model._get_fsdp_state()._lazy_init()
        except Exception as exc:  # noqa: BLE001 - that is the point
            frames = [fs for fs in traceback.extract_tb(exc.__traceback__) if fs.filename == str(path)]
            return exc, frames[-1].lineno if frames else None
    return None, None


def _run_real(path: Path, source: str):
    return _run_fsdp2(path, source) if "fully_shard" in source else _run_fsdp1(path)


def _line_of(path: Path, needle: str, nth: int = 0) -> int:
    """The line of the `nth` statement that starts with `needle` (not the docstring's mention)."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip().startswith(needle)]
    assert len(hits) > nth, f"{needle!r} not in {path.name}"
    return hits[nth]


def _assert_quotes_torch(finding, exc: BaseException) -> None:
    """The finding quotes what torch raised: same exception type, same message (first line)."""
    assert finding.details["torch_exception"] == type(exc).__name__, (finding.details, exc)
    said = _norm(str(exc).splitlines()[0])
    quoted = _norm(finding.details["torch_error"])
    assert said.startswith(quoted), f"torch: {said!r}\nquoted: {quoted!r}"
    assert quoted in _norm(finding.text)


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"_fixture_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _frozen_warnings(model_fn, **fsdp_kwargs):
    """FSDP1's `_validate_frozen_params` warnings: {module: (N, M)} from "N numel instead of M numel"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        units = fsdp1_units(model_fn, world_size=WS, **fsdp_kwargs)
    out = {}
    for w in caught:
        m = re.match(r"(\S*) has both parameters with requires_grad=True and False\..*?\((\d+) numel instead of "
                     r"(\d+) numel before sharding", str(w.message), re.S)
        if m:
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out, units


# --------------------------------------------------------------------------------------------
# the rules' own examples
# --------------------------------------------------------------------------------------------
def _crash_cases():
    for code in CRASH_RULES:
        for i, _ in enumerate(rule_by_code(code).INVALID):
            yield pytest.param(code, i, id=f"{code}-invalid-{i}")


@pytest.mark.parametrize("code,i", list(_crash_cases()))
def test_torch_raises_what_the_finding_says(tmp_path, code, i):
    rule = rule_by_code(code)
    bad = rule.INVALID[i]
    path = _write(tmp_path, bad.source)
    hits = _findings(path, code)
    assert hits, f"{code} did not fire on INVALID[{i}]"
    exc, line = _run_real(path, bad.source)
    assert exc is not None, f"torch accepted {code} INVALID[{i}]"
    _assert_quotes_torch(hits[0], exc)
    if line is not None and "lazy_init" not in "".join(traceback.format_tb(exc.__traceback__)):
        # wrap-time failures: the finding points at the statement that fails
        assert line in {f.line for f in hits}, (line, [f.line for f in hits])

    good = rule.VALID[PAIRS.get((code, i), i)]
    good_path = _write(tmp_path, good.source, "fixed.py")
    exc, _ = _run_real(good_path, good.source)
    assert exc is None, f"torch rejects the VALID counterpart of {code} INVALID[{i}]: {exc}"
    assert not _findings(good_path, code)


@pytest.mark.parametrize("code,i", [("FSD201", 0), ("FSD201", 1), ("FSD203", 0)])
def test_suggested_policy_runs_in_torch(tmp_path, code, i):
    """The policy a finding suggests, put in place of the file's, makes torch accept the plan and
    leaves no finding."""
    bad = rule_by_code(code).INVALID[i]
    path = _write(tmp_path, bad.source)
    (finding,) = _findings(path, code)
    policy = finding.details["policy"]
    assert policy and policy in finding.fix
    lines = bad.source.splitlines()
    assert lines[finding.line - 1].startswith("model = FSDP(model, auto_wrap_policy=")
    lines[finding.line - 1] = f"model = FSDP(model, auto_wrap_policy={policy})"
    fixed_source = "\n".join(lines) + "\n"
    fixed = _write(tmp_path, fixed_source, "fixed.py")
    exc, _ = _run_fsdp1(fixed)
    assert exc is None, f"{policy} still fails: {exc}"
    assert not _findings(fixed, code)


def test_fsd202_numbers_are_torchs(tmp_path):
    """FSD202's "N numel instead of M numel" is torch's own warning, and the per-rank gradient
    shard is the FlatParameter shard torch builds."""
    from fsdp_lint.rules._flat_params import _LORA

    bad = rule_by_code("FSD202").INVALID[0]           # _LORA + ModuleWrapPolicy({Block}), use_orig_params=True
    path = _write(tmp_path, bad.source)
    (finding,) = _findings(path, "FSD202")

    ns = {"__name__": "example"}
    exec(compile(_LORA, "lora.py", "exec"), ns)       # the example's model, frozen and with adapters
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    said, units = _frozen_warnings(lambda: ns["model"], auto_wrap_policy=ModuleWrapPolicy({ns["Block"]}),
                                   use_orig_params=True)
    assert set(said) == set(finding.details["units"]) == {"layers.0", "layers.1"}
    n, m = said["layers.0"]
    assert (finding.details["grad_numel"], finding.details["trainable_numel"]) == (n, m)
    assert f"{n:,} numel instead of {m:,} numel before sharding" in finding.text
    shard = {u["module"]: u["shard_numel"] for u in units}["layers.0"]
    assert f"holds a {shard:,}-element gradient shard" in finding.text
    # torch accepts the plan: this is a warning, not a crash
    assert _run_fsdp1(path)[0] is None


# --------------------------------------------------------------------------------------------
# realistic fixtures
# --------------------------------------------------------------------------------------------
def test_fixture_lora_mixed_fsd201(tmp_path):
    path = BAD / "fsdp1_lora_mixed.py"
    (finding,) = _findings(path, "FSD201")
    assert finding.line == _line_of(path, "model = FSDP(")
    assert f"frozen at line {_line_of(path, 'model.requires_grad_(False)')}" in finding.text
    assert finding.details["units"] == ["layers.0", "layers.1", "layers.2"]
    assert "lora_A" in finding.text and "lora_B" in finding.text
    assert "use_orig_params=True" in finding.fix
    exc, line = _run_fsdp1(path)
    assert isinstance(exc, ValueError)
    _assert_quotes_torch(finding, exc)
    assert line == finding.line
    # the grouping the finding suggests, in place of the file's policy, is accepted by torch
    policy = finding.details["policy"]
    text = path.read_text()
    old = "auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={TransformerLayer}),"
    assert old in text
    fixed = _write(tmp_path, "from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy\n"
                   + text.replace(old, f"auto_wrap_policy={policy},"), "fsdp1_lora_fixed.py")
    assert _run_fsdp1(fixed)[0] is None
    assert not _findings(fixed, "FSD201")


def test_fixture_mixed_dtype_fsd203(tmp_path):
    path = BAD / "fsdp1_mixed_dtype.py"
    (finding,) = _findings(path, "FSD203")
    assert finding.line == _line_of(path, "model = FSDP(")
    assert f"cast to bfloat16 at line {_line_of(path, 'block.attn.to(torch.bfloat16)')}" in finding.text
    assert finding.details["units"] == ["layers.0", "layers.1", "layers.2"]
    exc, line = _run_fsdp1(path)
    assert isinstance(exc, ValueError)
    _assert_quotes_torch(finding, exc)
    assert line == finding.line
    policy = finding.details["policy"]
    text = path.read_text()
    assert "auto_wrap_policy=policy" in text
    fixed = _write(tmp_path, "from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy\n"
                   + text.replace("auto_wrap_policy=policy", f"auto_wrap_policy={policy}"), "fsdp1_dtype_fixed.py")
    assert _run_fsdp1(fixed)[0] is None
    assert not _findings(fixed, "FSD203")


def test_fixture_root_first_fsd302():
    path = BAD / "fsdp2_root_first.py"
    (finding,) = _findings(path, "FSD302")
    assert finding.line == _line_of(path, "fully_shard(block")
    assert finding.details["modules"] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert finding.details["related"] == ""
    assert finding.details["related_line"] == _line_of(path, "fully_shard(model")
    assert f"line {finding.details['related_line']}" in finding.text
    exc, line = _run_fsdp1(path)        # replay(real=True): real fully_shard on meta with a CPU mesh
    assert isinstance(exc, TypeError)
    _assert_quotes_torch(finding, exc)
    assert line == finding.line


def test_fixture_lora_orig_params_fsd202():
    """The correct use_orig_params=True LoRA plan: torch accepts it; FSD202 warns with torch's numbers."""
    path = IDIOMS / "fsdp1_lora_orig_params.py"
    findings = lint_file(str(path), Settings(world_size=WS)).findings
    mine = [f for f in findings if f.code in ("FSD201", "FSD202", "FSD203", "FSD204", "FSD302")]
    assert [f.code for f in mine] == ["FSD202"]
    (finding,) = mine
    assert finding.severity == "info" and "of the usable memory of the device" in finding.text   # a tiny LoRA: < 5 % of an H100
    assert finding.line == _line_of(path, "model = FSDP(")
    assert f"frozen at line {_line_of(path, 'p.requires_grad = False')}" in finding.text
    assert finding.details["units"] == ["decoder_layers.0", "decoder_layers.1"]
    # adapters live on the same module as the frozen weight: no grouping, and the fix says so
    assert finding.details["policy"] is None and "LoRALinear" in finding.fix
    assert _run_fsdp1(path)[0] is None

    mod = _load_module(path)

    def build():
        model = mod.CausalLM()
        for n, p in model.named_parameters():      # the fixture's own freezing loop
            if "lora_" not in n:
                p.requires_grad = False
        return model

    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    # same units with a policy object, so that torch states its numbers
    said, _ = _frozen_warnings(build, auto_wrap_policy=ModuleWrapPolicy({mod.DecoderLayer}), use_orig_params=True)
    assert set(said) == {"decoder_layers.0", "decoder_layers.1"}
    n, m = said["decoder_layers.0"]
    assert f"{n:,} numel instead of {m:,} numel before sharding" in finding.text
    # the fixture's own policy and mixed precision: the gradient shard each rank holds
    import functools

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    units = fsdp1_units(build, world_size=WS, use_orig_params=True,
                        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                           transformer_layer_cls={mod.DecoderLayer}),
                        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    shard = {u["module"]: u["shard_numel"] for u in units}["decoder_layers.0"]
    assert f"holds a {shard:,}-element gradient shard" in finding.text


def test_fixture_fsdp2_frozen_is_clean():
    """FSDP2 keeps requires_grad per parameter: a partly frozen model is fine."""
    path = IDIOMS / "fsdp2_frozen.py"
    findings = lint_file(str(path), Settings(world_size=WS)).findings
    assert not [f for f in findings if f.code in ("FSD201", "FSD202", "FSD203", "FSD204", "FSD302")]


def test_wrap_option_plan_points_at_the_freezing_statement():
    """`--wrap` plans have no wrap call in the file: the finding points at what froze the params."""
    path = BAD / "fsdp1_lora_mixed.py"
    res = lint_file(str(path), Settings(world_size=WS, wrap=["TransformerLayer"]))
    (finding,) = [f for f in res.findings if f.code == "FSD201"]
    assert Path(finding.path).resolve() == path.resolve()
    assert finding.line == _line_of(path, "model.requires_grad_(False)")
    assert "--wrap" in finding.text
