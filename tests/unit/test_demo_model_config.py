"""The demo model's converted config.json names its architecture (vLLM and SGLang pick the model class
from `architectures`, and refuse a folder whose config has none), also in a cache the first converter
wrote without it. No download: a cache folder of that shape is written here.

    .venv/bin/python -m pytest tests/unit/test_demo_model_config.py
"""

from __future__ import annotations

import json

from workers.model.locate import ensure_demo_model

# the config.json the converter wrote before it named the architecture (trimmed; transformers' GGUF
# loader leaves "architectures" None)
OLD_CONFIG = {
    "architectures": None,
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "tie_word_embeddings": True,
}


def test_a_cache_without_architectures_is_repaired_on_load(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path))
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(OLD_CONFIG, indent=1))
    (folder / "model.safetensors").write_bytes(b"")  # present: nothing is fetched or converted

    assert ensure_demo_model("smollm2-135m") == folder
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert {k: v for k, v in cfg.items() if k != "architectures"} == {k: v for k, v in OLD_CONFIG.items() if k != "architectures"}
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]  # no temporary file left
    loaded = AutoConfig.from_pretrained(folder)
    assert loaded.architectures == ["LlamaForCausalLM"]
    assert type(AutoModelForCausalLM.from_config(loaded)).__name__ == "LlamaForCausalLM"

    before = (folder / "config.json").stat().st_mtime_ns
    ensure_demo_model("smollm2-135m")  # a config that names it is not rewritten
    assert (folder / "config.json").stat().st_mtime_ns == before
