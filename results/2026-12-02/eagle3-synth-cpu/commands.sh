#!/usr/bin/env bash
# This machine (2 cores, CPU), commit 5738565; HEAD: the H200-trained head of ../eagle3-train-synthetic-h200
# (now shipped as smollm2-135m-eagle3). The first 16 held-out prompts (MT-bench categories) at TP 1,
# and the first 8 at TP 2 (the issue's check), each run with its own plain baseline.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-synth-cpu
H="decode --model smollm2-135m --tp 1 --split heldout --num-prompts 16 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $H --drafter eagle3 --draft-model "${HEAD:-smollm2-135m-eagle3}" --draft-placement rank0 > $R/tp1_eagle3_synth.json 2> $R/tp1.log
C="decode --model smollm2-135m --tp 2 --split heldout --num-prompts 8 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $C --drafter eagle3 --draft-model "${HEAD:-smollm2-135m-eagle3}" > $R/tp2_eagle3_synth.json 2> $R/tp2.log
.venv/bin/spectune $H --drafter ngram > $R/tp1_ngram.json 2>> $R/tp1.log
.venv/bin/spectune $C --drafter ngram > $R/tp2_ngram.json 2>> $R/tp2.log
