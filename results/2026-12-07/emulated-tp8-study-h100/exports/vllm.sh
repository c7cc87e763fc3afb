# EMULATED: emulated TP 8 from table seeds-tp8-pcie (sha256 c3b9b49ad9c2): one rank's compute measured, every allreduce a wait the table gives; acceptance simulated: P(accepted >= i) 0.75, 0.55, 0.4, 0.28, 0.2, 0.14 (workload.simulate_accept_profile)
#   the TP size below is the emulated deployment's; confirm on it before serving
# WARNING: this study imposed P(accepted >= i) = 0.75,0.55,0.4,0.28,0.2,0.14 (workload.simulate_accept_profile): the k and drafter
#   below are ranked on engine speed alone; measure the drafter on real prompts before deploying them
# spectune export: study tp8-pcie-emulated, model random:kimi-k2:layers=12, dtype bfloat16
# flag names checked against the vLLM documentation of 0.25.0
# winners by batch size (ranked by throughput with the prefill; decode: the decode steps alone):
#   batch size 1: ngram k=4 (ngram_max=3, ngram_min=1), tp 8, backend nccl, 104.7 tok/s +-3.1, 1.60x plain, decode 284.3 tok/s (2.66x plain), trial 9
# allreduce: the winner ran nccl (NCCL); vLLM's equivalent: vLLM's PyNccl allreduce: custom allreduce off (--disable-custom-all-reduce), torch symmetric memory off (VLLM_ALLREDUCE_USE_SYMM_MEM=0)
#   these settings make vLLM run the allreduce the study measured (NCCL); vLLM's own custom allreduce, its default on NVLink and on up to two PCIe GPUs, was not measured: drop both to compare it on your box
# adaptive speculation: vLLM 0.25.0 has none (no adaptive-k field in SpeculativeConfig; enable_adaptive_k /
#   adaptive_k_c_draft are vllm-project/vllm PR 47111, open, after PR 44336 closed unmerged): nothing of it is emitted.
#   The study's measurements support one static k (the best k at every batch size measured: 1).
#   Measured draft-to-target time ratio (batch size 1, trial 9): 0.013 ms of drafting for k=4 over a 10.030 ms verify pass = 0.0003 per draft token, the c_draft an adaptive-k controller is profiled with
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export VLLM_ALLREDUCE_USE_SYMM_MEM=0
vllm serve random:kimi-k2:layers=12 \
    --dtype bfloat16 \
    --tensor-parallel-size 8 \
    --disable-custom-all-reduce \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
