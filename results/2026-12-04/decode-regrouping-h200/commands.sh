#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), one call, carry [".devcarry/ray", ".devcarry/rest", ".devcarry/old"], where
# .devcarry/old = `git archive dd1988d workers orchestrator infra pyproject.toml` (the code before issue 30's
# regrouping: orchestrator/ by concern, typed CUDA-graph keys, declared drafter capabilities). Old and new
# alternate on the same prompts and machine: TP 1 plain decode of the Llama-3-8B shape (random bf16 weights),
# then the random 8B EAGLE-3 head at simulated tau 3, k = 4 on rank 0 (the device loop), then the kernel
# self-tests (tests/engine: attention, gemv, triton kernels, graph safety, tree, device loop; TP 2 ones skipped).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
(cd .devcarry/old && PYTHONPATH=$PWD timeout 100 $PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b) > $OUT/logs.txt 2>&1
for i in 1 2; do
  (cd .devcarry/old && PYTHONPATH=$PWD timeout 150 $PY -m orchestrator $D --drafter none -k 0 > $OUT/tp1_old_$i.json 2>>$OUT/logs.txt)
  timeout 150 $PY -m orchestrator $D --drafter none -k 0 > $OUT/tp1_new_$i.json 2>>$OUT/logs.txt
done
(cd .devcarry/old && PYTHONPATH=$PWD timeout 150 $PY -m orchestrator $D --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --no-baseline > $OUT/eagle3_old.json 2>>$OUT/logs.txt)
timeout 150 $PY -m orchestrator $D --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --no-baseline > $OUT/eagle3_new.json 2>>$OUT/logs.txt
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py tests/engine/test_kernels_gemv.py tests/engine/test_triton_kernels.py \
  tests/engine/test_graph_safety.py tests/e2e/test_tree.py tests/engine/test_device_loop.py -k "not tp2" > $OUT/kernels.txt 2>&1
$PY -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
