#!/usr/bin/env bash
# The H200 landscape of docs/search.md (issue 32): the variants and run.sh of
# results/2026-12-05/landscape-smollm2-h100/ (one grid study over k per drafter variant of
# experiments/h200-1gpu-smollm2.yaml, one gang each), on the lent GPU, back-to-back device calls of one lease
# (a call that finds the machine cold starts over from call 1; the working tree is ~27 MiB, so each
# call carries one pack):
#   call 1, carry [".devcarry/pyd"]:        bash results/2026-12-06/eagle3-batch-drafts-on-device/call5.sh   (issue 33; exits at once on an H100)
#   call 2, carry [".devcarry/ray"]:        bash infra/device-setup.sh ray > $OUT/ray.txt 2>&1
#   call 3, carry [".devcarry/rest"]:       bash infra/device-setup.sh rest check > $OUT/rest.txt 2>&1
#   call 4, carry [".devcarry/model-a"]:    bash infra/device-setup.sh model > $OUT/model-a.txt 2>&1
#   call 5, carry [".devcarry/model-b"]:    bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
#   call 6, carry [".devcarry/model-c"]:    bash infra/device-setup.sh model > $OUT/model-c.txt 2>&1;
#            STUDY_TIMEOUT_S=140 OUT=$OUT bash results/2026-12-05/landscape-smollm2-h100/run.sh ngram eagle3-rank0 skip8 eagle3-rank0-lookup3 eagle3-actor
#   call 7:  STUDY_TIMEOUT_S=140 OUT=$OUT bash results/2026-12-05/landscape-smollm2-h100/run.sh eagle3-rank0-tree4-lookup3 ngram-gemv-off
# (the packs: `bash infra/device-pack.sh --model` here first: the demo model's wheel in three parts, each of
# which fits beside the ~22 MiB working tree). log-6.txt / log-7.txt are calls 6 and 7's log.txt; optuna.db
# and mlflow.db came back from the last call and are kept as records.tar.gz. Then, here:
set -euo pipefail
cd "$(dirname "$0")/../../.."
R=results/2026-12-06/landscape-smollm2-h200
tar -C $R -xzf $R/records.tar.gz
.venv/bin/spectune bench-search experiments/h200-1gpu-smollm2.yaml \
  --storage sqlite:///$R/optuna.db --tracking sqlite:///$R/mlflow.db \
  --studies landscape-gpu-ngram,landscape-gpu-skip8,landscape-gpu-eagle3-rank0,landscape-gpu-eagle3-rank0-lookup3,landscape-gpu-eagle3-actor \
  --budget 6 --json
