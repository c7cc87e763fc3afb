#!/usr/bin/env bash
# The TP 1 batch-1 plain decode of call2.sh/call5.sh, the code at 64b6454 (.devcarry/old3, session 23's start) and
# this tree, alternating twice in one call on one GPU, one environment (python3 + .devcarry/pyd): does the
# batch-1 path of the code since then run as fast?
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $OUT/setup.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl >> $OUT/setup.txt 2>&1
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for round in 1 2; do
  for code in old new; do
    dir=$PWD; [ $code = old ] && dir=$PWD/.devcarry/old3
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 80 python3 -m orchestrator $D > /tmp/tp1_$code.json 2>> $OUT/logs_$code.txt)
    python3 -c "import json; r=json.load(open('/tmp/tp1_$code.json')); print('round $round $code thr', round(r['throughput_tok_s'],1), 'dec', round(r['decode_tok_s'],1))" | tee -a $OUT/setup.txt
  done
done
echo "call: $SECONDS s" >> $OUT/setup.txt
