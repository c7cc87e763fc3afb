#!/usr/bin/env bash
# The headline GPU figures (docs/performance.md#headline-figures), on a machine with 2 NVIDIA GPUs and PyTorch (no Ray/Optuna/MLflow
# needed: this drives workers/ directly through `python -m orchestrator`). Writes JSON to $OUT.
#
#   OUT=/tmp/gpu bash infra/gpu-measure.sh selftest # the Triton attention (and rope + cache write) against SDPA
#   OUT=/tmp/gpu bash infra/gpu-measure.sh smoke   # a minute: every code path on a 2-layer model
#   OUT=/tmp/gpu bash infra/gpu-measure.sh bench   # allreduce latency: nccl (3 environments) and symm_mem
#   OUT=/tmp/gpu bash infra/gpu-measure.sh gemv    # step GEMMs: cuBLAS against the Triton GEMV configs (workers/kernels/gemv.py)
#   OUT=/tmp/gpu bash infra/gpu-measure.sh full    # decode figures (Llama-3-8B shape, random bf16 weights) = tp1 tp2 sim
#   OUT=/tmp/gpu bash infra/gpu-measure.sh tp1     # TP 1 and transformers' generate
#   OUT=/tmp/gpu bash infra/gpu-measure.sh tp2     # TP 2, one run per allreduce backend
#   OUT=/tmp/gpu bash infra/gpu-measure.sh sim     # TP 2, simulated tau = 3, k = 4: n-gram (in the ranks, and as
#                                                  # its own process) and draft-model drafters
#   OUT=/tmp/gpu bash infra/gpu-measure.sh profile # one step: replay times and kernel tables, TP 1 and TP 2 (profile2: TP 2 only)
#   OUT=/tmp/gpu bash infra/gpu-measure.sh ray     # the gang as Ray GPU actors (`decode --ray`); needs Ray: pack it with
#       ../shared/tools/ray-for-device.sh .devcarry here and carry .devcarry (this script unpacks it)
#   single runs: tp1 tp2_symm_ll tp2_symm_ll_unfused tp1_cublas tp2_symm_ll_cublas tp2_nccl tp2_symm sim_ngram sim_ngram_actor sim_draft
#       ray_tp2_nccl ray_tp2_ll_ngram ray_tp2_draft (`bash infra/gpu-measure.sh selftest tp1 tp2_symm_ll`)
# Several modes run in order: `bash infra/gpu-measure.sh smoke profile bench`. Each run is cut off
# after $LIMIT seconds (default 240; the draft-model run gets 120 more for transformers' assisted
# generation), so a hang costs minutes, not the whole machine time. Engine comparisons are `decode`
# flags (the YAML section `engine:`), never environment variables.
set -uo pipefail
cd "$(dirname "$0")/.."
modes=("${@:-full}")
OUT=${OUT:-/tmp/spectune-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
S="$PY -m orchestrator"
run() {  # name, command...: JSON to $OUT/name.json, log to $OUT/log.txt
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$OUT/log.txt"
  local t0=$SECONDS
  timeout -k 10 "${LIMIT:-240}" "$@" > "$OUT/$name.json" 2>> "$OUT/log.txt" || echo "!!! $name failed (rc=$?)" | tee -a "$OUT/log.txt"
  echo "--- $name took $((SECONDS - t0)) s" | tee -a "$OUT/log.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/log.txt"
$PY - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, time
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())
if torch.cuda.device_count() > 1:
    print("p2p 0<->1:", torch.cuda.can_device_access_peer(0, 1))
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"copy bandwidth (read+write): {2 * x.numel() / dt / 1e12:.2f} TB/s")
PY

common="--drafter none -k 0 --device cuda --category writing --json"
sim="--drafter ngram -k 4 --simulate-accept-len 3 --device cuda --category writing --json"
M=random:llama-3-8b
P="--num-prompts 4 --max-new-tokens 128"
selftest() {
  echo "=== decode_attention selftest" | tee -a "$OUT/log.txt"
  timeout 120 $PY -m workers.checks.attention_check --selftest 2>&1 | tee -a "$OUT/log.txt"
  echo "=== gemv selftest" | tee -a "$OUT/log.txt"
  timeout 120 $PY -m workers.kernels.gemv --selftest --device cuda 2>&1 | tee -a "$OUT/log.txt"
}
smoke() {
  local M=random:llama-3-8b:layers=2 P="--num-prompts 1 --max-new-tokens 16"
  selftest
  run bench_smoke $S bench-allreduce --device cuda --tp 2 --backend nccl symm_mem symm_mem_ll --sizes 16K,256K --iters 50 --json
  run smoke_tp1 $S decode --model $M --tp 1 $common $P --peer-baseline
  run smoke_tp2_nccl $S decode --model $M --tp 2 --backend nccl --vocab-parallel $common $P
  run smoke_tp2_ll $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $common $P
  run smoke_tp2_symm $S decode --model $M --tp 2 --backend symm_mem --vocab-parallel $sim $P
  run smoke_draft $S decode --model $M --tp 2 --backend symm_mem --vocab-parallel $sim $P --drafter draft_model \
      --draft-model random:llama-3.2-1b:layers=2
}
ray_setup() {
  if ! $PY -c 'import ray' 2>/dev/null; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .devcarry/ray.tar.xz &&
      $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/*.whl
    export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  export RAY_AUTH_MODE=disabled
}
RP="--num-prompts 2 --max-new-tokens 64"
r_ray_tp2_nccl() { ray_setup; run ray_tp2_nccl $S decode --ray --model $M --tp 2 --backend nccl --vocab-parallel $common $RP; }
r_ray_tp2_ll_ngram() { ray_setup; run ray_tp2_ll_ngram $S decode --ray --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $sim $RP; }
r_ray_tp2_draft() { ray_setup; run ray_tp2_draft $S decode --ray --model $M --tp 2 --backend nccl --vocab-parallel $sim $RP --drafter draft_model \
      --draft-model random:llama-3.2-1b; }
ray_mode() { r_ray_tp2_nccl; r_ray_tp2_ll_ngram; r_ray_tp2_draft; }
profile() {
  timeout 300 $PY -m scripts.profile_step --model $M --widths 1 5 --max-seq 512 --attention triton --top 15 \
      --json "$OUT/profile.json" 2>&1 | grep --line-buffered -v Warn | tee -a "$OUT/log.txt"
  profile2
}
profile2() {
  # one backend, one width: model load + compile of both graph sets per backend took > 300 s for two
  timeout 300 $PY -m scripts.profile_step --model $M --tp 2 --backend symm_mem_ll --widths 1 --max-seq 512 --top 20 \
      --json "$OUT/profile_tp2.json" 2>&1 | grep --line-buffered -v Warn | tee -a "$OUT/log.txt"
}
gemv() {  # cuBLAS against each Triton GEMV config on the model's step GEMMs at TP 1 and 2 (no gang needed)
  echo "=== gemv bench" | tee -a "$OUT/log.txt"
  timeout "${LIMIT:-240}" $PY -m workers.kernels.gemv --bench --model llama-3-8b --tp 1 2 --widths 1 5 --json "$OUT/gemv_bench.json" 2>&1 |
    grep --line-buffered -v Warn | tee -a "$OUT/log.txt"
}
bench() {
  run bench $S bench-allreduce --device cuda --tp 2 --backend nccl symm_mem symm_mem_ll --nccl-env "" --nccl-env NCCL_PROTO=LL \
      --nccl-env NCCL_P2P_DISABLE=1 --sizes 8K,16K,32K,64K,128K,256K,512K,1M,4M --json
}
# single runs (each is also a mode of its own: `bash infra/gpu-measure.sh tp1 sim_ngram`)
r_tp1() { run tp1 $S decode --model $M --tp 1 $common $P --peer-baseline; }
r_tp2_symm_ll() { run tp2_symm_ll $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $common $P; }
r_tp2_nccl() { run tp2_nccl $S decode --model $M --tp 2 --backend nccl --vocab-parallel $common $P; }
r_tp2_symm_ll_unfused() { run tp2_symm_ll_unfused $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $common $P --no-fused-add-norm; }
# side by side: workers/kernels/gemv.py's picker off (engine.gemv=off: the GEMMs inside the compiled bodies)
r_tp1_cublas() { run tp1_cublas $S decode --model $M --tp 1 $common $P --gemv off; }
r_tp2_symm_ll_cublas() { run tp2_symm_ll_cublas $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $common $P --gemv off; }
r_tp2_symm() { run tp2_symm $S decode --model $M --tp 2 --backend symm_mem --vocab-parallel $common $P; }
# simulated acceptance on the fastest backend of `tp2`
r_sim_ngram() { run sim_ngram $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $sim $P; }
r_sim_ngram_actor() { run sim_ngram_actor $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $sim $P --ngram-actor; }
r_sim_draft() { LIMIT=$((${LIMIT:-240} + 120)) run sim_draft $S decode --model $M --tp 2 --backend symm_mem_ll --vocab-parallel $sim $P --peer-baseline --drafter draft_model \
    --draft-model random:llama-3.2-1b; }
tp1() { r_tp1; }
tp2() { r_tp2_symm_ll; r_tp2_nccl; r_tp2_symm; }
sim() { r_sim_ngram; r_sim_ngram_actor; r_sim_draft; }
for mode in "${modes[@]}"; do
  case $mode in
    selftest|smoke|profile|profile2|bench|gemv|tp1|tp2|sim) $mode ;;
    ray) ray_mode ;;
    full) tp1; tp2; sim ;;
    *) if declare -F "r_$mode" >/dev/null; then "r_$mode"; continue; fi
       echo "unknown mode $mode (selftest smoke profile profile2 bench gemv tp1 tp2 sim full ray)"; exit 2 ;;
  esac
done
$PY - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        d = json.loads(f.read_text().strip().splitlines()[-1])
    except Exception as e:
        print(f.name, "unreadable", e); continue
    if isinstance(d, list) and d and "role" in d[0]:  # gemv_bench: the log has the summary lines
        continue
    if isinstance(d, list):
        for r in d:
            print(f"{f.stem:>12} {r['backend']:>9} {r['env'][:22]:>22} {r['mode']:>5} {r['size_bytes']:>8} {r['time_us']:8.2f} us")
    else:
        keys = ["throughput_tok_s", "decode_tok_s", "baseline_throughput_tok_s", "baseline_decode_tok_s", "speedup_vs_baseline", "decode_speedup_vs_baseline", "prefill_ms", "accept_len_mean", "step_ms_p50", "prefill_ms_mean",
                "verify_ms_p50", "draft_ms_p50", "compute_ms_per_step", "comm_ms_per_step", "comm_fraction", "hf_generate_tok_s", "baseline_vs_hf_generate", "hf_assisted_tok_s"]
        print(f.stem, {k: (round(d[k], 3) if isinstance(d[k], float) else d[k]) for k in keys if k in d})
PY
