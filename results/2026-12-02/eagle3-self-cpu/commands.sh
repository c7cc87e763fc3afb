#!/usr/bin/env bash
# This machine (2 cores, CPU), session 12: the head of ../eagle3-train-self-written-h200 (HEAD=/tmp/newhead before
# it was shipped as smollm2-135m-eagle3) on the first 16 held-out prompts (MT-bench categories) at
# TP 1 (rank0) and the first 8 at TP 2 (actor: the issue's check). n-gram on the same prompts and
# commands: ../eagle3-synth-cpu/tp{1,2}_ngram.json (acceptance does not depend on the machine's load).
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-self-cpu
H="decode --model smollm2-135m --tp 1 --split heldout --num-prompts 16 --max-new-tokens 64 -k 4 --json"
C="decode --model smollm2-135m --tp 2 --split heldout --num-prompts 8 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $C --drafter eagle3 --draft-model "${HEAD:-smollm2-135m-eagle3}" > $R/tp2_eagle3.json 2> $R/tp2.log
.venv/bin/spectune $H --drafter eagle3 --draft-model "${HEAD:-smollm2-135m-eagle3}" --draft-placement rank0 > $R/tp1_eagle3.json 2> $R/tp1.log
