#!/usr/bin/env bash
# H200 (one GPU), commit 5738565 (the chain's head steps through HeadFastStep), after
# `bash infra/device-setup.sh ray rest check` (setup.txt):
P=/tmp/spectune-venv/bin/python
$P -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b
$P -m workers.tools.profile_chain --head /tmp/head8b -k 4 --width 4 --json profile_chain.json > profile_chain.txt
$P -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py > kernels.txt
$P -m orchestrator decode --model random:llama-3-8b --tp 1 --drafter none -k 0 --device cuda --category writing \
    --num-prompts 4 --max-new-tokens 128 --json > tp1_decode.json 2> tp1_decode.log
STAGES=chain OUT=$OUT bash infra/gpu-eagle3.sh    # random8b_eagle3_{rank0,actor}.json, log_chain.txt
