#!/usr/bin/env bash
# The second device call (carry .devcarry/pyd .devcarry/old2): where a B = 32 plain step's time goes with the
# GQA-grouped attention (scripts/profile_step.py --rows 32, as in results/2026-12-05/batch-roofline-h100/), then,
# if the GPU is an H200, issue 33's checks there: B = 32 plain (infra/gpu-batch.sh's workload), EAGLE-3 k = 4
# at B = 8, the kernel tests and the TP 1 decode against the code without the grouping (.devcarry/old2).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
ROOT=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
[ "${ANY_GPU:-0}" = 1 ] || case $GPU in *H200*) ;; *) echo "not an H200 ($GPU): nothing run (ANY_GPU=1 runs the profile anyway)" >> $OUT/setup.txt; cat $OUT/setup.txt; exit 0 ;; esac
PYTHONPATH=$ROOT:/tmp/site timeout 200 python3 -m scripts.profile_step --rows 32 --context 294 --max-seq 2048 \
  --attention triton --top 16 --json $OUT/prof.json > $OUT/prof.txt 2>&1
echo "profile done $SECONDS s" >> $OUT/setup.txt
case $GPU in *H200*)
  mkdir -p $OUT/runs
  PYTHON=python3 OUT=$OUT/runs WORK=/tmp/gb SIZES=32 KS=0 timeout 120 bash infra/gpu-batch.sh > /dev/null 2>&1
  mv $OUT/runs/batch.tar $OUT/runs/b32.tar
  PYTHON=python3 OUT=$OUT/runs WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 timeout 150 bash infra/gpu-batch.sh > /dev/null 2>&1
  mv $OUT/runs/batch.tar $OUT/runs/e3.tar
  PYTHONPATH=$ROOT:/tmp/site timeout 90 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py \
    tests/engine/test_triton_kernels.py tests/engine/test_graph_safety.py -k "not tp2" > $OUT/kernels.txt 2>&1
  PYTHONPATH=$ROOT:/tmp/site timeout 30 python3 -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
  D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
  for code in new old; do
    d=$ROOT; [ $code = old ] && d=$ROOT/.devcarry/old2
    (cd $d && PYTHONPATH=$d:/tmp/site timeout 50 python3 -m orchestrator $D > /tmp/tp1_$code.json 2>> $OUT/logs.txt)
    python3 -c "import json; r=json.load(open('/tmp/tp1_$code.json')); print('tp1 $code thr', round(r['throughput_tok_s'],1), 'dec', round(r['decode_tok_s'],1))" >> $OUT/setup.txt 2>&1
  done ;;
esac
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -8 $OUT/setup.txt; tail -30 $OUT/prof.txt; cat /tmp/gb/json/table.txt /tmp/ge/json/table.txt 2>/dev/null | grep -v "^thr\|^weights\|^and its\|^each run"; tail -2 $OUT/kernels.txt 2>/dev/null
