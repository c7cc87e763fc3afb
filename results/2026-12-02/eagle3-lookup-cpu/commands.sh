#!/usr/bin/env bash
# This machine (2 cores, CPU), session 13: drafter.lookup N in {0, 1, 2, 3, 4} with the shipped head
# (rank0, TP 1) and n-gram alone on the first 2 held-out prompts of each category (20), 64 tokens, k = 4;
# then the issue's check case (TP 2, head as its own process, the first 8 held-out prompts) with N = 2.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-lookup-cpu
export RAY_AUTH_MODE=disabled
B="decode --model smollm2-135m --tp 1 --split heldout --per-category 2 --max-new-tokens 64 -k 4 --no-baseline --json"
.venv/bin/spectune $B --drafter ngram > $R/ngram.json
for L in 0 1 2 3 4; do
  .venv/bin/spectune $B --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0 --draft-lookup $L > $R/l$L.json
done
C="decode --model smollm2-135m --tp 2 --split heldout --num-prompts 8 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $C --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-lookup 2 > $R/tp2_l2.json
