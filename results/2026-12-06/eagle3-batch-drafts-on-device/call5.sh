#!/usr/bin/env bash
# Issue 33 on the H200 in one call that carries only .devcarry/pyd (call2.sh's ray + rest no longer fit
# beside the working tree): exits at once on another GPU; else the GPU tests (kernels, graph safety, the
# batched drafters), EAGLE-3 (random 8B-shape head, tau 3) k = 4 at B = 8 against plain B = 8, plain
# B = 32 (infra/gpu-batch.sh's workload) and the TP 1 batch-1 plain decode. About 4 minutes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > $OUT/setup.txt 2>&1
case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in *H200*) ;; *) [ -n "${ANY_GPU:-}" ] || { echo "NOT H200: nothing run"; cat $OUT/setup.txt; exit 3; } ;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl >> $OUT/setup.txt 2>&1
ROOT=$PWD PY=python3
export PYTHONPATH=/tmp/site
PYTHONPATH=/tmp/site:$ROOT timeout 100 $PY -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py tests/engine/test_triton_kernels.py \
  tests/engine/test_graph_safety.py tests/engine/test_eagle3_rows.py tests/engine/test_model_drafter_rows.py tests/unit/test_row_inputs.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=/tmp/site:$ROOT timeout 30 $PY -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "kernels done $SECONDS s" >> $OUT/setup.txt
mkdir -p $OUT/runs
PYTHON=$PY OUT=$OUT/runs WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 timeout 150 bash infra/gpu-batch.sh > /dev/null 2>&1
mv $OUT/runs/batch.tar $OUT/runs/e3.tar; echo "eagle3 done $SECONDS s" >> $OUT/setup.txt
PYTHON=$PY OUT=$OUT/runs WORK=/tmp/gb SIZES=32 KS=0 timeout 120 bash infra/gpu-batch.sh > /dev/null 2>&1
mv $OUT/runs/batch.tar $OUT/runs/b32.tar; echo "b32 done $SECONDS s" >> $OUT/setup.txt
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
PYTHONPATH=/tmp/site:$ROOT timeout 50 $PY -m orchestrator $D > /tmp/tp1.json 2>> $OUT/logs.txt
$PY -c "import json; r=json.load(open('/tmp/tp1.json')); print('tp1 thr', round(r['throughput_tok_s'],1), 'dec', round(r['decode_tok_s'],1))" >> $OUT/setup.txt 2>&1
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -6 $OUT/setup.txt; tail -2 $OUT/kernels.txt
cat /tmp/ge/json/table.txt /tmp/gb/json/table.txt 2>/dev/null | grep -v "^thr\|^weights\|^and its\|^each run"
$PY -c "
import json; r=json.load(open('/tmp/ge/json/b8_k4.json'))
print({k: round(r[k], 3) for k in ('decode_tok_s', 'step_ms_p50', 'verify_ms_p50', 'draft_ms_p50', 'baseline_decode_tok_s', 'decode_speedup_vs_baseline', 'num_steps', 'accept_len_mean')})"
