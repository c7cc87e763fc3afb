#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), commit 9114ff2 (review fixes: staging behind an event, tree shapes in plain
# Python, the SDPA fallback's mask staging), one lease:
#  call 1, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests (+ test_graph_safety, test_tree
#          but its TP 2 demo-head test), the attention self-test, the random 8B head at simulated tau 3, k = 4,
#          rank0: chain (with its plain baseline), tree 3; then workers.tools.trace_decode of the chain (its
#          stdout, trace.txt, did not come back: the call returned at most 8 files);
#  call 2: `cp /tmp/trace/summary.json $OUT/` (the trace's summary, here trace_summary.json).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py -k "not tp2" > $OUT/kernels.txt 2>&1
$PY -m workers.kernels.attention_check --selftest > $OUT/attention_selftest.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/head8b.log 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > $OUT/random8b_rank0_chain.json 2> $OUT/chain.log
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --tree-width 3 --no-baseline > $OUT/random8b_rank0_tree3.json 2> $OUT/tree3.log
$PY -m workers.tools.trace_decode --model random:llama-3-8b --device cuda --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --max-new-tokens 64 --out /tmp/trace > $OUT/trace.txt 2>&1
# call 2
cp /tmp/trace/summary.json $OUT/
