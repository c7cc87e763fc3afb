#!/usr/bin/env bash
# Issue 33's EAGLE-3 check side by side on whichever GPU the call gets (carry .devcarry/pyd .devcarry/old4,
# where .devcarry/old4 = `git archive 49330e9 workers orchestrator infra scripts pyproject.toml` less
# workers/drafters/eagle3/heads: the code before the batched drafters' inputs went in one copy):
# the GPU tests of the batched drafters, then infra/gpu-batch.sh's workload, EAGLE-3 (random 8B-shape head,
# tau 3) k = 4 at B = 8 against plain B = 8, the code before run first, then this tree.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/engine/test_eagle3_rows.py \
  tests/engine/test_model_drafter_rows.py tests/engine/test_graph_safety.py tests/unit/test_row_inputs.py -k "not tp2" > $OUT/tests.txt 2>&1
echo "tests: $SECONDS s" >> $OUT/setup.txt
PYTHON=python3 OUT=$OUT WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 BEFORE=$PWD/.devcarry/old4 timeout 300 bash infra/gpu-batch.sh > /dev/null 2>&1
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -3 $OUT/setup.txt; tail -2 $OUT/tests.txt; grep -v "^thr\|^weights\|^and its\|^each run" /tmp/ge/json/table.txt
for f in /tmp/ge/json/*b8_k4.json; do python3 -c "
import json; r=json.load(open('$f'))
print('$f'.split('/')[-1], {k: round(r[k], 3) for k in ('decode_tok_s', 'step_ms_p50', 'verify_ms_p50', 'draft_ms_p50', 'baseline_decode_tok_s', 'decode_speedup_vs_baseline', 'num_steps')})"; done
