#!/usr/bin/env bash
# The GPU landscape of docs/search.md, on the device machine after `infra/device-setup.sh ray rest check`
# and the demo model's two calls (docs/gpu.md): one grid study per drafter variant given (variant-<name>.yaml),
# all into one Optuna and one MLflow store in $WORK (kept between back-to-back calls), copied to $OUT.
#   OUT=$OUT bash results/2026-12-05/landscape-smollm2-h100/run.sh ngram skip8 ...
set -uo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-05/landscape-smollm2-h100
WORK=${WORK:-/tmp/landscape-gpu}
VENV=${SPECTUNE_VENV:-/tmp/spectune-venv}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f "$VENV/spectune.env" ] && . "$VENV/spectune.env"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export SPECTUNE_HOME=$WORK/home SPECTUNE_RAY_TMPDIR=$WORK/ray
PY=${PYTHON:-$( [ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || echo python3 )}
mkdir -p "$WORK/home" "${OUT:=/tmp/landscape-gpu-out}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$OUT/log.txt" 2>&1
for v in "$@"; do
  echo "== variant $v $(date +%T)" >> "$OUT/log.txt"
  timeout "${STUDY_TIMEOUT_S:-280}" "$PY" -m orchestrator run "$R/variant-$v.yaml" \
    --set "study.storage=sqlite:///$WORK/optuna.db" --set "tracking.uri=sqlite:///$WORK/mlflow.db" >> "$OUT/log.txt" 2>&1
  echo "== variant $v rc=$? $(date +%T)" >> "$OUT/log.txt"
done
cp "$WORK/optuna.db" "$WORK/mlflow.db" "$OUT/" 2>/dev/null
exit 0
