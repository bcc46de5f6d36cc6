#!/usr/bin/env bash
# Plans across torch versions (issue 18): for each version, a fresh venv with only torch (the CPU build),
# click, tabulate, libcst, pytest and fsdp-lint (--no-deps); then the layout-vs-torch and multidim tests
# (real FSDP1/FSDP2 under the fake process group are the oracle) and `--simulate` on the article's model;
# a table at the end.
#
#   benchmarks/torch_versions.sh                 # 2.6.0 2.9.1 2.11.0 2.14.1 and the newest allowed
#   benchmarks/torch_versions.sh 2.6.0 2.13.0    # the versions given
#
# The CPU builds come from PyTorch's CPU index (TORCH_INDEX): PyPI's default linux wheels are the CUDA
# builds, which pull several GB of nvidia-* packages; a version whose CPU build the index does not have is
# reported as skipped, never replaced by a CUDA download. The suite needs no numpy (torch warns without it).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
WORK=${WORK:-$(mktemp -d -t fsdp-lint-torch-XXXX)}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
# the CPU index where it can be reached (an offline mirror of PyPI alone has the CUDA builds, mostly)
INDEX=()
if $PY -m pip --isolated index versions torch --index-url "$TORCH_INDEX" --retries 0 --timeout 15 >/dev/null 2>&1; then
  INDEX=(--extra-index-url "$TORCH_INDEX")
else
  echo "(the CPU index $TORCH_INDEX cannot be reached: PyPI's builds only)" >&2
fi
if [ $# -gt 0 ]; then
  VERSIONS=("$@")
else
  NEWEST=$($PY -m pip index versions torch "${INDEX[@]}" 2>/dev/null | sed -n 's/^torch (\([^)]*\)).*/\1/p' | sed 's/+cpu//')
  VERSIONS=(2.6.0 2.9.1 2.11.0 2.14.1 ${NEWEST:+$NEWEST})
fi
ROWS=()
for v in "${VERSIONS[@]}"; do
  venv="$WORK/torch-$v"
  echo "== torch $v ($venv)" >&2
  $PY -m venv "$venv" >"$WORK/install-$v.log" 2>&1
  # what pip would install: a CUDA build brings nvidia-* packages (several GB): skipped, said so
  "$venv/bin/pip" install --dry-run -q --report "$WORK/plan-$v.json" "${INDEX[@]}" "torch==$v" >>"$WORK/install-$v.log" 2>&1
  if [ ! -s "$WORK/plan-$v.json" ]; then
    ROWS+=("$v|skipped: pip cannot resolve torch==$v here (see $WORK/install-$v.log)|-|-")
    continue
  fi
  if grep -q '"name": "nvidia-' "$WORK/plan-$v.json"; then
    ROWS+=("$v|skipped: only the CUDA build (nvidia-* packages, several GB) is available here, no CPU build|-|-")
    continue
  fi
  if ! { "$venv/bin/pip" install -q "${INDEX[@]}" "torch==$v" &&
         "$venv/bin/pip" install -q click tabulate libcst pytest &&
         "$venv/bin/pip" install -q setuptools wheel &&
         "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT"; } >>"$WORK/install-$v.log" 2>&1; then
    ROWS+=("$v|skipped: no CPU build installed (see $WORK/install-$v.log)|-|-")
    continue
  fi
  tests=$("$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_layout_vs_torch.py tests/test_multidim.py 2>&1 | tail -1)
  sim=$(cd "$ROOT" && "$venv/bin/fsdp-lint" fixtures/article_fsdp2.py --world-size 4 --simulate 2>&1 | grep -m1 -o "peak[^·]*\|error:.*" | head -c 120)
  numpy=$("$venv/bin/python" -c "import importlib.util; print('absent' if importlib.util.find_spec('numpy') is None else 'present')")
  ROWS+=("$v|$tests|$sim|numpy $numpy")
done
printf '\n| torch | layout-vs-torch + multidim tests | --simulate (article, 4 ranks) | numpy |\n|---|---|---|---|\n'
for row in "${ROWS[@]}"; do
  IFS='|' read -r a b c d <<<"$row"
  printf '| %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d"
done
