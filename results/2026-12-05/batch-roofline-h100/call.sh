#!/usr/bin/env bash
# Issue 33 item 2: the split-KV attention's live splits only, before (.devcarry/old = git archive e0c1e67) and after (working tree), one call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/pyd/*.whl > $OUT/setup.txt 2>&1
export PYTHON=python3
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv >> $OUT/setup.txt 2>&1
ROOT=$PWD
# 1. infra/gpu-batch.sh's workload, plain at B = 32 with its batch-1 reference, before then after
PYTHONPATH=$ROOT:/tmp/site OUT=$OUT WORK=/tmp/gb BEFORE=$ROOT/.devcarry/old SIZES=32 KS=0 timeout 260 bash infra/gpu-batch.sh > $OUT/table.txt 2>&1
cp /tmp/gb/json/*.json /tmp/gb/json/log.txt $OUT/ 2>/dev/null
echo "batch done $SECONDS s" >> $OUT/setup.txt
# 2. TP 1 batch-1 plain decode, before / after
D="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json --drafter none -k 0"
for code in old new; do
  d=$ROOT; [ $code = old ] && d=$ROOT/.devcarry/old
  echo -n "${code}_1 " >> $OUT/tp1.txt
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 60 python3 -m orchestrator $D >> $OUT/tp1.txt 2>> $OUT/logs.txt) || echo >> $OUT/tp1.txt
done
echo "tp1 done $SECONDS s" >> $OUT/setup.txt
# 3. the kernel tests of the changed kernel
PYTHONPATH=$ROOT:/tmp/site timeout 100 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kernels_attention.py tests/engine/test_triton_kernels.py \
  tests/engine/test_graph_safety.py -k "not tp2" > $OUT/kernels.txt 2>&1
PYTHONPATH=$ROOT:/tmp/site timeout 40 python3 -m workers.kernels.attention_check --selftest >> $OUT/kernels.txt 2>&1
echo "kernels done $SECONDS s" >> $OUT/setup.txt
# 4. where the B = 32 pass's time goes now (2048-slot static cache, as the engine's), while the call has room
[ $SECONDS -lt 420 ] && PYTHONPATH=$ROOT:/tmp/site timeout $((500 - SECONDS)) python3 -m scripts.profile_step --rows 32 --context 294 --max-seq 2048 \
  --attention triton --gemv auto --top 16 --json $OUT/prof_new.json > $OUT/prof_new.txt 2>&1
echo "call: $SECONDS s" >> $OUT/setup.txt
python3 - "$OUT/tp1.txt" >> $OUT/setup.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    name, _, j = line.partition(" ")
    try:
        r = json.loads(j)
        print(name, "thr", round(r["throughput_tok_s"], 1), "dec", round(r.get("decode_tok_s") or 0, 1))
    except Exception:
        print(name, "no result")
PY
