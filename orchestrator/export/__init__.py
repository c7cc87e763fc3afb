"""Deploying the winner: the best configuration per batch size (`schedule`) and `spectune export`
in the forms serving engines take (`formats`: JSON, vLLM, SGLang, an NCCL env file)."""
