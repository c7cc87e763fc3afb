#!/usr/bin/env bash
# Held-out acceptance (CPU, 2 cores): the 16 MT-bench prompts of the held-out split (never trained on),
# TP 1, greedy, k = 4, 64 new tokens (docs/eagle3.md's table). eagle3_gpu_trained: the head
# infra/gpu-eagle3.sh trained on the H200 (results/2026-12-02/eagle3-train-and-chain-h200: step 700, 184 train-split
# responses of <= 384 tokens), HEAD=its folder. (Run on 2026-12-02 from a file of the held-out split;
# `--split heldout --num-prompts 16` selects the same 16 question ids in the same order.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-heldout-cpu
H="decode --model smollm2-135m --tp 1 --split heldout --num-prompts 16 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $H --drafter ngram > $R/ngram.json
.venv/bin/spectune $H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0 > $R/eagle3_shipped.json
.venv/bin/spectune $H --drafter eagle3 --draft-model "${HEAD:?the GPU-trained head}" --draft-placement rank0 > $R/eagle3_gpu_trained.json
# eagle3_cpu_prompt_labels: a head trained here with prompt labels and validation (training_cpu_prompt_labels.json;
# 1179 s of training on 2 cores after 412 s of generation), scored the same way:
.venv/bin/spectune train-drafter --model smollm2-135m --split train --max-new-tokens 64 --gen-batch 60 --max-steps 300 \
    --batch 4 --ttt-steps 4 --lr 1e-3 --draft-vocab 4096 --save-every 25 --threads 2 --out /tmp/head-pl
.venv/bin/spectune $H --drafter eagle3 --draft-model /tmp/head-pl --draft-placement rank0 > $R/eagle3_cpu_prompt_labels.json
