#!/usr/bin/env bash
# The README's main job, twice on this 2-core machine (a slow hour: one fixed test took 15.4 s against 9.9 s at
# the session's start). smoke-cpu-tpe-clean-clone.log: a clean clone at 0fcb798, whose smoke-cpu.yaml still
# named study.sampler tpe (exit 0, 6:13 with setup, 4 of 5 complete: 6 configurations pruned, the space of 10
# exhausted); smoke-cpu-model.log: the main checkout with the default `model` sampler (exit 0, 6:56, 3 of 5
# complete: all 10 configurations tried, 7 pruned as clearly slower).
git clone -q "$(git rev-parse --show-toplevel)" /tmp/cc && cd /tmp/cc && git checkout -q 0fcb798
SPECTUNE_HOME=/tmp/cc_home bash infra/setup.sh && SPECTUNE_HOME=/tmp/cc_home .venv/bin/spectune run experiments/smoke-cpu.yaml
cd - && SPECTUNE_HOME=/tmp/main_home .venv/bin/spectune run experiments/smoke-cpu.yaml
