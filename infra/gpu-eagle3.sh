#!/usr/bin/env bash
# EAGLE-3 on one GPU (docs/eagle3.md): train a SmolLM2 head on the GPU from the train split, score it
# against the shipped head and n-gram on the held-out split (never trained on; rank0 placement), and time the draft chain
# of a random head of Llama-3-8B's shape at simulated tau = 3. Runs THERE after `infra/device-setup.sh`
# (ray, rest and the demo model: docs/gpu.md); everything comes back as two files in $OUT:
# eagle3.tar (JSON per run, the log) and head.tar (the trained head: config.json, model.safetensors,
# training.json).
#
#   OUT=$OUT bash infra/gpu-eagle3.sh            # TRAIN_S (default 570) caps the train stage's wall time
#   STAGES=train ... then STAGES="train heldout" ...  # generation + training past one call: the second resumes
#   STAGES="train heldout" ... then STAGES=chain ...  # the same work in two calls (WORK in /tmp persists on a warm machine)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f /tmp/spectune-venv/spectune.env ] && . /tmp/spectune-venv/spectune.env
PY=${PYTHON:-/tmp/spectune-venv/bin/python}
OUT=${OUT:-/tmp/spectune-eagle3}
W=${WORK:-/tmp/spectune-eagle3-work}
mkdir -p "$OUT" "$W/json"
log=$W/json/log.txt
run() {  # name, limit, args...: JSON to $W/json/name.json
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" >> "$log"
  timeout -k 10 "$limit" $PY -m orchestrator "$@" > "$W/json/$name.json" 2>> "$log" || echo "!!! $name failed (rc=$?)" >> "$log"
}

STAGES=" ${STAGES:-train heldout chain} "
stage() { [[ $STAGES == *" $1 "* ]]; }

# 1. train on the GPU: every train-split prompt, SYNTH made-up ones (orchestrator/prompts/synthesis.py),
#    SELF written by the target itself (Magpie); TRAIN_TIME seconds of training after the responses
#    (the schedule anneals to that budget); a second call with the same WORK resumes (responses cached
#    in data.pt, the optimizer in train_state.pt, saved every 100 steps); TRAIN_S caps this call's stage.
#    A small run first: if the GPU generation path fails, it fails in seconds, not after the budget.
stage train && { echo "=== train-drafter" >> "$log"
[ -f "$W/head/data.pt" ] || { rm -rf "$W/smoke"  # a fresh smoke run: its own cached responses would skip generation
  timeout -k 10 120 $PY -m orchestrator train-drafter --model smollm2-135m --split train --num-prompts 8 \
    --self-prompts 8 --max-new-tokens 32 --max-steps 2 --device cuda --out "$W/smoke" >> "$log" 2>&1 \
  || { echo "!!! train-drafter smoke failed" >> "$log"; STAGES=" "; }; }
stage train && { timeout -k 10 "${TRAIN_S:-570}" $PY -m orchestrator train-drafter --model smollm2-135m --split train \
    --synthetic-prompts "${SYNTH:-4000}" --self-prompts "${SELF:-8000}" \
    --max-new-tokens 256 --gen-batch 512 --max-steps "${STEPS:-20000}" --max-time "${TRAIN_TIME:-600}" --batch 32 --pack-tokens 8192 \
    --ttt-steps 4 --lr 1e-3 --draft-vocab 4096 --save-every 100 --val-every 20 \
    --device cuda --out "$W/head" >> "$log" 2>&1 || echo "!!! train-drafter stopped (rc=$?; the last saved step is kept)" >> "$log"; }
}

# 2. held-out acceptance and speed (--split heldout: the 4th of every 4 prompts per category, never trained on),
#    each run with its own plain baseline on the same prompts
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json"
stage heldout && {
run heldout_ngram 200 $H --drafter ngram -k 4
run heldout_eagle3_shipped 200 $H --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --draft-placement rank0
[ -f "$W/head/model.safetensors" ] && run heldout_eagle3_gpu 200 $H --drafter eagle3 --draft-model "$W/head" -k 4 --draft-placement rank0
}

# 3. the chain of a head of Llama-3-8B's shape (random: acceptance imposed), in the rank and as its own process
stage chain && {
$PY -m workers.drafters.eagle3.checkpoint --target random:llama-3-8b --draft-vocab 32000 --out "$W/head8b" >> "$log" 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
for p in rank0 actor; do
  run random8b_eagle3_$p 240 $E --drafter eagle3 --draft-model "$W/head8b" --draft-placement $p -k 4 --simulate-accept-len 3
done
}

tar -C "$W/json" -cf "$OUT/eagle3.tar" .
[ -d "$W/head" ] && tar -C "$W/head" -cf "$OUT/head.tar" config.json model.safetensors training.json 2>/dev/null
grep -E "^(===|!!!)|accepted length|tok/s" "$log" | tail -40
