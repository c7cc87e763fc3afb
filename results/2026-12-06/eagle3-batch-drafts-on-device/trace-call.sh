#!/usr/bin/env bash
# Where a batched EAGLE-3 step's time goes on the H200 (issue 33: k = 4 at B = 8 was 1.84x plain B = 8),
# one device call that also sets up Ray/Optuna/MLflow for the landscape calls after it (carry .devcarry/ray
# .devcarry/rest): scripts.trace_decode of EAGLE-3 (random 8B-shape head, tau 3, k = 4) and of plain decoding,
# both at B = 8 on 8 writing prompts x 64 new tokens: per phase its host time and the GPU idle inside it,
# and the kernels by total time.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
PY=/tmp/spectune-venv/bin/python
export PYTHONPATH=$PWD
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
    for k in s['top_kernels'][:12]: print('    %.3f ms %5d %s' % (k['total_ms'], k['count'], k['name'][:90]))
"
