#!/usr/bin/env bash
# H200 (one GPU), 2026-12-01, commit 738cce6 (before bd76285): batched passes ran the plain layers
# with SDPA under a position mask over the whole static cache. The same script as ../batch-h200:
SIZES="1 4" OUT=$OUT bash infra/gpu-batch.sh           # KS="2 4"
SIZES="16 32" KS=4 OUT=$OUT bash infra/gpu-batch.sh
