#!/usr/bin/env bash
# H200 (device tool, nvidia-h200), one lease of three calls:
#  call 1 at 4b90bb6, carry [".devcarry/ray", ".devcarry/rest"]: setup, kernel self-tests (+ test_graph_safety,
#          test_tree; 3 failures, see below), the attention self-test, the random 8B head at simulated tau 3,
#          k = 4, rank0: chain (with its plain baseline), tree 3, tree 4 (tree steps now attend through the
#          split-KV kernel with ancestor bits, 3debc38);
#  call 2, carry [".devcarry/model-a"]: `bash infra/device-setup.sh model`;
#  call 3, carry [".devcarry/model-b"]: the model's second half, then the shipped head on the 56 held-out
#          prompts: tree 3 (with the plain baseline), lookup 2 + tree 3 (the n-gram continuation as a branch of
#          the tree, 4b90bb6: NgramIndex(2, 2)), the chain, and n-gram k = 4, all in the same call; then
#          test_tree's TP 2 demo-head test (it needs the model: 1 passed).
# kernels.txt's 3 failures are the tests, not the kernels, fixed after this lease: test_a_wrong_tree_is_caught
# used a case whose long prefix hides a wrong mask in bf16 (now the case with no prefix); the CPU model's tree
# step through Triton ran on a CUDA build (now CPU-interpreter only); the TP 2 demo-head test ran before the
# model was set up (passed in call 3).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash infra/device-setup.sh ray rest check > $OUT/setup.txt 2>&1
. /tmp/spectune-venv/spectune.env
PY=/tmp/spectune-venv/bin/python
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv > $OUT/gpu.txt
$PY -m pytest -q tests/test_kernels_attention.py tests/test_kernels_gemv.py tests/test_triton_kernels.py tests/test_graph_safety.py tests/test_tree.py > $OUT/kernels.txt 2>&1
$PY -m workers.kernels.attention --selftest > $OUT/attention_selftest.txt 2>&1
E="decode --model random:llama-3-8b --tp 1 --device cuda --category writing --num-prompts 4 --max-new-tokens 128 --json"
$PY -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b > $OUT/head8b.log 2>&1
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 > $OUT/random8b_rank0_chain.json 2> $OUT/chain.log
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --tree-width 3 --no-baseline > $OUT/random8b_rank0_tree3.json 2> $OUT/tree3.log
$PY -m orchestrator $E --drafter eagle3 --draft-model /tmp/head8b --draft-placement rank0 -k 4 --simulate-accept-len 3 --tree-width 4 --no-baseline > $OUT/random8b_rank0_tree4.json 2> $OUT/tree4.log
# call 2: bash infra/device-setup.sh model      (call 3 starts with it too)
bash infra/device-setup.sh model > $OUT/model-b.txt 2>&1
H="decode --model smollm2-135m --tp 1 --device cuda --split heldout --num-prompts 56 --max-new-tokens 128 --json -k 4"
G="$H --drafter eagle3 --draft-model smollm2-135m-eagle3 --draft-placement rank0"
$PY -m orchestrator $G --tree-width 3 > $OUT/heldout_eagle3_tree3.json 2> $OUT/tree3.log
$PY -m orchestrator $G --tree-width 3 --draft-lookup 2 --no-baseline > $OUT/heldout_eagle3_lookup2_tree3.json 2> $OUT/lookup2_tree3.log
$PY -m orchestrator $G --no-baseline > $OUT/heldout_eagle3_chain.json 2> $OUT/chain.log
$PY -m orchestrator $H --drafter ngram --no-baseline > $OUT/heldout_ngram.json 2> $OUT/ngram.log
$PY -m pytest -q tests/test_tree.py -k tp2 > $OUT/test_tree_tp2.txt 2>&1
