#!/usr/bin/env bash
# Where a batched EAGLE-3 step's time goes now (issue 33's k = 4 at B = 8; after the drafts stay on the
# device), on whichever GPU the call gets (carry .devcarry/pyd): scripts.trace_decode of EAGLE-3 (random
# 8B-shape head, tau 3, k = 4) and of plain decoding, both at B = 8 on 8 writing prompts x 64 new tokens:
# per phase its host time and the GPU idle inside it, and the kernels by total time.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD PY=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
$PY -m workers.drafters.eagle3.checkpoint --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b >> $OUT/setup.txt 2>&1
T="--model random:llama-3-8b --device cuda --max-new-tokens 64 --batch-size 8"
timeout 150 $PY -m scripts.trace_decode $T --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 \
  --simulate-accept-len 3 --out /tmp/tr_e3 > /dev/null 2>> $OUT/setup.txt
timeout 120 $PY -m scripts.trace_decode $T --drafter none -k 0 --out /tmp/tr_plain > /dev/null 2>> $OUT/setup.txt
for t in e3 plain; do
  cp /tmp/tr_$t/summary.json $OUT/summary_$t.json; gzip -c /tmp/tr_$t/trace.json > $OUT/trace_$t.json.gz
done
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -4 $OUT/setup.txt
$PY -c "
import json
for t in ('e3', 'plain'):
    s = json.load(open('$OUT/summary_' + t + '.json'))
    print(t, 'steps', s['steps'], 'per step', s['per_step_ms'], 'thr', s['throughput_tok_s'])
    for p, v in s['phases'].items(): print('  ', p, v)
    for k in s['top_kernels'][:14]: print('    %.3f ms %5d %s' % (k['total_ms'], k['count'], k['name'][:90]))
"
