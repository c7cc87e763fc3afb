#!/usr/bin/env bash
# The CPU landscape of docs/search.md: five grid studies (one per drafter variant, variant-*.yaml) into
# one Optuna and one MLflow store here; then bench-search over the pooled record (landscape-cpu.yaml's space).
# Run from the repository root: bash results/2026-12-05/landscape-cpu/commands.sh
set -euo pipefail
R=results/2026-12-05/landscape-cpu
export SPECTUNE_HOME=${SPECTUNE_HOME:-/tmp/landscape-cpu-home} RAY_AUTH_MODE=disabled
STORE=(--set "study.storage=sqlite:///$R/optuna.db" --set "tracking.uri=sqlite:///$R/mlflow.db")
for v in ngram skip8 skip16 eagle3-actor eagle3-rank0; do
  echo "== variant $v $(date +%T)"
  .venv/bin/spectune run $R/variant-$v.yaml "${STORE[@]}"
done
echo "== done $(date +%T)"
