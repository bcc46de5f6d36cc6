#!/usr/bin/env bash
# Plans across torch versions (issue 18): for each version, a venv with only torch, click, tabulate,
# libcst, pytest and fsdp-lint (--no-deps, no numpy); then the layout-vs-torch and multidim tests (real
# FSDP1/FSDP2 under the fake process group are the oracle) and `--simulate` on the article's FSDP2 and
# FSDP1 scripts; a table at the end (README "torch versions").
#
#   benchmarks/torch_versions.sh                 # 2.6.0 2.7.1 2.8.0 2.9.1 2.11.0 2.12.1 2.14.1 and the newest allowed
#   benchmarks/torch_versions.sh 2.6.0 2.13.0    # the versions given
#   WORK=/path/to/venvs benchmarks/torch_versions.sh   # keep the venvs: a venv holding that torch is reused
#
# pip installs what the index has: PyPI's linux wheels of most versions are the CUDA builds, which
# pull several GB of nvidia-* packages (they run on CPU as the CPU builds do; give ~6 GB a version).
# CPU_ONLY=1 skips a version whose only build here is a CUDA one; TORCH_INDEX adds an index (e.g.
# PyTorch's CPU wheels) where it can be reached. "The newest allowed" is the newest torch pip may
# install here (a pip constraint can cap it).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${WORK:-$(mktemp -d -t fsdp-lint-torch-XXXX)}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
INDEX=()
if [ -n "${TORCH_INDEX:-}" ]; then
  if $PY -m pip --isolated index versions torch --index-url "$TORCH_INDEX" --retries 0 --timeout 15 >/dev/null 2>&1; then
    INDEX=(--extra-index-url "$TORCH_INDEX")
  else
    echo "(the index $TORCH_INDEX cannot be reached: the default index only)" >&2
  fi
fi
if [ $# -gt 0 ]; then
  VERSIONS=("$@")
else
  # the newest torch pip would install here (after any constraint), from a dry run
  NEWEST=$($PY -m pip install --dry-run --ignore-installed --no-deps -q --report - "${INDEX[@]}" torch 2>/dev/null |
           $PY -c 'import json,sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"].split("+")[0])' 2>/dev/null)
  VERSIONS=(2.6.0 2.7.1 2.8.0 2.9.1 2.11.0 2.12.1 2.14.1)
  case " ${VERSIONS[*]} " in *" $NEWEST "*) ;; *) [ -n "$NEWEST" ] && VERSIONS+=("$NEWEST");; esac
fi
ROWS=()
for v in "${VERSIONS[@]}"; do
  venv="$WORK/torch-$v"
  log="$WORK/install-$v.log"
  echo "== torch $v ($venv)" >&2
  have=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
  if [ "$have" != "$v" ]; then
    $PY -m venv "$venv" >"$log" 2>&1
    if [ "${CPU_ONLY:-0}" = 1 ]; then
      "$venv/bin/pip" install --dry-run -q --report "$WORK/plan-$v.json" "${INDEX[@]}" "torch==$v" >>"$log" 2>&1
      if grep -q '"name": "nvidia-' "$WORK/plan-$v.json" 2>/dev/null; then
        ROWS+=("$v|-|skipped (CPU_ONLY=1): only the CUDA build is available here|-|-|-")
        continue
      fi
    fi
    if ! "$venv/bin/pip" install -q --no-cache-dir "${INDEX[@]}" "torch==$v" >>"$log" 2>&1; then
      ROWS+=("$v|-|not installed: pip could not install torch==$v here (see $log)|-|-|-")
      continue
    fi
    "$venv/bin/pip" install -q click tabulate libcst pytest setuptools wheel >>"$log" 2>&1
  fi
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >>"$log" 2>&1
  build=$("$venv/bin/python" -W ignore -c 'import torch; print("CUDA " + torch.version.cuda if torch.version.cuda else "CPU")' 2>/dev/null)
  t0=$(date +%s)
  "$venv/bin/python" -m pytest -q -rfs -p no:cacheprovider tests/test_layout_vs_torch.py tests/test_multidim.py \
    >"$WORK/tests-$v.log" 2>&1          # the failures and skips with their reasons
  # the summary line (a warning torch prints at exit may come after it)
  tests=$(grep -E "^=*.* (passed|failed|error)" "$WORK/tests-$v.log" | tail -1 | tr -d "=" | sed "s/^ *//; s/ *$//")
  tests="$tests ($(( $(date +%s) - t0 )) s)"
  sims=()
  for api in fsdp2 fsdp1; do
    out=$("$venv/bin/fsdp-lint" "fixtures/article_$api.py" --world-size 4 --simulate --no-cache --format json 2>"$WORK/sim-$api-$v.err")
    sims+=("$(printf '%s' "$out" | "$venv/bin/python" -c '
import json, sys
try:
    f = json.load(sys.stdin)["files"][0]
except Exception:
    print("no result"); sys.exit()
s = (f.get("memory") or {}).get("simulated") or {}
if "error" in s:
    print("refused: " + s["error"][:110])
else:
    c = s["collectives"]
    print("peak %.1f MiB, %d+%d collectives" % (s["peak_bytes"] / 2**20, c["all_gathers_per_step"], c["reduce_scatters_per_step"]))')")
  done
  warned=$(cat "$WORK"/sim-*-"$v".err | grep -c "NumPy")
  numpy=$("$venv/bin/python" -c "import importlib.util; print('absent' if importlib.util.find_spec('numpy') is None else 'installed')")
  ROWS+=("$v|$build|$tests|${sims[0]}|${sims[1]}|numpy $numpy, $warned NumPy warnings")
  echo "row: ${ROWS[-1]}" >&2          # each version as it ends (a long run can be read while it goes)
done
printf '\n| torch | build | layout-vs-torch + multidim tests | --simulate article FSDP2 (4 ranks) | --simulate article FSDP1 (4 ranks) | numpy |\n|---|---|---|---|---|---|\n'
for row in "${ROWS[@]}"; do
  IFS='|' read -r a b c d e f <<<"$row"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d" "$e" "$f"
done
