#!/usr/bin/env bash
# H200 (one GPU), commit bd76285, after `bash infra/device-setup.sh ray rest check` (setup.txt):
P=/tmp/spectune-venv/bin/python
$P -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py > kernels.txt
$P -m orchestrator decode --model random:llama-3-8b --tp 1 --drafter none -k 0 --device cuda --category writing \
    --num-prompts 4 --max-new-tokens 128 --json > tp1_decode.json 2> tp1_decode.log
