#!/usr/bin/env bash
# Issue 33 item 3 (one EAGLE-3 head pass for all rows) on one lent GPU: the device tool was asked for
# nvidia-h200 and gave an NVIDIA H100 80GB HBM3 (setup.txt). One call (`run`, carry [".devcarry/pyd"]:
# pydantic 2.14.4, pydantic_core 2.50.5, annotated-types, typing-inspection, typing_extensions, the
# only packages `spectune decode` needs beyond the image), from the repo root, at commit 094f83a + tests:
#   kernels.txt  the GPU-path tests of the changed code (batched head rows and their CUDA graphs, the draft
#                model's (rows, k) graphs, graph safety, attention kernels, the device loop): 42 passed, 3 skipped
#   tp1.json     TP 1 batch-1 plain decode (Llama-3-8B shape, 4 writing prompts x 128 tokens)
#   table.txt, b8_k4.json, log.txt
#                infra/gpu-batch.sh with DRAFTER=eagle3: a random 8B-shape EAGLE-3 head (32000-token draft
#                vocabulary) at placement rank0, simulated tau = 3, k = 4, B = 8 over 16 bundled prompts x 64
#                new tokens; the same run decodes plainly at B = 8 and at batch 1 (its references)
# (The call had 4 minutes of device time: the code before the change was not run beside it.)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=$PWD:/tmp/site PYTHON=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_eagle3_rows.py tests/engine/test_model_drafter_rows.py \
  tests/engine/test_graph_safety.py tests/engine/test_kernels_attention.py tests/engine/test_device_loop.py -k "not tp2" > $OUT/kernels.txt 2>&1
timeout 45 python3 -m orchestrator decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 \
  --max-new-tokens 128 --json --drafter none -k 0 > $OUT/tp1.json 2>> $OUT/logs.txt
OUT=$OUT WORK=/tmp/e3b DRAFTER=eagle3 SIZES=8 KS=4 NUM_PROMPTS=16 PYTHON=python3 timeout 75 bash infra/gpu-batch.sh > $OUT/table.txt 2>&1
cp /tmp/e3b/json/*.json /tmp/e3b/json/log.txt $OUT/
