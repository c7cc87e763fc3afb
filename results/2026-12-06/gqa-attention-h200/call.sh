#!/usr/bin/env bash
# Issue 33's checks on an H200, trimmed to fit ~5 minutes of device time (carry .devcarry/pyd .devcarry/old2):
# B = 32 plain (infra/gpu-batch.sh's workload), TP 1 batch-1 new against the code before the GQA grouping
# (.devcarry/old2 = git archive 9f1f3e5), the kernel tests, EAGLE-3 k = 4 at B = 8. Exits at once on another GPU.
# `call.sh min`: B = 32 and TP 1 only (what fits the last ~3 minutes of a session's device time).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
case $GPU in *H200*) ;; *) echo "not an H200 ($GPU): nothing run" >> $OUT/setup.txt; cat $OUT/setup.txt; exit 0 ;; esac
mkdir -p $OUT/runs
PYTHON=python3 OUT=$OUT/runs WORK=/tmp/gb SIZES=32 KS=0 timeout 120 bash infra/gpu-batch.sh > /dev/null 2>&1
mv $OUT/runs/batch.tar $OUT/runs/b32.tar; echo "b32 done $SECONDS s" >> $OUT/setup.txt
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for code in new old; do
  d=$ROOT; [ $code = old ] && d=$ROOT/.devcarry/old2
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 50 python3 -m orchestrator $D > /tmp/tp1_$code.json 2>> $OUT/logs.txt)
  python3 -c "import json; r=json.load(open('/tmp/tp1_$code.json')); print('tp1 $code thr', round(r['throughput_tok_s'],1), 'dec', round(r['decode_tok_s'],1))" >> $OUT/setup.txt 2>&1
done
[ "${1:-}" = min ] && { echo "call (min: B = 32 and TP 1 only): $SECONDS s" >> $OUT/setup.txt; cat $OUT/setup.txt; cat /tmp/gb/json/table.txt; exit 0; }
PYTHONPATH=$ROOT:/tmp/site timeout 90 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py \
  tests/engine/test_triton_kernels.py tests/engine/test_graph_safety.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=$ROOT:/tmp/site timeout 30 python3 -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "kernels done $SECONDS s" >> $OUT/setup.txt
PYTHON=python3 OUT=$OUT/runs WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 timeout 150 bash infra/gpu-batch.sh > /dev/null 2>&1
mv $OUT/runs/batch.tar $OUT/runs/e3.tar
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -8 $OUT/setup.txt; cat /tmp/gb/json/table.txt /tmp/ge/json/table.txt 2>/dev/null | grep -v "^thr\|^weights\|^and its\|^each run"; tail -2 $OUT/kernels.txt 2>/dev/null
