"""The pictures and the granularity table: `--layout diagram`, `--format html`, `--compare-granularity`."""
from __future__ import annotations

import json
import os
import re

from conftest import REPO

ARTICLE1 = os.path.join("fixtures", "article_fsdp1.py")
ARTICLE2 = os.path.join("fixtures", "article_fsdp2.py")


def test_diagram_fsdp1_flat_parameter_split_by_rank(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    res = cli(ARTICLE1, "--world-size", "4", "--layout", "diagram")
    assert res.code == 0, res.err
    text = res.out.split("layers.0 (TransformerBlock): FlatParameter", 1)[1]
    lines = text.splitlines()
    assert "3,152,384 elements" in lines[0] and "4 ranks x 788,096" in lines[0]
    params, ranks = lines[1], lines[2]
    assert all(f"rank {r}" in ranks for r in range(4))
    assert "in_proj_weight" in params and "ffn.0.weight" in params
    assert max(len(line) for line in (params, ranks)) <= 90          # scaled to the terminal
    # rank boundaries at the shard boundaries: 788,096 / 3,152,384 of the bar each
    bars = [i for i, ch in enumerate(ranks) if ch == "│"]
    assert len(bars) == 5 and all(abs((b - bars[0]) - k * (bars[-1] - bars[0]) / 4) <= 1 for k, b in enumerate(bars))
    assert "layers.1 ... layers.11 (11 units): same layout as layers.0" in res.out


def test_diagram_fsdp2_rows_split_by_rank(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    res = cli(ARTICLE2, "--world-size", "3", "--layout", "diagram")
    row = next(line for line in res.out.splitlines() if line.strip().startswith("ffn.0.weight [2048, 512]"))
    # torch.chunk: ceil(2048 / 3) = 683 rows on ranks 0 and 1, 682 on rank 2
    assert re.findall(r"r(\d) (\d+)", row) == [("0", "683"), ("1", "683"), ("2", "682")]
    assert max(len(line) for line in res.out.splitlines() if "│" in line) <= 120


def test_html_report_is_one_self_contained_page(cli, tmp_path):
    out = tmp_path / "report.html"
    res = cli(ARTICLE2, "--world-size", "4", "--compare-granularity", "--format", "html", "-o", str(out))
    assert res.code == 0, res.err
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert page.count("<svg") >= 4                      # layout, memory bar, granularity charts
    for heading in ("Plan", "Layout", "Memory per rank", "Granularity"):
        assert f"<h3>{heading}" in page
    assert "layers.0 (TransformerBlock)" in page and "per TransformerBlock" in page


def test_granularity_rows_are_the_plans_they_name(cli):
    """Each row is the layout of the plan it names: per block and per Linear have the units and
    collectives of the plans `--wrap TransformerBlock` and `--wrap Linear` build (the rows keep
    the file's mixed precision, a `--wrap` plan does not); the file's plan is the file's."""
    def doc(*args):
        res = cli(ARTICLE2, "--world-size", "4", "--format", "json", *args)
        assert res.code in (0, 1), res.err
        return json.loads(res.out)["files"][0]

    rows = {r["plan"]: r for r in doc("--compare-granularity")["granularity"]}
    assert list(rows) == ["whole model", "per TransformerBlock", "per Linear", "this file's plan"]
    whole = rows["whole model"]
    assert (whole["units"], whole["all_gathers_per_step"]) == (1, 1)
    assert whole["verdict"].startswith("nothing sharded")
    # MultiheadAttention reads out_proj's weight itself: a unit of its own for out_proj would hold
    # it sharded there (`--wrap Linear` is reported by FSD402), so the per-Linear row leaves it out
    every_linear = doc("--wrap", "Linear")
    assert {f["module"] for f in every_linear["findings"] if f["code"] == "FSD402"} == \
        {f"layers.{i}.self_attn.out_proj" for i in range(12)}
    for name, wrap in (("per TransformerBlock", ["TransformerBlock"]),
                       ("per Linear", ["layers.*.ffn.0", "layers.*.ffn.2"])):
        plan = doc(*[a for w in wrap for a in ("--wrap", w)])
        row = rows[name]
        assert row["units"] == len(plan["plan"]["units"])
        assert row["all_gathers_per_step"] == plan["plan"]["all_gathers_per_step"]
    own = doc()
    assert rows["this file's plan"]["per_rank_bytes"] == own["memory"]["per_rank_bytes"]
    assert rows["this file's plan"]["all_gathers_per_step"] == own["plan"]["all_gathers_per_step"]
    assert rows["per Linear"]["all_gathers_per_step"] > rows["per TransformerBlock"]["all_gathers_per_step"]
    assert rows["this file's plan"]["verdict"] == "same as per TransformerBlock (best of these)"


def test_simulate_of_a_file_that_cannot_run_is_one_line_exit_2(cli):
    path = os.path.join("fixtures", "run", "fsdp2_custom_first_layer.py")
    res = cli(path, "--simulate", "--run-timeout", "60")
    assert res.code == 2
    errors = [line for line in res.err.splitlines() if line.startswith("fsdp-lint: error: --simulate:")]
    assert len(errors) == 1 and "input" in errors[0]
