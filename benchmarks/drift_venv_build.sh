#!/bin/bash
# venv-drift: the survey venv again, for the "library drift" entries of realworld.md. Its base is the
# survey venv's packages (SURVEY_VENV, with the repositories' own requirements installed) with torch
# the on-disk 2.13.0 CPU wheel (never a CUDA torch); the HF libraries each repository pins come as
# overlays (drift_venv_overlays.sh), put first on PYTHONPATH per entry.
set -ex
SURVEY_VENV=${SURVEY_VENV:?the survey venv}; DRIFT=${DRIFT:-/work/venv-drift}; WORKTREE=${WORKTREE:-$PWD}
WHEEL=${WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}
python3 -m venv "$DRIFT"
"$SURVEY_VENV/bin/pip" freeze | grep -v -E "^(torch==|fsdp.lint|-e )" > "$DRIFT/survey-packages.txt"
"$DRIFT/bin/pip" install -q "$WHEEL"
"$DRIFT/bin/pip" install -q --no-deps -r "$DRIFT/survey-packages.txt"
"$DRIFT/bin/pip" install -q --no-deps -e "$WORKTREE"
