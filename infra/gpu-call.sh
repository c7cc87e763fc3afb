#!/usr/bin/env bash
# One device call, by named stages: the script every GPU measurement goes through (the call scripts kept
# under results/ are records of what ran before it). Two halves:
#
# HERE (any machine with pip), once per call: build what the stages need and print the `carry` list
#   bash infra/gpu-call.sh --plan tests tp1 emulated
#   bash infra/gpu-call.sh --plan study=experiments/tp8-pcie-emulated.yaml     # Ray + Optuna + MLflow: two calls
# THERE (the lent GPU), with that carry:
#   OUT=$OUT bash infra/gpu-call.sh tests tp1 emulated
#
# Setup there: every pack carried under .devcarry/ (ray, rest, pyd, model-?) goes into /tmp/spectune-venv
# (infra/device-setup.sh); Ray and the rest do not fit beside the working tree in one call (64 MiB), so a
# study takes a first call that carries .devcarry/ray (`setup` alone, or with decode stages and .devcarry/pyd)
# and a second, back to back while the machine is warm, that carries .devcarry/rest.
#
# Stages (each cut off after LIMIT seconds, default 300; everything lands in $OUT, at most 8 files):
#   setup            only the packs (the first call of a study)
#   tests            the kernel and family tests on the GPU (the check after any change to the GPU path)
#   tp1              TP 1 plain decode of random:llama-3-8b; with .devcarry/before (git archive of an earlier
#                    commit: workers orchestrator scripts) that commit's first, back to back
#   emulated         issue 46's zero-table check and the simulated-acceptance path (infra/gpu-families.sh)
#   families         MoE kernel configurations, verify widths, Qwen3 decodes (infra/gpu-families.sh)
#   moe              the MoE shape's widths 1, 5, 9 with .devcarry/before's code and this tree's, and its width-1 kernel table (infra/gpu-families.sh)
#   deepseek         the DeepSeek-V3 shape's verify widths (with .devcarry/before's code first) and width-1 kernel table (infra/gpu-families.sh)
#   mtp              the DeepSeek-V3 shape's plain decode on each latent-attention cache, then the MTP drafter at k = 3 (infra/gpu-families.sh)
#   batch            batch > 1 (infra/gpu-batch.sh, its SIZES / KS / DRAFTER)
#   study=YAML[,key=value...]   a whole study, no kill (infra/gpu-study.sh); its files come back as study-N.tgz
# Every stage's output is in $OUT/log.txt; the GPU, the code's content hash and each stage's time head it.
set -uo pipefail
cd "$(dirname "$0")/.."

needs() {  # the packs a stage needs: pyd (decode), rest (a study), zero (the zero table)
  case $1 in
    setup) echo "" ;;
    tests | tp1 | families | moe | deepseek | mtp | batch) echo pyd ;;
    emulated) echo "pyd zero" ;;
    study=*) echo "ray rest" ;;
    *) echo "gpu-call: unknown stage '$1' (setup | tests | tp1 | emulated | families | moe | deepseek | mtp | batch | study=YAML[,k=v...])" >&2; return 2 ;;
  esac
}

if [ "${1:-}" = "--plan" ]; then
  shift
  want=" "
  for s in "$@"; do w=$(needs "$s") || exit 2; for p in $w; do [[ $want == *" $p "* ]] || want+="$p "; done; done
  if [[ $want == *" ray "* ]]; then
    bash infra/device-pack.sh >&2 || exit 1
  elif [[ $want == *" pyd "* ]]; then
    bash infra/device-pack.sh --pyd >&2 || exit 1
  fi
  if [[ $want == *" zero "* ]] && [ ! -f .devcarry/zero/zero.json ]; then
    python3 -m scripts.make_allreduce_presets --zero .devcarry/zero/zero.json >&2 || exit 1
  fi
  decode=() study=()
  for s in "$@"; do case $s in study=*) study+=("$s") ;; setup) ;; *) decode+=("$s") ;; esac; done
  extra=""
  [[ $want == *" zero "* ]] && extra+=', ".devcarry/zero"'
  [ -d .devcarry/before ] && [[ " ${decode[*]} " =~ \ (tp1|moe|deepseek|mtp)\  ]] && extra+=', ".devcarry/before"'
  if [ ${#study[@]} -gt 0 ]; then
    echo "call 1: carry [\".devcarry/ray\", \".devcarry/pyd\"$extra]  command: OUT=\$OUT bash infra/gpu-call.sh setup ${decode[*]}"
    echo "call 2 (within 30 s): carry [\".devcarry/rest\"]  command: OUT=\$OUT bash infra/gpu-call.sh ${study[*]}"
  else
    echo "carry [\".devcarry/pyd\"$extra]  command: OUT=\$OUT bash infra/gpu-call.sh ${decode[*]}"
  fi
  exit 0
fi

OUT=${OUT:-/tmp/spectune-gpu-call}
mkdir -p "$OUT"
log=$OUT/log.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
VENV=${SPECTUNE_VENV:-/tmp/spectune-venv}
PY=$VENV/bin/python
say() { echo "gpu-call: $*" | tee -a "$log"; }
for s in "$@"; do needs "$s" > /dev/null || exit 2; done

packs=()
for p in ray rest pyd; do [ -d ".devcarry/$p" ] && packs+=("$p"); done
compgen -G ".devcarry/model-?" > /dev/null && packs+=(model)
if [ ${#packs[@]} -gt 0 ]; then
  bash infra/device-setup.sh "${packs[@]}" >> "$log" 2>&1 || { say "device-setup ${packs[*]} failed (tail of $log)"; tail -5 "$log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log"
# the code measured, by content (the device's copy of the tree may carry a stale .git): the same line here
say "code sha256 $(find workers orchestrator scripts -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12); stages: $*"

run() {  # name, dir, command...: stdout to $OUT/name.json, stderr to the log
  local name=$1 dir=$2; shift 2
  say "=== $name ($dir): $*"
  local t0=$SECONDS
  (cd "$dir" && PYTHONPATH=$PWD timeout -k 10 "${LIMIT:-300}" "$@") > "$OUT/$name.json" 2>> "$log" || say "!!! $name failed (rc=$?)"
  say "--- $name took $((SECONDS - t0)) s"
}
decode() { echo "-m orchestrator decode --model random:llama-3-8b --tp 1 --drafter none -k 0 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"; }

n_study=0
for stage in "$@"; do
  t0=$SECONDS
  case $stage in
    setup) [ -x "$PY" ] && "$PY" -c "import ray" 2>/dev/null && say "setup: ray in $VENV" ;;
    tp1)
      [ -d .devcarry/before ] && run tp1_before .devcarry/before "$PY" $(decode)
      run tp1 . "$PY" $(decode) ;;
    tests | emulated | families | moe | deepseek | mtp)
      sub=$(case $stage in families) echo "kernels widths decode" ;; *) echo "$stage" ;; esac)
      # its lines go to the call's output; it writes its own log.txt lines
      SPECTUNE_VENV=$VENV OUT=$OUT LIMIT=${LIMIT:-300} bash infra/gpu-families.sh $sub 2>&1 || say "!!! $stage failed" ;;
    batch)
      mkdir -p "$OUT/batch" && PYTHON=$PY OUT=$OUT/batch timeout -k 10 "${LIMIT:-300}" bash infra/gpu-batch.sh >> "$log" 2>&1 || say "!!! batch failed" ;;
    study=*)
      spec=${stage#study=}
      IFS=, read -r -a parts <<< "$spec"
      sets=()
      for kv in "${parts[@]:1}"; do sets+=(--set "$kv"); done
      n_study=$((n_study + 1))
      sout=/tmp/gpu-call-study-$n_study
      rm -rf "$sout"
      OUT=$sout WORK=/tmp/gpu-call-work-$n_study DEADLINE_S=${DEADLINE_S:-540} bash infra/gpu-study.sh "${parts[0]}" --no-kill "${sets[@]}" \
        >> "$log" 2>&1 || say "!!! study $spec: gpu-study.sh exit $?"
      tar -czf "$OUT/study-$n_study.tgz" -C "$sout" . && say "study $spec: $OUT/study-$n_study.tgz"
      grep -h "wins\|leads\|COMPLETE\|PRUNED\|FAIL" "$sout/log.txt" 2>/dev/null | tail -20 | tee -a "$log" ;;
  esac
  say "stage $stage: $((SECONDS - t0)) s"
done
"$PY" - "$OUT" <<'PY' | tee -a "$log"
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        d = json.loads(f.read_text())
        print(f"{f.stem:22s} throughput {d['throughput_tok_s']:8.1f} tok/s  decode {d.get('decode_tok_s', 0):8.1f} tok/s  "
              f"step p50 {d.get('step_ms_p50', 0):.3f} ms  accepted length {d.get('accept_len_mean', 1):.2f}")
    except Exception:  # noqa: BLE001 - not a decode result (the tests' output)
        pass
PY
# at most 8 files come back: every run's JSON in one archive beside the log
(cd "$OUT" && ls ./*.json > /dev/null 2>&1 && tar -czf runs.tgz ./*.json && rm -f ./*.json)
ls "$OUT" | tee -a "$log"
