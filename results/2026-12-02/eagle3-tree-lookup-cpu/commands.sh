#!/usr/bin/env bash
# This machine (2 cores, CPU): lookup as branches of the tree (drafter.lookup 3 with tree_width 3: the
# continuations of the two longest n-gram matches, 3 tokens down to 1, join the head's tree) with the shipped
# head (rank0, TP 1, k = 4) on the first 2 held-out prompts of each category (20), 64 tokens, with its plain
# baseline (outputs identical). Same prompts as ../eagle3-tree-cpu/ (tree 3 alone, and lookup 2 + tree 3 when
# a lookup hit replaced the tree) and ../eagle3-lookup-cpu/ngram.json (n-gram k = 4).
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-tree-lookup-cpu
export RAY_AUTH_MODE=disabled
B="decode --model smollm2-135m --tp 1 --split heldout --per-category 2 --max-new-tokens 64 -k 4 --json --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0"
.venv/bin/spectune $B --tree-width 3 --draft-lookup 3 > $R/l3_t3.json
# the same with a tree of width 4 (no baseline; outputs identical at width 3 above)
.venv/bin/spectune $B --tree-width 4 --draft-lookup 3 --no-baseline > $R/l3_t4.json
