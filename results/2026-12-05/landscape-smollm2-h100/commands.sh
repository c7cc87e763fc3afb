#!/usr/bin/env bash
# The GPU landscape of docs/search.md: one lent H100 (an H200 was not named; the reply said
# "NVIDIA H100 80GB HBM3"), four back-to-back device calls of one lease (docs/gpu.md):
#   call 1, carry [".devcarry/ray", ".devcarry/rest"]:  bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
#   call 2, carry [".devcarry/model-a"]:                 bash infra/device-setup.sh model
#   call 3, carry [".devcarry/model-b"]:                 bash infra/device-setup.sh model;
#            STUDY_TIMEOUT_S=150 OUT=$OUT bash results/2026-12-05/landscape-smollm2-h100/run.sh ngram eagle3-rank0-lookup3 eagle3-rank0 skip8
#   call 4:  STUDY_TIMEOUT_S=140 OUT=$OUT bash results/2026-12-05/landscape-smollm2-h100/run.sh eagle3-rank0-tree4-lookup3 eagle3-actor ngram-gemv-off
# (the packs: `bash infra/device-pack.sh --model` here first). log.txt is calls 3 and 4's, setup.txt call 1's;
# optuna.db and mlflow.db came back from call 4. Then, here:
.venv/bin/spectune bench-search experiments/h200-1gpu-smollm2.yaml \
  --storage sqlite:///results/2026-12-05/landscape-smollm2-h100/optuna.db --tracking sqlite:///results/2026-12-05/landscape-smollm2-h100/mlflow.db \
  --studies landscape-gpu-ngram,landscape-gpu-skip8,landscape-gpu-eagle3-rank0,landscape-gpu-eagle3-rank0-lookup3,landscape-gpu-eagle3-rank0-tree4-lookup3,landscape-gpu-eagle3-actor,landscape-gpu-ngram-gemv-off \
  --budget 6
