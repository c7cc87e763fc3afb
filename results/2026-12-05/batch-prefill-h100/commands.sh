#!/usr/bin/env bash
# Batched prefill (issue 33, item 1) on the H200: one device call (`run`, kind nvidia-h200), carry
# [".devcarry/old", ".devcarry/new", ".whl"], from the repo root:
#   .devcarry/old = `git archive 658e5f9 workers orchestrator infra pyproject.toml` (the code before the change;
#                   the EAGLE-3 demo head left out)
#   .devcarry/new = `git archive 658e5f9 workers orchestrator infra tests pyproject.toml` with this change's files
#                   copied over (workers/model/transformer.py, workers/engine/batched.py,
#                   workers/drafters/model_drafter.py, orchestrator/decode/run.py, infra/gpu-batch.sh,
#                   tests/engine/test_batched_prefill.py): the delta alone, whatever else the working tree holds
#   .whl          = pydantic 2.14.4, pydantic_core 2.50.5, annotated-types, typing-inspection, typing_extensions
#                   (what `spectune decode` needs beyond the image; no Ray, Optuna or MLflow)
# 1. infra/gpu-batch.sh's workload (random:llama-3-8b, TP 1, 32 bundled prompts x 64 new tokens), plain at B = 32
#    with its batch-1 reference in the same gang, first with the code before, then after (table.txt)
# 2. TP 1 batch-1 plain decode (4 writing prompts x 128 tokens), before / after alternating (tp1.txt)
# 3. the kernel self-tests and the batched prefill's CPU tests (kernels.txt)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site PYTHON=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $OUT/setup.txt 2>&1
ROOT=$PWD
OUT=$OUT WORK=/tmp/gb BEFORE=$ROOT/.devcarry/old SIZES=32 KS=0 bash .devcarry/new/infra/gpu-batch.sh > $OUT/table.txt 2>&1
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for i in 1 2; do
  [ $i = 2 ] && [ $SECONDS -gt 330 ] && break  # the second pair only while the call has room
  for code in old new; do  # one line per run in tp1.txt: "<code>_<i> <the decode JSON>"
    echo -n "${code}_$i " >> $OUT/tp1.txt
    (cd .devcarry/$code && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m orchestrator $D >> $OUT/tp1.txt 2>> $OUT/logs.txt) || echo >> $OUT/tp1.txt
  done
done
cd .devcarry/new && PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py \
  tests/engine/test_kernels_gemv.py tests/engine/test_triton_kernels.py tests/engine/test_graph_safety.py tests/e2e/test_tree.py \
  tests/engine/test_device_loop.py tests/engine/test_batched_prefill.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=$PWD:/tmp/site python3 -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "call: $SECONDS s" >> $OUT/setup.txt
