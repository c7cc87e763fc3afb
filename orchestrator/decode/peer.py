"""The peer baseline: the same prompts through transformers' own `generate` (plain greedy, and
assisted generation with a draft model), timed the same way, so speedups can be quoted against it.
Its greedy tokens are also the check of spectune's engine on a user's own checkpoint: `decode
--peer-baseline` compares them with spectune's plain decoding (`outputs_match_peer`).

    python -m orchestrator.decode.peer random:llama-3-8b --device cuda --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from workers.model.locate import is_random, random_config


def hf_model(path: str, dtype: torch.dtype, device: str):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    if is_random(path):
        cfg = dict(random_config(path))
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    model.generation_config.eos_token_id = None  # always generate exactly max_new_tokens
    return model.eval()


@torch.inference_mode()
def generate_throughput(
    path: str,
    prompts: list[list[int]],
    max_new_tokens: int,
    dtype=torch.bfloat16,
    device: str = "cuda",
    draft_path: str | None = None,
    outputs: list[list[int]] | None = None,
) -> dict[str, float]:
    """Tokens per second of transformers' generate over `prompts` (greedy, exactly max_new_tokens
    each); `outputs`, when given, receives each prompt's generated tokens."""
    model = hf_model(path, dtype, device)
    draft = hf_model(draft_path, dtype, device) if draft_path else None
    extra = {"assistant_model": draft} if draft is not None else {}

    def gen(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids], device=device)
        out = model.generate(  # noqa: F821 - `del model` below frees it once gen is done
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            **extra,
        )
        return out[0, x.shape[1] :].tolist()

    gen(prompts[0], 4)  # warm-up
    tokens, seconds = 0, 0.0
    for ids in prompts:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        new = gen(ids, max_new_tokens)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        tokens += len(new)
        if outputs is not None:
            outputs.append(new)
    key = "hf_assisted_tok_s" if draft is not None else "hf_generate_tok_s"
    del gen, model, draft  # the closure too: it holds the model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {key: tokens / seconds, f"{key.removesuffix('_tok_s')}_tokens": float(tokens)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    a = ap.parse_args()
    prompts = [list(range(3, 3 + a.prompt_len))] * 2
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    print(json.dumps(generate_throughput(a.model, prompts, a.max_new_tokens, dtype, a.device, a.draft_model)))


if __name__ == "__main__":
    main()
