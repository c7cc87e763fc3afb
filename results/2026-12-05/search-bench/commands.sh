#!/usr/bin/env bash
# The tables of docs/search.md: `spectune bench-search` over the recorded landscapes (reads records only).
# Run from the repository root: bash results/2026-12-05/search-bench/commands.sh
set -euo pipefail
OUT=results/2026-12-05/search-bench
# the recorded Optuna and MLflow stores of each landscape travel as one archive (stores are not tracked as such)
for d in results/2026-12-05/landscape-*; do [ -f "$d/optuna.db" ] || tar xzf "$d/records.tar.gz" -C "$d"; done
bench() {  # name, then bench-search's arguments: one run per budget, the JSON on stdout, the table and
  # the leave-one-configuration-out lines on stderr
  local name=$1; shift
  for b in 4 6 10; do
    .venv/bin/spectune bench-search "$@" --budget $b --seeds 20 --json > $OUT/$name-budget$b.json 2> $OUT/$name-budget$b.txt
  done
}
# H100, SmolLM2-135M with its real drafters (seven studies, one gang each), in the space of experiments/h200-1gpu-smollm2.yaml
G=results/2026-12-05/landscape-smollm2-h100
GS=landscape-gpu-ngram,landscape-gpu-skip8,landscape-gpu-eagle3-rank0,landscape-gpu-eagle3-rank0-lookup3,landscape-gpu-eagle3-rank0-tree4-lookup3,landscape-gpu-eagle3-actor
bench gpu-smollm2 experiments/h200-1gpu-smollm2.yaml --storage sqlite:///$G/optuna.db --tracking sqlite:///$G/mlflow.db --studies $GS,landscape-gpu-ngram-gemv-off
bench gpu-smollm2-auto experiments/h200-1gpu-smollm2.yaml --storage sqlite:///$G/optuna.db --tracking sqlite:///$G/mlflow.db --studies $GS
# CPU, SmolLM2-135M at TP 2 (gloo), five studies, one gang each
C=results/2026-12-05/landscape-cpu
bench cpu $C/landscape-cpu.yaml --storage sqlite:///$C/optuna.db --tracking sqlite:///$C/mlflow.db \
  --studies landscape-cpu-ngram,landscape-cpu-skip8,landscape-cpu-skip16,landscape-cpu-eagle3-actor,landscape-cpu-eagle3-rank0
# H200, Llama-3-8B shape, simulated acceptance (the 2026-12-01 study of results/2026-12-01/study-kill-resume-h200/, its optuna.db from git history: 5100da9^)
H=results/2026-12-05/landscape-llama3-8b-h200
bench h200-1gpu experiments/h200-1gpu.yaml --storage sqlite:///$H/optuna.db --tracking sqlite:///$H/mlflow.db --studies h200-1gpu
# The model sampler inside a real study (the log: model-sampler-smoke.log, progress lines per prompt left out);
# BENCH_ONLY=1 stops before it
[ -n "${BENCH_ONLY:-}" ] && exit 0
SPECTUNE_HOME=/tmp/model-sampler-home RAY_AUTH_MODE=disabled .venv/bin/spectune run experiments/smoke-cpu.yaml \
  --set study.sampler=model --set study.n_trials=5 --set study.name=model-sampler-smoke
