#!/usr/bin/env bash
# H200 (one GPU), session 12, a fresh lease (another machine than ../eagle3-chain-and-kernels-h200), commit 3a4e065
# (the phase labels in workers/engine/strategies.py, workers/tools/trace_decode.py). One call, carry
# .devcarry/ray + .devcarry/rest:
bash infra/device-setup.sh ray rest; . /tmp/spectune-venv/spectune.env; PY=/tmp/spectune-venv/bin/python
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b
$PY -m pytest -q -x tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py | tail -2 > kernels.txt
$PY -m orchestrator decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json \
  --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > random8b_eagle3_rank0.json 2> decode.log
$PY -m workers.tools.trace_decode --model random:llama-3-8b --device cuda --drafter eagle3 --draft-model /tmp/head8b \
  --draft-placement rank0 -k 4 --simulate-accept-len 3 --max-new-tokens 64 --out /tmp/trace   # trace.json.gz, trace_summary.json
# the next call on the same warm machine: the same decode with the phase labels replaced by a no-op
# context (a local edit, not committed) -> random8b_eagle3_rank0_nolabels.json, decode_nolabels.log
