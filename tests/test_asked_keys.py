"""Keys a script reads from the rows of a stood-in data set -- after the rows left the library, through
pandas and plain dicts -- are learnt from a first attempt, and the replay runs again with stand-ins that
have them (`fsdp_lint.replay.asked_keys`; issue 15, "stand-ins lacking the keys a script asserts").

Fixture (fixtures/repos/instruct_sft, in the idiom of instruction-tuning repositories): a hub data set
read into a DataFrame, ``to_dict(orient="records")``, an ``assert "instruction" in example and "input" in
example``, a prompt template's ``{instruction}``/``{input}`` fields and ``example[output_key]``.
Oracles: real FSDP1 under the fake process group for the plan; the ``datasets`` library for the rows."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REPO  # noqa: E402
from test_idioms import assert_plan_matches_torch  # noqa: E402

pytest.importorskip("datasets")
pytest.importorskip("pandas")

SFT = os.path.join(REPO, "fixtures", "repos", "instruct_sft")
TRAIN = os.path.join(SFT, "examples", "supervised.py")
ARGV = ["--model_path", "../../frameworks/configs/tiny-llama-local"]


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(SFT)
    monkeypatch.syspath_prepend(os.path.join(SFT, "src"))
    yield
    for name in [n for n in sys.modules if n == "instruct_sft" or n.startswith("instruct_sft.")]:
        sys.modules.pop(name, None)


def test_the_keys_a_script_asserts_on_rows_are_columns_of_the_stand_in(in_repo):
    from fsdp_lint.replay import data_standins

    res, _ = assert_plan_matches_torch(TRAIN, 8, argv=ARGV)
    # only the hub load itself is noted (offline); before, the assertion, the KeyError of `output` and
    # what followed from them were skipped too
    assert [s.exc_type for s in res.skipped_statements] == ["ConnectionError"], \
        [str(s) for s in res.skipped_statements]
    assert sorted(data_standins.ASKED) == ["input", "instruction", "output"]   # read from the code, no more


def test_the_rows_then_have_what_the_code_reads(in_repo):
    """The learnt keys are columns of every stand-in made after them: the library's own rows, DataFrame
    and record dicts carry them; a stand-in with ``features`` keeps exactly its features."""
    import datasets
    import pandas as pd

    from fsdp_lint.replay import asked_keys, data_standins
    from fsdp_lint.replay.data_standins import standin_for

    asked_keys.forget()
    raw = standin_for(datasets.load_dataset, ("acme/instructions", "sft"), {})
    records = pd.DataFrame(raw["sft"]).to_dict(orient="records")
    from instruct_sft.data_preprocessor import format_prompt, read_prompt_dict

    with pytest.raises(AssertionError) as first:
        format_prompt(records[0], read_prompt_dict("instruction_input"))
    assert asked_keys.learn([first.value])
    assert not asked_keys.learn([first.value])          # nothing new: no further round
    raw = standin_for(datasets.load_dataset, ("acme/instructions", "sft"), {})
    row = pd.DataFrame(raw["sft"]).to_dict(orient="records")[0]
    assert {"instruction", "input"} <= set(row)
    assert format_prompt(row, read_prompt_dict("instruction_input")).startswith("Below is an instruction")
    features = datasets.Features({"prompt": datasets.Value("string")})
    assert standin_for(datasets.load_dataset, ("x",), {"split": "train", "features": features}).column_names == \
        ["prompt"]
    asked_keys.forget()
    assert not data_standins.ASKED
