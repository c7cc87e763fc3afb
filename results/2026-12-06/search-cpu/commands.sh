#!/usr/bin/env bash
# Issue 32's CPU check: a 10-trial study of experiments/search-cpu.yaml (26 configurations) on 2 CPU cores
# shared with other engineers' test runs, then its report, summary and export.
# Run from the repository root: bash results/2026-12-06/search-cpu/commands.sh
set -euo pipefail
R=${R:-results/2026-12-06/search-cpu}
export SPECTUNE_HOME=${SPECTUNE_HOME:-/tmp/search-cpu-home} RAY_AUTH_MODE=disabled
rm -rf "$SPECTUNE_HOME"
.venv/bin/spectune run experiments/search-cpu.yaml > $R/run.txt 2> $R/log.txt
.venv/bin/spectune report experiments/search-cpu.yaml --out $R/report > $R/report.txt 2>> $R/log.txt
cp "$SPECTUNE_HOME/summaries/search-cpu.json" $R/summary.json
.venv/bin/spectune export experiments/search-cpu.yaml --to json --out $R/schedule.json 2>> $R/log.txt
.venv/bin/python -m orchestrator.explain.perfcheck experiments/search-cpu.yaml > $R/perfcheck.txt 2>> $R/log.txt || true
