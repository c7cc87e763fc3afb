"""The serving-engine versions every export was checked against, and the engines' names in words.

Each engine module (vllm.py, sglang.py, trtllm.py, allreduce.py) names, beside each flag or key it
writes, the documentation page or source file of these versions it was checked in. An export's
header names the version (`spectune export EXP.yaml --to vllm`: "flag names checked against ...").

    from orchestrator.export.versions import ENGINE_VERSIONS, ENGINE_NAMES
"""

from __future__ import annotations

# vLLM: the 0.25.0 documentation (docs/features/speculative_decoding/{draft_model,
#   dynamic_speculative_decoding}.md; mtp.md as the 0.19.1 and 0.26.0 documentation have it) and, on the
#   main branch, docs/features/speculative_decoding/configuration.md, vllm/config/speculative.py
#   (SpeculativeConfig fields, SpeculativeMethod, MTPModelTypes), vllm/envs.py (VLLM_ALLREDUCE_USE_SYMM_MEM),
#   vllm/distributed/device_communicators/
#   {cuda_communicator,custom_all_reduce,symm_mem}.py (which allreduce runs, in which order, and when
#   each turns itself off).
# SGLang: no release tag could be pinned; the main-branch documentation after the NGRAM flag rework
#   (sgl-project/sglang PR 21225, 2026-03: --speculative-ngram-{min,max}-match-window-size removed,
#   --speculative-ngram-branch-length renamed --speculative-ngram-max-trie-depth):
#   docs/advanced_features/{server_arguments,speculative_decoding}.md, docs/basic_usage/deepseek_v3.md
#   (DeepSeek MTP: --speculative-algorithm EAGLE, no draft model path), python/sglang/srt/speculative/
#   spec_info.py, python/sglang/srt/server_args.py (--disable-custom-all-reduce,
#   --enable-torch-symm-mem) and python/sglang/srt/distributed/device_communicators/torch_symm_mem.py.
# TensorRT-LLM: the 1.4.0rc4 LLM API reference (llm-api/reference/{Eagle3DecodingConfig,
#   NGramDecodingConfig,MTPDecodingConfig,TorchLlmArgs}.html) and tensorrt_llm/llmapi/llm_args.py after
#   NVIDIA/TensorRT-LLM PR 10860 (merged 2026-03-13: draft_len_schedule on the one-model path, keys read as
#   "up to this batch size"), PR 12262 (the schedule for MTP too) and PR 12341 (MTP's k in max_draft_len,
#   num_nextn_predict_layers read from the checkpoint): DecodingBaseConfig, DraftTargetDecodingConfig,
#   MTPDecodingConfig, TorchLlmArgs.allreduce_strategy.
ENGINE_VERSIONS = {
    "vllm": "0.25.0",
    "sglang": "main after PR 21225 (2026-03)",
    "trtllm": "1.4.0rc4",
}

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
