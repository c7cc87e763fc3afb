#!/usr/bin/env bash
# H200, session 13, a fresh lease: `device-setup.sh rest`, the demo model's two calls, then (commit b6ff585)
# the shipped head with drafter.lookup = 2 and n-gram on the 56 held-out prompts. The lookup run's 214 tok/s
# is a bug this run found, fixed after it (feeds wider than the warmed chain were captured inside the timed
# run; commit after b6ff585): its acceptance and outputs stand, its speed does not.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json"
$PY -m orchestrator $H --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --draft-placement rank0 --draft-lookup 2 > $OUT/heldout_eagle3_lookup2.json 2> $OUT/lookup2.log
$PY -m orchestrator $H --drafter ngram -k 4 --no-baseline > $OUT/heldout_ngram.json 2> $OUT/ngram.log
