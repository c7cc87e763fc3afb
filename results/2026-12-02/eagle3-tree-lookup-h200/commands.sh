#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), commit 728e486 (n-gram continuations as branches of the tree), one lease of
# three calls:
#  call 1, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests (+ test_graph_safety, test_tree
#          but its TP 2 demo-head test; 1 failure: test_lookup_joins_the_tree_as_a_branch still wrapped
#          NgramIndex.propose, which the tree no longer calls, so it counted no branches; mended after), the
#          random 8B head at simulated tau 3, k = 4, rank0, tree 3 with its plain baseline;
#  call 2, carry [".devcarry/model-a"]: `bash infra/device-setup.sh model`;
#  call 3, carry [".devcarry/model-b"]: the model's second half, then the shipped head on the 56 held-out
#          prompts: lookup 3 + tree 3 (with the plain baseline), lookup 3 + tree 4, and n-gram k = 4 in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py -k "not tp2" > $OUT/kernels.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/head8b.log 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --tree-width 3 > $OUT/random8b_rank0_tree3.json 2> $OUT/tree3.log
# call 2: bash infra/device-setup.sh model      (call 3 starts with it too)
bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json -k 4"
G="$H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0"
$PY -m orchestrator $G --tree-width 3 --draft-lookup 3 > $OUT/heldout_eagle3_lookup3_tree3.json 2> $OUT/lookup3_tree3.log
$PY -m orchestrator $G --tree-width 4 --draft-lookup 3 --no-baseline > $OUT/heldout_eagle3_lookup3_tree4.json 2> $OUT/lookup3_tree4.log
$PY -m orchestrator $H --drafter ngram --no-baseline > $OUT/heldout_ngram.json 2> $OUT/ngram.log
