#!/usr/bin/env bash
# The H200 study of results/2026-12-01/study-kill-resume-h200 (experiments/h200-1gpu.yaml: Llama-3-8B shape, random
# weights, simulated acceptance tau = 3; 14 COMPLETE trials, 7 configurations) as a landscape: its
# Optuna and MLflow stores, untracked since 5100da9, restored from the commit before it (where the folder was still named results/2026-12-01/gpu-study/).
set -euo pipefail
R=results/2026-12-05/landscape-llama3-8b-h200
git show 5100da9^:results/2026-12-01/gpu-study/optuna.db > $R/optuna.db
git show 5100da9^:results/2026-12-01/gpu-study/mlflow.db > $R/mlflow.db
.venv/bin/spectune bench-search experiments/h200-1gpu.yaml --storage sqlite:///$R/optuna.db --tracking sqlite:///$R/mlflow.db --studies h200-1gpu --budget 6
