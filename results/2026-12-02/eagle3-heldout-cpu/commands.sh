#!/usr/bin/env bash
# Held-out acceptance of the GPU-trained EAGLE-3 head (results/2026-12-02/h200-eagle3, step 700 of
# `infra/gpu-eagle3.sh`'s training: 184 train-split responses of <= 384 tokens) against the shipped
# head and n-gram, on the 16 MT-bench prompts of the held-out split (never trained on), on CPU:
# TP 1, greedy, k = 4, 64 new tokens (docs/eagle3.md's table).  HEAD=/path/to/gpu/head bash commands.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-02/eagle3-heldout-cpu
.venv/bin/python - "$R/heldout.jsonl" <<'PY'
import json, sys
from orchestrator.prompts import BUNDLED_PROMPTS
seen = {}
with open(BUNDLED_PROMPTS) as f, open(sys.argv[1], "w") as out:
    for line in f:
        obj = json.loads(line)
        i = seen[obj["category"]] = seen.get(obj["category"], -1) + 1
        if i % 4 == 3:
            out.write(line)
PY
H="decode --model smollm2-135m --tp 1 --prompts $R/heldout.jsonl --num-prompts 16 --max-new-tokens 64 -k 4 --json"
.venv/bin/spectune $H --drafter ngram > $R/ngram.json
.venv/bin/spectune $H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0 > $R/eagle3_shipped.json
.venv/bin/spectune $H --drafter eagle3 --draft-model "${HEAD:-/tmp/gpuhead}" --draft-placement rank0 > $R/eagle3_gpu_trained.json
