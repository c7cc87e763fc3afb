#!/usr/bin/env bash
# Batch 4 against batch 1 on this repo's CPU machine (2 cores), one gang, one run after the other:
# plain decoding at batch 1 (the reference), plain at batch 4, n-gram k = 4 at batch 4.
# Writes batch4.json (the decode JSON) and batch4.log (progress lines) here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export RAY_AUTH_MODE=disabled
.venv/bin/python -m orchestrator decode --model smollm2-135m --tp 1 --drafter ngram -k 4 --batch-size 4 \
  --num-prompts 8 --max-new-tokens 64 --json > results/2026-12-01/batch-cpu/batch4.json 2> results/2026-12-01/batch-cpu/batch4.log
