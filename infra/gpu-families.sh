#!/usr/bin/env bash
# The model families' GPU figures in one device call (a lent single GPU; only pydantic beyond the image):
# the kernel tests, verify-pass time against width for the dense and MoE Qwen3 shapes (with the distinct
# experts each pass reads and its roofline), plain decoding of each shape, and the TP 1 Llama-3-8B-shape
# decode of this tree beside an earlier commit's (the check that the GPU path did not slow down).
#
# Here, once:   bash infra/device-pack.sh --pyd
#               rm -rf .devcarry/before && mkdir -p .devcarry/before && git archive <commit> workers orchestrator scripts | tar -x -C .devcarry/before
# There:        carry [".devcarry/pyd", ".devcarry/before"]
#               OUT=$OUT bash infra/gpu-families.sh [stages]      # default: tests widths decode before
# To measure exactly a commit while the checkout has uncommitted work, carry its snapshot too:
#   here:  git archive HEAD workers orchestrator scripts tests infra pyproject.toml | tar -x -C .devcarry/now
#   there: mkdir -p .devcarry/now/.devcarry && cp -r .devcarry/pyd .devcarry/before .devcarry/now/.devcarry/ &&
#          cd .devcarry/now && OUT=$OUT bash infra/gpu-families.sh ...
#
# Stages: tests (kernel and family tests on the GPU), kernels (the grouped MoE kernel's configurations
# on a Qwen3-30B-A3B layer, workers/kernels/moe.py --bench), widths (scripts/verify_widths.py), decode (spectune
# decode, plain, of random:qwen3-8b and random:qwen3-30b-a3b:layers=$MOE_LAYERS), before (TP 1
# random:llama-3-8b with .devcarry/before, then this tree, back to back on the same card), emulated (issue 46's
# zero-table check: TP 1 random:llama-3-8b plain, then --emulate-tp 1 with .devcarry/zero/zero.json, an
# all-zero table, then plain again; and the simulated-acceptance path at k = 3: --simulate-accept-len 2.5
# and --simulate-accept-profile 0.8,0.6,0.4). Here: python -m scripts.make_allreduce_presets --zero .devcarry/zero/zero.json.
# moe (issue 44's width-1 step): the Qwen3-30B-A3B shape's verify pass at widths 1, 5, 9 with .devcarry/before's
# code then this tree's, and this tree's width-1 kernel table (scripts/profile_step.py).
# deepseek and mtp (issue 45): random:deepseek-v3:layers=$DS_LAYERS (default 4: the 3 dense layers and one
# MoE layer, ~30 GB of bf16; ~53 GB with the MTP layer, itself an MoE block: 5 layers and MTP would not fit
# an 80 GB card). deepseek: the verify pass against width on the absorbed cache with its roofline
# (scripts/verify_widths.py), with .devcarry/before's code first when carried, and the width-1 kernel table
# (scripts/profile_step.py). mtp: plain decoding on each latent-attention cache (--mla expanded, then
# absorbed, back to back), then the MTP drafter (the checkpoint's own MTP layer; .devcarry/before's first when
# carried) at k = 3 on the absorbed
# cache at an imposed acceptance profile (random MTP weights accept next to nothing: the engine's cost is
# what is timed).
# Each run is cut off after $LIMIT seconds (default 240); WIDTHS (default 1..9) are the widths timed. Everything lands in $OUT: log.txt and a JSON per run.
set -uo pipefail
cd "$(dirname "$0")/.."
stages=("${@:-tests kernels widths decode before}")
stages=(${stages[@]})
OUT=${OUT:-/tmp/spectune-families}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
bash infra/device-setup.sh pyd >> "$OUT/log.txt" 2>&1 || { echo "device-setup pyd failed" | tee -a "$OUT/log.txt"; exit 1; }
PY=${SPECTUNE_VENV:-/tmp/spectune-venv}/bin/python
MOE_LAYERS=${MOE_LAYERS:-24}
DS_LAYERS=${DS_LAYERS:-4}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
# the code measured, by content (the device's copy of the tree may carry a stale .git): compare with
# the same line run here on a checkout
echo "code sha256 $(find workers orchestrator scripts -name '*.py' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)" | tee -a "$OUT/log.txt"

run() {  # name, dir, command...: stdout to $OUT/name.json, stderr to log.txt
  local name=$1 dir=$2; shift 2
  echo "=== $name ($dir): $*" | tee -a "$OUT/log.txt"
  local t0=$SECONDS
  (cd "$dir" && PYTHONPATH=$PWD timeout -k 10 "${LIMIT:-240}" "$@") > "$OUT/$name.json" 2>> "$OUT/log.txt" \
    || { echo "!!! $name failed (rc=$?)" | tee -a "$OUT/log.txt"; failed+=("$name"); }
  echo "--- $name took $((SECONDS - t0)) s" | tee -a "$OUT/log.txt"
}

widths_then_profile() {  # name, model, widths, attention, top: the verify pass at those widths with
  # .devcarry/before's code (when carried) and this tree's, back to back, then this tree's width-1 kernel
  # table (scripts/profile_step.py; the table in log.txt, its JSON in NAME_profile.json)
  local name=$1 model=$2 widths=$3 attention=$4 top=$5
  local w="-m scripts.verify_widths --model $model --widths $widths --json -"
  [ -d .devcarry/before ] && run "${name}_widths_before" .devcarry/before $PY $w
  run "${name}_widths" . $PY $w
  echo "=== ${name}_profile: scripts.profile_step" | tee -a "$OUT/log.txt"
  (PYTHONPATH=$PWD timeout -k 10 "${LIMIT:-240}" $PY -m scripts.profile_step --model "$model" --widths 1 --attention "$attention" \
    --top "$top" --max-seq 512 --json "$OUT/${name}_profile.json") >> "$OUT/log.txt" 2>&1 \
    || { echo "!!! ${name}_profile failed (rc=$?)" | tee -a "$OUT/log.txt"; failed+=("${name}_profile"); }
}
failed=()  # the runs that failed: the script's exit status says so (gpu-call.sh reports it)
decode() { echo "-m orchestrator decode --model $1 --tp 1 --drafter none -k 0 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"; }

for stage in "${stages[@]}"; do
  case $stage in
    tests)
      run tests . $PY -m pytest -q -p no:cacheprovider tests/engine/test_families.py tests/engine/test_kernels_attention.py \
        tests/engine/test_kernels_gemv.py tests/engine/test_triton_kernels.py tests/engine/test_graph_safety.py \
        tests/engine/test_deepseek.py tests/engine/test_mtp.py -k "not tp2"
      tail -3 "$OUT/tests.json" | tee -a "$OUT/log.txt" ;;
    kernels)
      run moe_kernels . $PY -m workers.kernels.moe --bench
      grep -v '^\[' "$OUT/moe_kernels.json" ;;
    widths)
      run widths . $PY -m scripts.verify_widths --model random:qwen3-8b "random:qwen3-30b-a3b:layers=$MOE_LAYERS" \
        --widths ${WIDTHS:-1 2 3 4 5 6 7 8 9} --json "$OUT/widths_full.json"
      cat "$OUT/widths.json" ;;
    decode)
      run decode_qwen3_8b . $PY $(decode random:qwen3-8b)
      run decode_qwen3_30b_a3b . $PY $(decode "random:qwen3-30b-a3b:layers=$MOE_LAYERS") ;;
    before)
      [ -d .devcarry/before ] || { echo "!!! before: carry .devcarry/before (see the header)" | tee -a "$OUT/log.txt"; continue; }
      run llama_tp1_before .devcarry/before $PY $(decode random:llama-3-8b)
      run llama_tp1_after . $PY $(decode random:llama-3-8b) ;;
    emulated)
      [ -f .devcarry/zero/zero.json ] || { echo "!!! emulated: carry .devcarry/zero (see the header)" | tee -a "$OUT/log.txt"; continue; }
      run llama_tp1_plain_a . $PY $(decode random:llama-3-8b)
      run llama_tp1_zero_table . $PY $(decode random:llama-3-8b) --emulate-tp 1 --allreduce-table .devcarry/zero/zero.json
      run llama_tp1_plain_b . $PY $(decode random:llama-3-8b)
      run llama_tp1_k3_len . $PY $(decode random:llama-3-8b | sed 's/--drafter none -k 0/--drafter ngram -k 3/') --simulate-accept-len 2.5
      run llama_tp1_k3_profile . $PY $(decode random:llama-3-8b | sed 's/--drafter none -k 0/--drafter ngram -k 3/') --simulate-accept-profile 0.8,0.6,0.4 ;;
    moe)
      # the MoE step at widths 1, 5, 9 with .devcarry/before's code (when carried) and this tree's, back to back,
      # then where this tree's width-1 step spends its time (the kernel table lands in log.txt)
      widths_then_profile moe "random:qwen3-30b-a3b:layers=$MOE_LAYERS" "1 5 9" triton 45 ;;
    deepseek)
      # the verify pass against width on the absorbed cache with .devcarry/before's code (when carried) and this
      # tree's, back to back; then where this tree's width-1 step spends its time (the kernel table in log.txt)
      widths_then_profile deepseek "random:deepseek-v3:layers=$DS_LAYERS" "${WIDTHS:-1 2 3 4 5 6 7 8 9}" sdpa 40 ;;
    mtp)
      # plain decoding of the DeepSeek-V3 subset on each latent-attention cache, then the MTP drafter at k = 3
      ds="random:deepseek-v3:layers=$DS_LAYERS"
      run deepseek_expanded . $PY $(decode "$ds") --mla expanded
      run deepseek_absorbed . $PY $(decode "$ds") --mla absorbed
      mtp="$(decode "$ds" | sed 's/--drafter none -k 0/--drafter mtp -k 3/') --mla absorbed --simulate-accept-profile 0.8,0.6,0.4"
      [ -d .devcarry/before ] && run deepseek_mtp_k3_before .devcarry/before $PY $mtp
      run deepseek_mtp_k3 . $PY $mtp ;;
    *) echo "unknown stage $stage (tests | kernels | widths | decode | before | emulated | moe | deepseek | mtp)" >&2; exit 2 ;;
  esac
done
$PY - "$OUT" <<'PY' | tee -a "$OUT/log.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("decode_qwen3_8b", "decode_qwen3_30b_a3b", "llama_tp1_before", "llama_tp1_after", "llama_tp1_plain_a",
             "llama_tp1_zero_table", "llama_tp1_plain_b", "llama_tp1_k3_len", "llama_tp1_k3_profile",
             "deepseek_expanded", "deepseek_absorbed", "deepseek_mtp_k3_before", "deepseek_mtp_k3"):
    f = out / f"{name}.json"
    if not f.exists():  # not one of this call's runs (a run that failed leaves its empty file)
        continue
    try:
        d = json.loads(f.read_text())
        print(f"{name:22s} throughput {d['throughput_tok_s']:8.1f} tok/s  decode {d.get('decode_tok_s', 0):8.1f} tok/s  step p50 {d.get('step_ms_p50', 0):.3f} ms  accepted length {d.get('accept_len_mean', 1):.2f}")
    except Exception as e:  # noqa: BLE001 - a missing run is reported, not fatal
        print(f"{name:22s} (no result: {type(e).__name__})")
PY
[ ${#failed[@]} -eq 0 ] || { echo "failed runs: ${failed[*]}" | tee -a "$OUT/log.txt"; exit 1; }
