#!/usr/bin/env bash
# The CPU landscape of results/2026-12-05/landscape-cpu/ measured again with each CPU trial's width profile
# (verify_ms_w<W>): the same five grid studies (one per drafter variant, that folder's variant-*.yaml) into
# one Optuna and one MLflow store here; then the model's error leaving each configuration out and
# bench-search over the pooled record. Run from the repository root:
#   bash results/2026-12-06/landscape-profiled-cpu/commands.sh
set -euo pipefail
R=results/2026-12-06/landscape-profiled-cpu
V=results/2026-12-05/landscape-cpu
export SPECTUNE_HOME=${SPECTUNE_HOME:-/tmp/landscape-cpu-profiled-home} RAY_AUTH_MODE=disabled
if [ "${BENCH_ONLY:-}" = "" ]; then
  rm -f $R/optuna.db $R/mlflow.db
  STORE=(--set "study.storage=sqlite:///$R/optuna.db" --set "tracking.uri=sqlite:///$R/mlflow.db")
  for v in ngram skip8 skip16 eagle3-actor eagle3-rank0; do
    echo "== variant $v $(date +%T)"
    .venv/bin/spectune run $V/variant-$v.yaml "${STORE[@]}"
  done
  echo "== done $(date +%T)"
  tar -C $R -czf $R/records.tar.gz optuna.db mlflow.db
fi
[ -f $R/optuna.db ] || tar -C $R -xzf $R/records.tar.gz
for b in 4 6 10; do
  .venv/bin/spectune bench-search $V/landscape-cpu.yaml --storage sqlite:///$R/optuna.db --tracking sqlite:///$R/mlflow.db \
    --studies landscape-cpu-ngram,landscape-cpu-skip8,landscape-cpu-skip16,landscape-cpu-eagle3-actor,landscape-cpu-eagle3-rank0 \
    --budget $b --seeds 20 --json > $R/bench-budget$b.json 2> $R/bench-budget$b.txt
done
