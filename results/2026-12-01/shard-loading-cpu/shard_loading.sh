#!/usr/bin/env bash
# Peak resident memory of each verifier rank when loading a ~1.3 GB checkpoint at TP 1 and TP 4
# (CPU, gloo, bf16, a few tokens): a rank reads only its part (workers/model/checkpoint.py).
# Target: the largest rank at TP 4 <= 0.5 x the rank at TP 1. Run from the repository root:
#   bash results/2026-12-01/shard-loading-cpu/shard_loading.sh > results/2026-12-01/shard-loading-cpu/shard_loading.json
set -euo pipefail
PY=${PYTHON:-python}
CKPT=${CKPT:-/tmp/spectune-llama-10x2048-mha-bf16}
# a 10-layer, hidden-2048 Llama (intermediate 8192, 16 heads of 128, tiny_config's vocabulary of 512) in bf16: 1.34 GB
$PY - "$CKPT" >&2 <<'PYEOF'
import sys, torch
from pathlib import Path
from workers.model.checkpoint import tiny_config, write_random_checkpoint
out = Path(sys.argv[1])
if not (out / "model.safetensors").is_file():
    cfg = tiny_config(hidden_size=2048, intermediate_size=8192, num_hidden_layers=10, num_attention_heads=16,
                      num_key_value_heads=16, head_dim=128, torch_dtype="bfloat16")
    write_random_checkpoint(out, cfg, seed=0, dtype=torch.bfloat16)
print(f"checkpoint {out}: {(out / 'model.safetensors').stat().st_size / 1e9:.2f} GB", file=sys.stderr)
PYEOF
run() {  # tp -> the decode JSON
  $PY -m orchestrator decode --model "$CKPT" --tp "$1" --dtype bfloat16 --drafter none -k 0 \
      --num-prompts 1 --max-new-tokens 4 --json
}
TP1=$(run 1)
TP4=$(run 4)
$PY - "$TP1" "$TP4" "$CKPT" <<'PYEOF'
import json, sys
from pathlib import Path
tp1, tp4 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
size = (Path(sys.argv[3]) / "model.safetensors").stat().st_size
r1, r4 = tp1["rank_peak_rss_mb"], tp4["rank_peak_rss_mb"]
print(json.dumps({
    "command": "bash results/2026-12-01/shard-loading-cpu/shard_loading.sh",
    "checkpoint_bytes": size,
    "tp1_rank_peak_rss_mb": r1, "tp4_rank_peak_rss_mb": r4,
    "ratio_max_tp4_over_tp1": max(r4) / max(r1), "target": "<= 0.5",
    "tp1_decode": tp1, "tp4_decode": tp4,
}, indent=1))
PYEOF
