#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), commit f9dbfb3 (the reread: the static step input on every StepRunner, the
# chain's timing events on the loop), one call, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel
# self-tests (+ test_graph_safety, test_tree but its TP 2 demo-head test, test_device_loop) and the attention
# self-test (kernels.txt: 129 passed, 1 skipped), then the random 8B head at simulated tau 3, k = 4, rank0:
# the device loop with its plain baseline (TP 1) and the host path (--no-overlap) in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py tests/test_device_loop.py -k "not tp2" > $OUT/kernels.txt 2>&1
$PY -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/logs.txt 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > $OUT/random8b_rank0_device_loop.json 2>> $OUT/logs.txt
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --no-overlap --no-baseline > $OUT/random8b_rank0_host_path.json 2>> $OUT/logs.txt
