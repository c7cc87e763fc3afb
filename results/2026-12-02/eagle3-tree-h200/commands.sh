#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), commit d5c26c7, one lease of three calls: tree drafting (drafter.tree_width).
#  call 1, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests (+ test_graph_safety and
#          test_tree), a TP 1 plain decode of random:llama-3-8b, then a random head of its shape at simulated
#          tau 3, k = 4, rank0: the chain, then a tree of width 3 (12 drafts: the tree step's cost);
#  call 2, carry [".devcarry/model-a"]: `bash infra/device-setup.sh model`;
#  call 3, carry [".devcarry/model-b"]: the model's second half, then the shipped head on the 56 held-out
#          prompts with a tree of width 3 (with the plain baseline), and with lookup 2 as well.
# The head alone, lookup 2 alone and n-gram on the same prompts: ../eagle3-lookup-speed-h200/.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py > $OUT/kernels.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m orchestrator $E --drafter none -k 0 > $OUT/random8b_plain_tp1.json 2> $OUT/plain.log
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/head8b.log 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > $OUT/random8b_rank0_chain.json 2> $OUT/chain.log
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --tree-width 3 --no-baseline > $OUT/random8b_rank0_tree3.json 2> $OUT/tree3.log
# call 2: bash infra/device-setup.sh model      (call 3 starts with it too)
bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json --drafter eagle3 --draft-model smollm2-135m-eagle3 -k 4 --draft-placement rank0"
$PY -m orchestrator $H --tree-width 3 > $OUT/heldout_eagle3_tree3.json 2> $OUT/tree3.log
$PY -m orchestrator $H --tree-width 3 --draft-lookup 2 --no-baseline > $OUT/heldout_eagle3_lookup2_tree3.json 2> $OUT/lookup2_tree3.log
