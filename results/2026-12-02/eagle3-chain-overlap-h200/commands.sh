#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), session 13, one call with carry [".devcarry/ray", ".devcarry/rest"]:
# setup, kernel self-tests, the chain stage of infra/gpu-eagle3.sh (rank0 with engine.overlap on: device
# drafts; actor), the same rank0 decode with --no-overlap, and a torch.profiler trace of the rank0 decode.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py > $OUT/kernels.txt 2>&1
STAGES=chain OUT=$OUT bash infra/gpu-eagle3.sh          # random8b_eagle3_{rank0,actor}.json, log_chain.txt
W=/tmp/spectune-eagle3-work
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m orchestrator $E --drafter eagle3 --draft-model $W/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --no-overlap > $OUT/random8b_eagle3_rank0_nooverlap.json
$PY -m workers.tools.trace_decode --model random:llama-3-8b --device cuda --drafter eagle3 --draft-model $W/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --max-new-tokens 64 --out /tmp/trace > $OUT/trace.txt 2>&1
