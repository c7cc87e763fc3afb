#!/usr/bin/env bash
# Issue 33's EAGLE-3 check on an H200 (carry .devcarry/pyd .devcarry/old3, where .devcarry/old3 =
# `git archive 64b6454 workers orchestrator infra scripts pyproject.toml` less workers/drafters/eagle3/heads: this session's code before the
# batched step kept its drafts on the device): infra/gpu-batch.sh's workload, EAGLE-3 (random 8B-shape
# head, tau 3) k = 4 at B = 8 against plain B = 8, the code before run first, then this tree.
# Exits at once on another GPU (the H100 run of results/2026-12-06/eagle3-batch-drafts-on-device/README.md let *H100* through).
# `call3.sh new`: this tree only (what fits the last ~4 minutes of a session's device time).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
case $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) in *H200*) ;; *) echo "not an H200: nothing run"; cat $OUT/setup.txt; exit 0 ;; esac
PYTHON=python3 OUT=$OUT WORK=/tmp/ge DRAFTER=eagle3 SIZES=8 KS=4 BEFORE=$([ "${1:-}" = new ] || echo $PWD/.devcarry/old3) timeout 280 bash infra/gpu-batch.sh > /dev/null 2>&1
echo "call: $SECONDS s" >> $OUT/setup.txt
tail -2 $OUT/setup.txt; grep -v "^thr\|^weights\|^and its\|^each run" /tmp/ge/json/table.txt
for f in /tmp/ge/json/*b8_k4.json; do python3 -c "
import json; r=json.load(open('$f'))
print('$f'.split('/')[-1], {k: round(r[k], 3) for k in ('decode_tok_s', 'step_ms_p50', 'verify_ms_p50', 'draft_ms_p50', 'baseline_decode_tok_s', 'decode_speedup_vs_baseline', 'num_steps')})"; done
