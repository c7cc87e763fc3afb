"""Deploying the winner: the best configuration per batch size (`schedule`) and `spectune export` in
the forms serving engines take (`formats` dispatches: JSON, vLLM, SGLang, TensorRT-LLM, an NCCL env
file; one module per engine, `allreduce` for each engine's allreduce choice, `bundle` for --to all)."""
