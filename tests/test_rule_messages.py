"""The one-line message of the mesh rules (FSD7xx) and the memory rule (FSD801) stays within the concise
limit when the names in it come from the linted code and are long: every INVALID example of those
rules is linted again with long module, class and mesh-dimension names (and a mesh of many named
dimensions), and each finding's message is at most MESSAGE_LIMIT characters on one line, with the names
the message leaves out carried by its detail."""
from __future__ import annotations

import re

import pytest

from fsdp_lint.check.rule import MESSAGE_LIMIT, all_rules
from fsdp_lint.config import Settings
from fsdp_lint.engine import lint_file
from fsdp_lint.rules._mesh_examples import MODEL

RULES = [r for r in all_rules() if r.code.startswith("FSD7") or r.code == "FSD801"]

# identifiers of the examples' models and meshes -> what real code may call them
LONG_WORDS = {w: f"{w}_of_the_pretraining_run_with_a_name_from_the_config_file" for w in
              ("layers", "head", "up", "down", "blocks", "fc", "proj", "embed", "norm")}
LONG_CLASSES = {w: f"{w}WithAVeryLongClassNameFromAModelingFileOfTheResearchGroup" for w in ("Block", "MLP", "Net")}
LONG_DIM = "data_parallel_dimension_named_in_the_training_config_{}"


def _long_names(source: str) -> str:
    for short, long in {**LONG_WORDS, **LONG_CLASSES}.items():
        # `self.layers`, `model.layers`, and the keys of a TP plan (`{"up": ColwiseParallel()}`)
        source = re.sub(rf"(?<!\w){short}\b", long, source)
    return re.sub(r"(?<=[\"'])(dp|tp|dp_shard|dp_replicate|data_parallel|tensor_parallel|replicate|shard|ep|cp)"
                  r"(?=[\"'])", lambda m: LONG_DIM.format(m.group(1)), source)


def _cases():
    for rule in RULES:
        for i, ex in enumerate(rule.INVALID):
            yield pytest.param(rule, ex, id=f"{rule.code}-invalid-{i}")


def _check(findings, code):
    hits = [f for f in findings if f.code == code]
    assert hits, f"{code} did not fire with long names: {[(f.code, f.message) for f in findings]}"
    for f in hits:
        assert len(f.message) <= MESSAGE_LIMIT and "\n" not in f.message, (len(f.message), f.message)
        assert f.detail and "\n" not in f.detail
    return hits


@pytest.mark.parametrize("rule,ex", list(_cases()))
def test_messages_with_long_names_fit_one_concise_line(tmp_path, rule, ex):
    path = tmp_path / "train_with_long_names.py"
    source = _long_names(ex.source)
    assert source != ex.source
    path.write_text(source)
    settings = Settings(world_size=ex.world_size).with_overrides(**ex.options)
    _check(lint_file(str(path), settings).findings, rule.code)


MANY_DIMS = MODEL + '''
names = tuple("{}".format(d) for d in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
world = init_device_mesh("cuda", (2, 2, 2, 2, 2), mesh_dim_names=names)
model = Net()
for block in model.layers:
    fully_shard(block, mesh=world["dp_shard"])
fully_shard(model, mesh=world["dp_shard"])
'''


def test_fsd703_with_a_mesh_of_many_long_named_dimensions(tmp_path):
    """A 5-D mesh named from the config, launched on another world size: the message gives the sizes, the
    detail names every dimension of the mesh."""
    path = tmp_path / "train.py"
    path.write_text(MANY_DIMS.replace('"{}".format(d)', f'"{LONG_DIM}".format(d)').replace(
        'world["dp_shard"]', f'world["{LONG_DIM.format("dp_shard")}"]'))
    settings = Settings(world_size=64).with_overrides(world_size_source="--world-size")
    (f,) = _check(lint_file(str(path), settings).findings, "FSD703")
    assert "of 32 ranks, launched on 64" in f.message
    for d in ("pp", "dp_replicate", "dp_shard", "cp", "tp"):
        assert f"{LONG_DIM.format(d)} 2" in f.detail, f.detail


def test_fsd705_names_a_long_shard_dimension_in_its_detail(tmp_path):
    path = tmp_path / "train.py"
    shard = "tensor_parallel_dimension_that_the_config_file_calls_by_its_long_name"
    path.write_text(MODEL + f'''
mesh = init_device_mesh("cuda", (4, 1), mesh_dim_names=("data_parallel", "{shard}"))
model = Net()
for block in model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
''')
    for f in _check(lint_file(str(path), Settings(world_size=4)).findings, "FSD705"):
        assert shard not in f.message and f"`{shard}`" in f.detail
