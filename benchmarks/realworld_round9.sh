#!/bin/bash
# Round 9 out of the box (benchmarks/realworld.md, "Round 9"): the documented commands, empty hub cache.
# FSDP_LINT: the fsdp-lint command to measure (default: fsdp-lint); REPOS: the checkouts
L=${FSDP_LINT:-fsdp-lint}
export HF_HOME=/tmp/emptyhf
T="timeout 300"
R=${REPOS:?set REPOS (a folder with the repositories at the commits of benchmarks/realworld.md)}
run() { echo "=== $1"; shift; ( "$@" ) 2>&1 | grep -E "^fsdp-lint: error|params|^  note" | head -3 | cut -c1-400; }
run "#79 EasyR1" bash -c "cd $R/EasyR1 && $T $L examples/qwen2_5_vl_7b_geo3k_grpo.sh --no-cache"
run "#80 TinyZero" bash -c "cd $R/TinyZero && N_GPUS=2 BASE_MODEL=Qwen/Qwen2.5-3B DATA_DIR=/tmp/tz_data ROLLOUT_TP_SIZE=2 EXPERIMENT_NAME=countdown-qwen2.5-3b VLLM_ATTENTION_BACKEND=XFORMERS $T $L scripts/train_tiny_zero.sh --no-cache"
run "#81 LLaMA2-Accessory finetune" bash -c "cd $R/LLaMA2-Accessory/accessory && $T $L exps/finetune/sg/alpaca.sh --no-cache -- /path/to/pretrained /path/to/params.json /path/to/tokenizer.model"
run "#82 LLaMA2-Accessory Large-DiT" bash -c "cd $R/LLaMA2-Accessory/Large-DiT-ImageNet && $T $L exps/dit_llama_7B_bs512_lr1e-4_bf16_qknorm.sh --no-cache"
