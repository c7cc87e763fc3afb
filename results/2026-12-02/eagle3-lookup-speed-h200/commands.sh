#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), commit c2a31a4, one lease of three calls:
#  call 1, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests, a TP 1 plain decode of
#          random:llama-3-8b, the chain stage of infra/gpu-eagle3.sh (log.txt, random8b_eagle3_*.json);
#  call 2, carry [".devcarry/model-a"]: `bash infra/device-setup.sh model`;
#  call 3, carry [".devcarry/model-b"]: the model's second half, then the shipped head on the 56 held-out
#          prompts with drafter.lookup = 2 (with the plain baseline), the head alone, and n-gram.
# It measures the speed of lookup after the fix of the feeds wider than the warmed chain (ready_width).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py > $OUT/kernels.txt 2>&1
$PY -m orchestrator decode --model random:llama-3-8b --tp 1 --drafter none -k 0 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json > $OUT/random8b_plain_tp1.json 2> $OUT/plain.log
STAGES=chain OUT=$OUT bash infra/gpu-eagle3.sh
# call 2: bash infra/device-setup.sh model      (call 3 starts with it too)
bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json"
$PY -m orchestrator $H --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --draft-placement rank0 --draft-lookup 2 > $OUT/heldout_eagle3_lookup2.json 2> $OUT/lookup2.log
$PY -m orchestrator $H --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --draft-placement rank0 --no-baseline > $OUT/heldout_eagle3_head.json 2> $OUT/head.log
$PY -m orchestrator $H --drafter ngram -k 4 --no-baseline > $OUT/heldout_ngram.json 2> $OUT/ngram.log
