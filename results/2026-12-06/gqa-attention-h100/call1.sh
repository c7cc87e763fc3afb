#!/usr/bin/env bash
# Issue 33 on the lent GPU, one call (carry .devcarry/ray .devcarry/rest .devcarry/old2): the packs for the
# landscape calls that follow (issue 32), then the GQA-grouped split-KV attention (working tree) against the
# live-splits one (.devcarry/old2 = git archive 9f1f3e5, workers orchestrator infra scripts pyproject.toml):
# kernel tests, B = 32 plain before/after (infra/gpu-batch.sh's workload), EAGLE-3 B = 8 k = 4, TP 1 new/old.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
ROOT=$PWD
if [ "${1:-}" = nosetup ]; then  # no landscape calls follow (an H100 came): pydantic alone, carry .devcarry/pyd .devcarry/old2
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
  export PYTHONPATH=/tmp/site PY=python3
else
  bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
echo "setup done $SECONDS s" >> $OUT/setup.txt
PY=${PY:-/tmp/spectune-venv/bin/python}
# 1. the kernel tests on the GPU
PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} timeout 90 $PY -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py tests/engine/test_triton_kernels.py \
  tests/engine/test_graph_safety.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} timeout 30 $PY -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "kernels done $SECONDS s" >> $OUT/setup.txt
# 2. B = 32 plain with its batch-1 reference, before then after
mkdir -p $OUT/b32 $OUT/e3
PYTHON=$PY OUT=$OUT/b32 WORK=/tmp/gb BEFORE=$ROOT/.devcarry/old2 SIZES=32 KS=0 timeout 170 bash infra/gpu-batch.sh > /dev/null 2>&1
echo "batch done $SECONDS s" >> $OUT/setup.txt
# 3. EAGLE-3 (random 8B-shape head, tau 3) k = 4 at B = 8 against plain at B = 8
PYTHON=$PY OUT=$OUT/e3 WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 timeout 150 bash infra/gpu-batch.sh > /dev/null 2>&1
echo "eagle3 done $SECONDS s" >> $OUT/setup.txt
# 4. TP 1 batch-1 plain decode, new then old, twice
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for rep in 1; do for code in new old; do
  d=$ROOT; [ $code = old ] && d=$ROOT/.devcarry/old2
  (cd $d && PYTHONPATH=$d${PYTHONPATH:+:$PYTHONPATH} timeout 50 $PY -m orchestrator $D > /tmp/tp1_$code.json 2>> $OUT/logs.txt)
  $PY -c "import json,sys; r=json.load(open('/tmp/tp1_$code.json')); print('tp1 $code thr', round(r['throughput_tok_s'],1), 'dec', round(r.get('decode_tok_s') or 0,1))" >> $OUT/setup.txt 2>&1
done; done
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -12 $OUT/setup.txt; tail -3 $OUT/kernels.txt; cat /tmp/gb/json/table.txt /tmp/ge/json/table.txt 2>/dev/null | tail -14
