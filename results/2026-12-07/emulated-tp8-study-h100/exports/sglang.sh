# EMULATED: emulated TP 8 from table seeds-tp8-pcie (sha256 c3b9b49ad9c2): one rank's compute measured, every allreduce a wait the table gives; acceptance simulated: P(accepted >= i) 0.75, 0.55, 0.4, 0.28, 0.2, 0.14 (workload.simulate_accept_profile)
#   the TP size below is the emulated deployment's; confirm on it before serving
# WARNING: this study imposed P(accepted >= i) = 0.75,0.55,0.4,0.28,0.2,0.14 (workload.simulate_accept_profile): the k and drafter
#   below are ranked on engine speed alone; measure the drafter on real prompts before deploying them
# spectune export: study tp8-pcie-emulated, model random:kimi-k2:layers=12, dtype bfloat16
# flag names checked against the SGLang documentation of main after PR 21225 (2026-03)
# winners by batch size (ranked by throughput with the prefill; decode: the decode steps alone):
#   batch size 1: ngram k=4 (ngram_max=3, ngram_min=1), tp 8, backend nccl, 104.7 tok/s +-3.1, 1.60x plain, decode 284.3 tok/s (2.66x plain), trial 9
# allreduce: the winner ran nccl (NCCL); SGLang's equivalent: SGLang's NCCL allreduce: custom allreduce off (--disable-custom-all-reduce); torch symmetric memory stays off (its default)
# SGLang's NGRAM matches every suffix up to the trie depth and has no minimum match length (ngram_min=1 is not mapped);
#   its n-gram cache is built from recent tokens and shared across requests, so its acceptance can differ from spectune's lookup
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
python -m sglang.launch_server --model-path random:kimi-k2:layers=12 \
    --dtype bfloat16 \
    --tp-size 8 \
    --disable-custom-all-reduce \
    --speculative-algorithm NGRAM \
    --speculative-num-draft-tokens 5 \
    --speculative-ngram-min-bfs-breadth 1 \
    --speculative-ngram-max-bfs-breadth 1 \
    --speculative-ngram-max-trie-depth 7
