#!/usr/bin/env bash
# Where MTP's extra verify time comes from: n-gram against MTP at k = 4 on the DeepSeek-V3 shape (4 of 61
# layers), one imposed profile, without emulation and at emulated TP 8 over PCIe. On the device, carry
# .devcarry/pyd:  OUT=$OUT bash results/2026-12-08/mtp-verify-split-h100/call.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
bash infra/device-setup.sh pyd > "$OUT/setup.txt" 2>&1 || { tail -5 "$OUT/setup.txt"; exit 1; }
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/log.txt"
common="--model random:deepseek-v3:layers=4 --tp 1 -k 4 --device cuda --category writing --num-prompts 2 --max-new-tokens 64 --json --simulate-accept-profile 0.85,0.65,0.48,0.35"
for emu in none tp8; do
  extra=""; [ $emu = tp8 ] && extra="--emulate-tp 8 --allreduce-table seeds-tp8-pcie"
  for d in ngram mtp; do
    echo "=== $d $emu" | tee -a "$OUT/log.txt"
    timeout -k 10 150 $PY -m orchestrator decode $common --drafter $d $extra > "$OUT/${d}_${emu}.json" 2>> "$OUT/log.txt"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('step_ms_p50','verify_ms_p50','draft_ms_p50','accept_len_mean','decode_tok_s')})" "$OUT/${d}_${emu}.json" | tee -a "$OUT/log.txt"
  done
done
echo "=== mtp tp8 --no-overlap" | tee -a "$OUT/log.txt"
timeout -k 10 150 $PY -m orchestrator decode $common --drafter mtp --emulate-tp 8 --allreduce-table seeds-tp8-pcie --no-overlap > "$OUT/mtp_tp8_no_overlap.json" 2>> "$OUT/log.txt"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('step_ms_p50','verify_ms_p50','draft_ms_p50','accept_len_mean','decode_tok_s')})" "$OUT/mtp_tp8_no_overlap.json" | tee -a "$OUT/log.txt"
