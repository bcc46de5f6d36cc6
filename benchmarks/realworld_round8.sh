#!/bin/bash
# Round 8 out of the box: each documented command as is, empty hub cache, no extra packages.
# FSDP_LINT: the fsdp-lint command to measure (default: fsdp-lint); REPOS: the checkouts (benchmarks/realworld.md, "Round 8"); /tmp/dinov3_vitl.sh: the README line of #73 with OUT and DS filled in
L=${FSDP_LINT:-fsdp-lint}
export HF_HOME=/tmp/emptyhf
T="timeout 300"
run() { echo "=== $1"; shift; ( "$@" ) 2>&1 | grep -E "^fsdp-lint: error|params|^  note" | head -4 | cut -c1-400; }
R=${REPOS:?set REPOS (a folder with the repositories at the commits of benchmarks/realworld.md)}
run "#68 open_flamingo" bash -c "cd $R/open_flamingo && $T $L open_flamingo/train/train.py --world-size 4 --no-cache -- --lm_path anas-awadalla/mpt-1b-redpajama-200b --tokenizer_path anas-awadalla/mpt-1b-redpajama-200b --cross_attn_every_n_layers 1 --dataset_resampled --batch_size_mmc4 32 --batch_size_laion 64 --train_num_samples_mmc4 125000 --train_num_samples_laion 250000 --loss_multiplier_laion 0.2 --workers=4 --run_name OpenFlamingo-3B-vitl-mpt1b --num_epochs 480 --warmup_steps 1875 --mmc4_textsim_threshold 0.24 --laion_shards '/path/to/shards/shard-{0000..0999}.tar' --mmc4_shards '/path/to/shards/shard-{0000..0999}.tar' --report_to_wandb --fsdp --fsdp_use_orig_params"
run "#69 OpenDiLoCo baseline" bash -c "cd $R/OpenDiLoCo/open_diloco && $T $L train_fsdp.py --world-size 8 --no-cache -- --sharding-strategy _HYBRID_SHARD_ZERO2 --per-device-train-batch-size 16 --total-batch-size 8192 --precision bf16-mixed --total-steps 88_000 --project OpenDiLoCo --lr 4e-4 --path_model PrimeIntellect/llama-1b-fresh --ckpt.path 1b_ckpt --ckpt.interval 500"
run "#70 OpenDiLoCo diloco" bash -c "cd $R/OpenDiLoCo/open_diloco && $T $L train_fsdp.py --world-size 8 --no-cache -- --per-device-train-batch-size 16 --total-batch-size 2048 --precision bf16-mixed --total-steps 88_000 --hv.local_steps 500 --project OpenDiLoCo --lr 4e-4 --path_model PrimeIntellect/llama-1b-fresh --warmup-steps 1000 --hv.averaging_timeout 1800 --hv.skip_load_from_peers --hv.local_steps 500 --hv.initial-peers /ip4/1.2.3.4 --hv.galaxy-size 4 --hv.world-rank 0 --checkpoint_interval 500 --ckpt.path 1b_diloco_ckpt"
run "#71 molmo captioner" bash -c "cd $R/molmo && $T $L launch_scripts/train_captioner.py --world-size 8 --no-cache -- qwen2_7b --wandb=null --save_folder=/path/to/save/folder"
run "#72 molmo multitask" bash -c "cd $R/molmo && $T $L launch_scripts/train_multitask_model.py --world-size 8 --no-cache -- 3.2-synthetic /path/to/checkpoint --wandb.name=run_name --wandb.entity=entity --wandb.project=project --save_folder=/path/to/save/folder"
run "#73 dinov3 submit" bash -c "cd $R/dinov3 && mkdir -p /tmp/imnet && PYTHONPATH=$R/dinov3:\$PYTHONPATH $T $L /tmp/dinov3_vitl.sh --no-cache"
run "#74 openvla" bash -c "cd $R/openvla && $T $L vla-scripts/train.py --world-size 8 --no-cache -- --vla.type prism-dinosiglip-224px+mx-bridge --data_root_dir /data/oxe --run_root_dir /data/runs --wandb_project proj --wandb_entity ent"
run "#75 Wan2.1" bash -c "cd $R/Wan2.1 && $T $L generate.py --world-size 8 --no-cache -- --task t2v-14B --size '1280*720' --ckpt_dir ./Wan2.1-T2V-14B-absent --dit_fsdp --t5_fsdp --ulysses_size 8 --prompt cats"
run "#76 LLM-Shearing" bash -c "cd $R/LLM-Shearing && $T $L llmshearing/scripts/test_pruning.sh --no-cache"
run "#77 llm-foundry" bash -c "cd $R/llm-foundry/scripts/train && printf 'composer train.py yamls/pretrain/mpt-125m.yaml train_loader.dataset.split=train_small eval_loader.dataset.split=val_small\n' > /tmp/foundry_readme.sh && $T $L /tmp/foundry_readme.sh --no-cache"
run "#78 SkyRL" bash -c "cd $R/SkyRL && PYENV_VERSION=3.11.7 $T $L examples/train/gsm8k/run_gsm8k.sh --no-cache"
