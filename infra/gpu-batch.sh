#!/usr/bin/env bash
# Batch > 1 on one GPU (issue: batch sizes and schedules): plain decoding of the Llama-3-8B shape at
# B = 1, 4, 16, 32 and simulated acceptance tau = 3 at k = 2 and 4 per B, then one table of tok/s,
# the fraction of the HBM roofline (weights + the KV bytes a step reads, over the measured copy
# bandwidth) and the batch size where speculation stops paying. Runs THERE after
# `infra/device-setup.sh rest` (docs/gpu.md); everything comes back in $OUT/batch.tar.
#
#   OUT=$OUT bash infra/gpu-batch.sh            # SIZES="1 4 16 32" KS="2 4" override the grid
#   MODEL=smollm2-135m DEVICE=cpu SIZES="1 2" KS=2 NUM_PROMPTS=2 MAX_NEW=8 bash infra/gpu-batch.sh   # a CPU dry run
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f /tmp/spectune-venv/spectune.env ] && . /tmp/spectune-venv/spectune.env
PY=${PYTHON:-/tmp/spectune-venv/bin/python}
[ -x "$PY" ] || PY=.venv/bin/python  # a dry run here
OUT=${OUT:-/tmp/spectune-batch}
W=${WORK:-/tmp/spectune-batch-work}
mkdir -p "$OUT" "$W/json"
log=$W/json/log.txt
M=${MODEL:-random:llama-3-8b}
# 32 prompts from the bundled questions (writing, roleplay, ... in file order: 10 per category)
C="--model $M --tp 1 --device ${DEVICE:-cuda} --num-prompts ${NUM_PROMPTS:-32} --max-new-tokens ${MAX_NEW:-64} --json"
for B in ${SIZES:-1 4 16 32}; do
  for k in ${KS:-2 4}; do
    # each run: plain at batch 1 (the reference), plain at B, and k drafts at B accepting tau - 1 = 2 per step
    echo "=== b${B}_k${k}: decode $C --drafter ngram -k $k --simulate-accept-len 3 --batch-size $B" >> "$log"
    timeout -k 10 300 $PY -m orchestrator decode $C --drafter ngram -k "$k" --simulate-accept-len 3 --batch-size "$B" \
      > "$W/json/b${B}_k${k}.json" 2>> "$log" || echo "!!! b${B}_k${k} failed (rc=$?)" >> "$log"
  done
done
$PY - "$W/json" "$M" > "$W/json/table.txt" 2>> "$log" <<'PYEOF'
"""tok/s per batch size, the HBM roofline fraction of plain decoding, and where speculation stops paying."""
import json, pathlib, sys, torch
from workers.model.checkpoint import load_args, resolve_model_path
d, a = pathlib.Path(sys.argv[1]), load_args(resolve_model_path(sys.argv[2]))
dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.empty(1 << 28, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
import time
for _ in range(3): y.copy_(x)
sync(); t0 = time.perf_counter()
for _ in range(20): y.copy_(x)
sync(); bw = 2 * 20 * x.numel() / (time.perf_counter() - t0)  # bytes read + written per second
layer = a.dim * a.head_dim * (a.n_heads + 2 * a.n_kv_heads) + a.n_heads * a.head_dim * a.dim + 3 * a.dim * a.intermediate_size
weights = 2 * (a.vocab_size * a.dim * (1 if a.tie_embeddings else 2) + a.n_layers * layer)  # bf16
kv_per_token = a.n_layers * 2 * a.n_kv_heads * a.head_dim * 2
print(f"copy bandwidth {bw / 1e12:.2f} TB/s, weights {weights / 1e9:.2f} GB, KV {kv_per_token / 1024:.0f} KiB per token")
print("B   k  plain tok/s  roofline  spec tok/s  speedup")
for f in sorted(d.glob("b*_k*.json"), key=lambda p: (int(p.stem[1:].split("_k")[0]), p.stem)):
    try:
        r = json.loads(f.read_text())
    except ValueError:
        continue
    B, k = int(f.stem[1:].split("_k")[0]), int(f.stem.split("_k")[1])
    plain = r.get("baseline_decode_tok_s")
    ctx = r["prompt_tokens_mean"] + r["params"]["workload.max_new_tokens"] / 2  # mean context a step attends to
    roof = (weights + B * ctx * kv_per_token) / bw  # seconds of one plain step at the copy bandwidth
    frac = roof / (B / plain) if plain else float("nan")
    spec, up = r.get("decode_tok_s", float("nan")), r.get("decode_speedup_vs_baseline", float("nan"))
    print(f"{B:<4}{k:<3}{plain or float('nan'):>11.1f}{frac:>10.0%}{spec:>12.1f}{up:>9.2f}{'   speculation loses' if up < 1 else ''}")
PYEOF
tar -C "$W/json" -cf "$OUT/batch.tar" .
