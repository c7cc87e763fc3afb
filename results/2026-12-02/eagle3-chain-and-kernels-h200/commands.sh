#!/usr/bin/env bash
# H200 (one GPU), session 12, commit ee5080c, same lease right after ../eagle3-train-self-written-h200: the kernel
# self-tests, a TP 1 plain decode, and the chain stage (a random head of Llama-3-8B's shape at
# simulated tau = 3, k = 4, rank0 and actor placement, each with its own plain baseline).
. /tmp/spectune-venv/spectune.env; PY=/tmp/spectune-venv/bin/python
$PY -m pytest -q -x tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py | tail -2 > kernels.txt
$PY -m orchestrator decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json > tp1_plain.json 2> tp1_plain.log
STAGES=chain OUT=$OUT bash infra/gpu-eagle3.sh   # random8b_eagle3_{rank0,actor}.json, log_chain.txt
