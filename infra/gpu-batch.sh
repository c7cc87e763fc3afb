#!/usr/bin/env bash
# Batch > 1 on one GPU (docs/batching.md): the Llama-3-8B shape (random bf16 weights), 32 bundled
# prompts x 64 new tokens, at B = 1, 4, 16, 32: simulated acceptance tau = 3 (k = 2, 4), each run
# also decoding plainly at B and at batch 1 (the reference every sequence is checked against); k = 0
# in KS runs plain decoding alone (at B and at batch 1). Then one table: throughput with the prefill
# and decode tok/s, plain decoding's fraction of the HBM roofline (weights + the KV bytes a step
# reads, over the measured copy bandwidth), the time outside decode steps (the prefills) and its
# fraction of the measured bf16 matmul rate, and speculation's decode speedup. Runs THERE after
# `infra/device-setup.sh rest` (docs/gpu.md), or with pydantic on PYTHONPATH (`spectune decode` needs
# no Ray, Optuna or MLflow: results/2026-12-05/batch-prefill-h100/commands.sh); everything comes back in
# $OUT/batch.tar.
#
#   OUT=$OUT bash infra/gpu-batch.sh                     # SIZES="1 4 16 32" KS="2 4" override the grid (k = 0: plain only)
#   OUT=$OUT BEFORE=.devcarry/old SIZES=32 KS=0 bash infra/gpu-batch.sh
#       # BEFORE: also every run with the code in that folder (`git archive` of an earlier commit), each run first
#   OUT=$OUT DRAFTER=eagle3 SIZES="1 8" KS=4 bash infra/gpu-batch.sh
#       # EAGLE-3 instead of n-gram drafting (issue 33 item 3): a random head of the model's shape
#       # (32000-token draft vocabulary, written once to $WORK/head) at placement rank0, tau = 3; at B = 8
#       # every row's chain is one head pass per depth (one CUDA graph per (rows, k)); each run's JSON has
#       # the EAGLE-3 decode rate at B (decode_tok_s), plain decoding's at B (baseline_decode_tok_s) and at
#       # batch 1 (batch1_baseline_decode_tok_s), and their ratio (decode_speedup_vs_baseline)
#   MODEL=smollm2-135m DEVICE=cpu SIZES="1 2" KS="0 2" NUM_PROMPTS=2 MAX_NEW=8 bash infra/gpu-batch.sh   # a CPU dry run
#
# PYTHON: the interpreter (default /tmp/spectune-venv/bin/python, made by infra/device-setup.sh; here .venv).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f /tmp/spectune-venv/spectune.env ] && . /tmp/spectune-venv/spectune.env
PY=${PYTHON:-/tmp/spectune-venv/bin/python}
command -v "$PY" > /dev/null || PY=.venv/bin/python  # a dry run here
case $PY in */*) PY=$(realpath -s "$PY") ;; esac      # runs with BEFORE's code start in its folder
OUT=${OUT:-/tmp/spectune-batch}
W=${WORK:-/tmp/spectune-batch-work}
mkdir -p "$OUT" "$W/json"
log=$W/json/log.txt
M=${MODEL:-random:llama-3-8b}
# 32 prompts from the bundled questions (writing, roleplay, ... in file order: 10 per category)
C="--model $M --tp 1 --device ${DEVICE:-cuda} --num-prompts ${NUM_PROMPTS:-32} --max-new-tokens ${MAX_NEW:-64} --json"

SPEC="--drafter ngram"
if [ "${DRAFTER:-ngram}" = eagle3 ]; then
  [ -f "$W/head/config.json" ] || $PY -m workers.drafters.eagle3.checkpoint --target "$M" --draft-vocab 32000 --out "$W/head" >> "$log" 2>&1 \
    || echo "!!! the random EAGLE-3 head was not written" >> "$log"
  SPEC="--drafter eagle3 --draft-model $W/head --draft-placement rank0"
fi

decode() {  # name, code folder (. = this checkout), decode flags
  local name=$1 code=$2
  shift 2
  echo "=== $name ($code): decode $C $*" >> "$log"
  (cd "$code" && PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 300 $PY -m orchestrator decode $C "$@") \
    > "$W/json/$name.json" 2>> "$log" || echo "!!! $name failed (rc=$?)" >> "$log"
}

for B in ${SIZES:-1 4 16 32}; do
  for k in ${KS:-2 4}; do
    if [ "$k" = 0 ]; then
      [ -n "${BEFORE:-}" ] && decode "before_b${B}_k0" "$BEFORE" --drafter none -k 0 --batch-size "$B"
      decode "b${B}_k0" . --drafter none -k 0 --batch-size "$B"
    else  # plain at batch 1 (the reference), plain at B, and k drafts at B accepting tau - 1 = 2 per step
      [ -n "${BEFORE:-}" ] && decode "before_b${B}_k${k}" "$BEFORE" $SPEC -k "$k" --simulate-accept-len 3 --batch-size "$B"
      decode "b${B}_k${k}" . $SPEC -k "$k" --simulate-accept-len 3 --batch-size "$B"
    fi
  done
done
$PY - "$W/json" "$M" > "$W/json/table.txt" 2>> "$log" <<'PYEOF'
"""Per run: tok/s with and without the prefill, the HBM roofline fraction of plain decoding, the batched prefill's matmul rate."""
import json, pathlib, sys, time, torch
from workers.model.checkpoint import load_args, resolve_model_path
d, a = pathlib.Path(sys.argv[1]), load_args(resolve_model_path(sys.argv[2]))
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
def timed(f, n):
    for _ in range(3): f()
    sync(); t0 = time.perf_counter()
    for _ in range(n): f()
    sync(); return (time.perf_counter() - t0) / n
x = torch.empty(1 << 28, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
bw = 2 * x.numel() / timed(lambda: y.copy_(x), 20)  # bytes read + written per second
del x, y
n = 8192 if dev == "cuda" else 1024
p, q = (torch.randn(n, n, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32) for _ in range(2))
peak = 2 * n**3 / timed(lambda: p @ q, 10)  # the matmul rate on random data
layer = a.dim * a.head_dim * (a.n_heads + 2 * a.n_kv_heads) + a.n_heads * a.head_dim * a.dim + 3 * a.dim * a.intermediate_size
weights = 2 * (a.vocab_size * a.dim * (1 if a.tie_embeddings else 2) + a.n_layers * layer)  # bf16
kv_per_token = a.n_layers * 2 * a.n_kv_heads * a.head_dim * 2
print(f"copy bandwidth {bw / 1e12:.2f} TB/s, matmul {peak / 1e12:.0f} TFLOP/s, weights {weights / 1e9:.2f} GB, KV {kv_per_token / 1024:.0f} KiB per token")
print("thr: generated tokens over wall time, prefills included; dec: over decode steps only; roofline: plain decode against")
print("weights + KV read per step at the copy bandwidth; prefill: wall time outside decode steps (the prefills, first tokens),")
print("and its matmul rate (2 x tokens x layer weights + the head at each prompt's last token; attention left out) over the matmul's;")
print("each run's batch-1 reference on the row below it (b1)")
print("run                B   k   thr tok/s  dec tok/s  roofline  prefill s  of matmul  match  spec dec  speedup")
runs = []
for f in d.glob("*.json"):
    try:
        r = json.loads(f.read_text())
    except ValueError:
        continue
    runs.append((r["params"]["workload.batch_size"], f.stem, r))
for B, name, r in sorted(runs, key=lambda x: (x[0], x[1])):
    k, tokens, n = r["params"]["spec.num_draft_tokens"], r["tokens_generated"], r["params"]["workload.num_prompts"]
    ctx = r["prompt_tokens_mean"] + r["params"]["workload.max_new_tokens"] / 2  # mean context a step attends to
    flops = 2 * n * r["prompt_tokens_mean"] * a.n_layers * layer + 2 * n * a.vocab_size * a.dim
    rows = [(name, B, r["throughput_tok_s"] if k == 0 else r.get("baseline_throughput_tok_s"), r.get("decode_tok_s") if k == 0 else r.get("baseline_decode_tok_s"),
             r.get("plain_batch_outputs_match_batch1", "-"))]
    if B > 1:
        rows.append(("  b1", 1, r.get("batch1_baseline_throughput_tok_s"), r.get("batch1_baseline_decode_tok_s"), "-"))
    for i, (label, b, thr, dec, match) in enumerate(rows):
        if not thr or not dec:
            print(f"{label:<18} {b:<4}{k:<3} (no plain figures)")
            continue
        frac = (weights + b * ctx * kv_per_token) / bw / (b / dec)  # one plain step at the copy bandwidth over the measured one
        pre = tokens / thr - tokens / dec
        spec, up = (r.get("decode_tok_s", float("nan")), r.get("decode_speedup_vs_baseline", float("nan"))) if k and not i else (float("nan"),) * 2
        print(f"{label:<18} {b:<4}{k:<3}{thr:>11.1f}{dec:>11.1f}{frac:>10.0%}{pre:>11.3f}{flops / pre / peak:>11.0%}{match!s:>7}{spec:>10.1f}{up:>9.2f}")
PYEOF
cat "$W/json/table.txt"
tar -C "$W/json" -cf "$OUT/batch.tar" .
