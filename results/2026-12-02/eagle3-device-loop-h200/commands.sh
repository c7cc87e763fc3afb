#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), the code of commit 7db44f5 (the device loop: verify + acceptance in one
# graph, the EAGLE-3 chain fed on the device; run from its working tree before the commit), one lease of
# three back-to-back calls:
#  call 1, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests (+ test_graph_safety,
#          test_tree but its TP 2 demo-head test, test_device_loop) and the attention self-test (kernels.txt:
#          127 passed, 1 skipped), the random 8B head at simulated tau 3, k = 4, rank0: the device loop with its
#          plain baseline, then the host path (--no-overlap) in the same call, then workers.tools.trace_decode
#          of the device loop (trace_summary.json);
#  call 2, carry [".devcarry/model-a"]: `bash infra/device-setup.sh model`;
#  call 3, carry [".devcarry/model-b"]: the model's second half, then the shipped head on the 56 held-out
#          prompts, chain k = 4: the device loop (with the plain baseline), the host path, and n-gram k = 4.
# logs_*.txt are the calls' stderr without pip warnings and GEMV race lines.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py tests/test_device_loop.py -k "not tp2" > $OUT/kernels.txt 2>&1
$PY -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/logs.txt 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > $OUT/random8b_rank0_device_loop.json 2>> $OUT/logs.txt
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --no-overlap --no-baseline > $OUT/random8b_rank0_host_path.json 2>> $OUT/logs.txt
$PY -m workers.tools.trace_decode --model random:llama-3-8b --device cuda --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --max-new-tokens 64 --out /tmp/trace > /tmp/trace.txt 2>&1
cp /tmp/trace/summary.json $OUT/trace_summary.json; tail -40 /tmp/trace.txt >> $OUT/logs.txt
# call 2: bash infra/device-setup.sh model      (call 3 starts with it too)
bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json -k 4"
G="$H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0"
$PY -m orchestrator $G > $OUT/heldout_eagle3_device_loop.json 2> $OUT/logs.txt
$PY -m orchestrator $G --no-overlap --no-baseline > $OUT/heldout_eagle3_host_path.json 2>> $OUT/logs.txt
$PY -m orchestrator $H --drafter ngram --no-baseline > $OUT/heldout_ngram.json 2>> $OUT/logs.txt
