#!/usr/bin/env bash
# The batch-size study of experiments/batch-cpu.yaml on this repo's CPU machine (2 cores), then its
# schedule in every export format. Study data in $SPECTUNE_HOME (here: a temporary folder); the
# run's log, final JSON line, report summary and exports are written next to this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=results/2026-12-01/batch-study-cpu
export RAY_AUTH_MODE=disabled SPECTUNE_HOME=${SPECTUNE_HOME:-/tmp/spectune-batch-study}
S=.venv/bin/spectune
$S run experiments/batch-cpu.yaml > $D/summary.json 2> $D/log.txt
$S report experiments/batch-cpu.yaml --out $D/report > $D/report.txt 2>> $D/log.txt
for f in json vllm sglang env; do $S export experiments/batch-cpu.yaml --to $f --out $D/schedule.$f 2>> $D/log.txt; done
