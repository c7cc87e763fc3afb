#!/usr/bin/env bash
# Issue 33 item 2 (not yet run: the next device call): the GQA-grouped split-KV attention (working tree) against the live-splits one (.devcarry/old2 = git archive 9f1f3e5), one call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHON=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
ROOT=$PWD
# 1. the kernel tests of the changed kernel, on the GPU
PYTHONPATH=$ROOT:/tmp/site timeout 80 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py tests/engine/test_triton_kernels.py \
  tests/engine/test_graph_safety.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=$ROOT:/tmp/site timeout 30 python3 -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "kernels done $SECONDS s" >> $OUT/setup.txt
# 2. B = 32 plain (infra/gpu-batch.sh's workload) with its batch-1 reference, before then after
PYTHONPATH=$ROOT:/tmp/site OUT=$OUT WORK=/tmp/gb BEFORE=$ROOT/.devcarry/old2 SIZES=32 KS=0 timeout 150 bash infra/gpu-batch.sh > $OUT/table.txt 2>&1
echo "batch done $SECONDS s" >> $OUT/setup.txt
# 3. TP 1 batch-1 plain decode, new then old
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for code in new old; do
  d=$ROOT; [ $code = old ] && d=$ROOT/.devcarry/old2
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 50 python3 -m orchestrator $D > /tmp/tp1_$code.json 2>> $OUT/logs.txt)
  python3 -c "import json,sys; r=json.load(open('/tmp/tp1_$code.json')); print('tp1 $code thr', round(r['throughput_tok_s'],1), 'dec', round(r.get('decode_tok_s') or 0,1))" >> $OUT/setup.txt 2>&1
done
echo "call: $SECONDS s" >> $OUT/setup.txt
