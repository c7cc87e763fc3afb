#!/usr/bin/env bash
# This machine (2 cores, CPU): drafter.tree_width W in {2, 3, 4} with the shipped head (rank0, TP 1, k = 4)
# on the first 2 held-out prompts of each category (20), 64 tokens (the chain, W = 0, and n-gram on the same
# prompts: ../eagle3-lookup-cpu/l0.json, ngram.json); W = 3 with its baseline (outputs identical); lookup 2
# with W = 3; then the issue's check case (TP 2, head as its own process, first 8 held-out) with W = 3.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-tree-cpu
export RAY_AUTH_MODE=disabled
B="decode --model smollm2-135m --tp 1 --split heldout --per-category 2 --max-new-tokens 64 -k 4 --json --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0"
.venv/bin/spectune $B --tree-width 3 > $R/t3.json
for W in 2 4; do
  .venv/bin/spectune $B --tree-width $W --no-baseline > $R/t$W.json
done
.venv/bin/spectune $B --tree-width 3 --draft-lookup 2 --no-baseline > $R/l2_t3.json
C="decode --model smollm2-135m --tp 2 --split heldout --num-prompts 8 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $C --drafter eagle3 --draft-model smollm2-135m-eagle3 --tree-width 3 > $R/tp2_t3.json
