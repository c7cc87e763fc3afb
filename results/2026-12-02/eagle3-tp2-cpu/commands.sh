#!/usr/bin/env bash
# Issue 15's check on CPU with the shipped head (trained on the H200): TP 2, held-out split (the first 8
# prompts: writing, roleplay, reasoning, math at 2 each), greedy, k = 4, 64 new tokens; n-gram on the same prompts.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-tp2-cpu
C="decode --model smollm2-135m --tp 2 --split heldout --num-prompts 8 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $C --drafter eagle3 --draft-model smollm2-135m-eagle3 > $R/eagle3.json
.venv/bin/spectune $C --drafter ngram > $R/ngram.json
