#!/usr/bin/env bash
# Held-out acceptance (CPU, 2 cores): the 16 MT-bench prompts of the held-out split (never trained on),
# TP 1, greedy, k = 4, 64 new tokens (docs/eagle3.md's table). eagle3_gpu_trained: the head
# infra/gpu-eagle3.sh trained on the H200 (results/2026-12-02/h200-eagle3: step 700, 184 train-split
# responses of <= 384 tokens), HEAD=its folder. (Run on 2026-12-02 from a file of the held-out split;
# `--split heldout --num-prompts 16` selects the same 16 question ids in the same order.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-heldout-cpu
H="decode --model smollm2-135m --tp 1 --split heldout --num-prompts 16 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $H --drafter ngram > $R/ngram.json
.venv/bin/spectune $H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0 > $R/eagle3_shipped.json
.venv/bin/spectune $H --drafter eagle3 --draft-model "${HEAD:?the GPU-trained head}" --draft-placement rank0 > $R/eagle3_gpu_trained.json
