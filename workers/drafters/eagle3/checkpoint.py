"""Read and write EAGLE-3 heads in the public format (config.json + model.safetensors; see eagle3.py).

    head = load_head(path, target_embed, target_args, dtype=torch.bfloat16, device="cuda")
    embed = target_embedding(model_path)     # the target's embedding alone, for a head process

    python -m workers.drafters.eagle3.checkpoint --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b

writes a random head of the matching shape (GPU timing runs; its drafts are never accepted).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from workers.drafters.eagle3.head import Eagle3Config, Eagle3Head, check_fits, load_config
from workers.model.args import CheckpointError, ModelArgs, ModelConfigError
from workers.model.rope import rope_tables


def load_head(
    path: str | Path, target_embed: torch.Tensor, target: ModelArgs, *, dtype=torch.float32, device="cpu", max_seq: int = 2048
) -> Eagle3Head:
    """Shard-only style: one tensor at a time from the safetensors files into a head built on meta."""
    path = Path(path)
    cfg = load_config(path)
    check_fits(cfg, target, path)
    with torch.device("meta"):
        head = Eagle3Head(cfg, max_seq=max_seq).to(dtype)  # maps and rotary tables keep their dtypes
    head = head.to_empty(device=device)
    shapes = {n: t.shape for n, t in head.state_dict().items()}
    seen: set[str] = set()
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"EAGLE-3 head {str(path)!r} has no *.safetensors weights")
    with torch.no_grad():
        params = dict(head.named_parameters()) | dict(head.named_buffers())
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    key = name.removeprefix("model.")
                    if key not in shapes:
                        continue
                    t = f.get_tensor(name)
                    if tuple(t.shape) != tuple(shapes[key]):
                        raise ModelConfigError(
                            f"EAGLE-3 head {path}: {key} has shape {list(t.shape)}, the config and the model need {list(shapes[key])}"
                        )
                    dst = params[key]
                    dst.copy_(t.to(dst.dtype) if dst.dtype in (torch.long, torch.bool) else t.to(dtype))
                    seen.add(key)
    if "embed_tokens.weight" not in seen:
        if tuple(target_embed.shape) != tuple(shapes["embed_tokens.weight"]):
            raise ModelConfigError(f"EAGLE-3 head {path}: the model's embedding {list(target_embed.shape)} does not fit")
        head.embed_tokens.weight = nn.Parameter(target_embed.detach().to(device, dtype), requires_grad=False)
        seen.add("embed_tokens.weight")
    missing = sorted(set(shapes) - seen - {"d2t", "t2d"})
    if missing:
        raise CheckpointError(f"EAGLE-3 head {path} lacks {len(missing)} tensors, e.g. {missing[0]!r}")
    if cfg.draft_vocab < cfg.args.vocab_size and not {"d2t", "t2d"} <= seen:
        raise CheckpointError(f"EAGLE-3 head {path}: a draft vocabulary of {cfg.draft_vocab} < {cfg.args.vocab_size} needs d2t and t2d")
    cos, sin = rope_tables(cfg.args, max_seq)
    head.rope_cos, head.rope_sin = cos.to(device), sin.to(device)
    attn = head.midlayer.self_attn
    attn.kv_map = (torch.arange(attn.n_heads) // (cfg.args.n_heads // cfg.args.n_kv_heads)).to(device)
    if cfg.draft_vocab == cfg.args.vocab_size and not {"d2t", "t2d"} <= seen:  # the full vocabulary: identity maps
        head.d2t.zero_()
        head.t2d.fill_(True)
    return head.eval()


def target_embedding(model_path: str, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """The target's token embedding alone (one tensor read), for a head process that holds no target."""
    from workers.model.random_weights import is_random

    if is_random(model_path):  # a random target (timing runs): the embedding's values do not matter
        from workers.model.checkpoint import load_args

        a = load_args(model_path)
        return torch.randn(a.vocab_size, a.dim, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in ("model.embed_tokens.weight", "embed_tokens.weight"):
                if name in f.keys():
                    return f.get_tensor(name).to(device, dtype)
    raise CheckpointError(f"checkpoint {model_path} has no embed_tokens.weight")


def head_config(target: ModelArgs, draft_vocab: int, aux_layers: tuple[int, ...] | None = None) -> Eagle3Config:
    """A head shaped like one decoder layer of `target` (what EAGLE-3 trains by default)."""
    return Eagle3Config(
        args=target.with_layers(1), draft_vocab=min(draft_vocab, target.vocab_size), target_hidden=target.dim, aux_layers=aux_layers
    )


def save_head(head: Eagle3Head, out: str | Path, dtype: torch.dtype = torch.bfloat16, with_embedding: bool = False) -> Path:
    """The head's tensors under their public names; the maps as int64 / bool; no embedding unless asked."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in head.state_dict().items():
        if name == "embed_tokens.weight" and not with_embedding:
            continue
        t = t.detach().cpu()
        tensors[name] = t.contiguous() if name in ("d2t", "t2d") else t.to(dtype).contiguous()
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    cfg = head.cfg.to_hf_config()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def random_head(cfg: Eagle3Config, seed: int = 0, d2t_from: list[int] | None = None) -> Eagle3Head:
    """Random weights (std 1 / sqrt(fan_in), unit norms); the draft vocabulary is `d2t_from` or the
    first draft_vocab target ids."""
    g = torch.Generator().manual_seed(seed)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else p.shape[1] ** -0.5))
        set_vocab(head, d2t_from or list(range(cfg.draft_vocab)))
    return head


def set_vocab(head: Eagle3Head, target_ids: list[int]) -> None:
    """Draft id d stands for target id target_ids[d]: d2t[d] = target_ids[d] - d; t2d marks them."""
    ids = torch.tensor(target_ids, dtype=torch.long)
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d.zero_()
    head.t2d[ids] = True


def main() -> None:
    from workers.model.checkpoint import load_args, resolve_model_path

    ap = argparse.ArgumentParser(description="write a random EAGLE-3 head of the target's shape (GPU timing runs)")
    ap.add_argument("--target", required=True, help="the target checkpoint or alias (random:<preset> works)")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    target = load_args(resolve_model_path(a.target))
    print(save_head(random_head(head_config(target, a.draft_vocab), a.seed), a.out))


if __name__ == "__main__":
    main()
