"""The converted demo model is a Hugging Face folder a serving engine takes as it is: its config.json
names the architecture and transformers' Auto classes load it (what `spectune export` points vLLM and
SGLang at).

    .venv/bin/python -m pytest tests/engine/test_demo_model_loads.py
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow  # the demo model


def test_the_demo_model_loads_with_transformers_auto_classes(smollm2):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    assert json.loads((smollm2 / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert AutoConfig.from_pretrained(smollm2).architectures == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()
