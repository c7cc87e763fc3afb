"""Write EAGLE-3 heads in the public format (config.json + model.safetensors; see eagle3.py).

    python -m workers.drafters.eagle3_ckpt --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b

writes a random head of the matching shape (GPU timing runs; its drafts are never accepted).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.drafters.eagle3 import Eagle3Config, Eagle3Head
from workers.model.args import ModelArgs


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

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target checkpoint or alias (random:<preset> works)")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    target = load_args(resolve_model_path(a.target))
    print(save_head(random_head(head_config(target, a.draft_vocab), a.seed), a.out))


if __name__ == "__main__":
    main()
