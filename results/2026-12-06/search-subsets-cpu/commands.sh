#!/usr/bin/env bash
# Robustness of the `model` sampler's lead (issue 32): bench-search at budget 6 on the H100 SmolLM2 landscape
# (results/2026-12-05/landscape-smollm2-h100/, 37 configurations) and on each of its 7 subsets that leave one
# drafter variant's study out (25-31 configurations); 20 seeds each; budget6.txt is this script's output.
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-05/landscape-smollm2-h100
[ -f $R/optuna.db ] || tar -C $R -xzf $R/records.tar.gz
V="ngram skip8 eagle3-rank0 eagle3-rank0-lookup3 eagle3-rank0-tree4-lookup3 eagle3-actor ngram-gemv-off"
for drop in none $V; do
  S=$(for v in $V; do [ $v != $drop ] && echo -n "landscape-gpu-$v,"; done)
  echo "== drop $drop"
  .venv/bin/spectune bench-search experiments/h200-1gpu-smollm2.yaml --storage sqlite:///$R/optuna.db --tracking sqlite:///$R/mlflow.db \
    --studies ${S%,} --budget 6 --json 2>&1 | tail -1
done
