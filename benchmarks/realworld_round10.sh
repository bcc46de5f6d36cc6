#!/bin/bash
# Round 10 out of the box (benchmarks/realworld.md, "Round 10"): the documented commands, empty hub cache.
# FSDP_LINT: the fsdp-lint command to measure (default: fsdp-lint); REPOS: the checkouts (folders named
# as below, at the commits of realworld.md); a command given as a file (fairseq2, perception_models, SimpleTuner)
# is the documented line written into that file beside the checkout
L=${FSDP_LINT:-fsdp-lint}
export HF_HOME=/tmp/emptyhf
T="timeout 300"
R=${REPOS:?set REPOS (a folder with the repositories at the commits of benchmarks/realworld.md)}
run() { echo "=== $1"; shift; ( "$@" ) 2>&1 | grep -E "^fsdp-lint: error|params|^  note" | head -3 | cut -c1-400; }
run "#83 OLMo" bash -c "cd $R/OLMo && $T $L scripts/train.py --no-cache -n 8 -- configs/official-1124/OLMo2-7B-stage1.yaml"
run "#84 blt" bash -c "cd $R/blt && $T $L bytelatent/train.py --no-cache -n 8 -- config=bytelatent/configs/debug.yaml"
run "#85 fairseq2" bash -c "cd $R/fairseq2 && $T $L ../fairseq2_sft.sh --no-cache"
run "#86 FastVideo" bash -c "cd $R/FastVideo && $T $L examples/training/finetune/wan_t2v_1.3B/crush_smol/finetune_t2v.sh --no-cache"
run "#87 SimpleTuner (CLI)" bash -c "cd $R/SimpleTuner && $T $L fsdp2_cli.sh --no-cache"
run "#88 perception_models" bash -c "cd $R/perception_models && $T $L plm_3b.sh --no-cache"
run "#89 open-instruct" bash -c "cd $R/open-instruct && $T $L scripts/train/debug/dpo/local.sh --no-cache"
run "#90 Lightning fp8" bash -c "cd $R/pytorch-lightning/examples/fabric/fp8_distributed_transformer && $T $L train.py --no-cache"
