#!/usr/bin/env bash
# H200 (one GPU), 2026-12-01/02, commit bd76285: batched passes through the fused step and the split-KV
# Triton attention. After `bash infra/device-setup.sh ray rest check` (docs/gpu.md), two calls on one
# warm machine; the JSON per run, log.txt and table.txt are what infra/gpu-batch.sh left in its tar.
SIZES="4 16 32" KS=4 OUT=$OUT bash infra/gpu-batch.sh
SIZES="4 16 32" KS=2 OUT=$OUT bash infra/gpu-batch.sh
# every run: random:llama-3-8b, TP 1, 32 bundled prompts x 64 new tokens; plain at batch 1 (batch1_*),
# plain at B (baseline_*), n-gram drafting with simulated acceptance tau = 3 at B (decode_*)
