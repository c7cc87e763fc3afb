"""How fast `train-drafter` makes its training data: batched greedy generation with aux capture, per stepping path.

    python -m scripts.bench_generate --model random:llama-3.2-1b --batch 256 --prompt-len 200 --new 64 [--json OUT]

Runs workers/drafters/eagle3/training.py's `generate` on the same random prompts twice in one
process, with the rows stepped by the plain layers (SDPA under a per-row mask) and by
`batched_step` (the fused step with the split-KV Triton attention), and prints response tokens
per second of each (prefills included, as train-drafter pays them; the prefills alone and the
time of one batched step are printed too) and the fraction of response
tokens on which the two agree (float rounding can flip near-ties of a random model). GPU only.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> None:
    from workers.drafters.eagle3.head import default_aux_layers
    from workers.drafters.eagle3.training import batched_step, generate
    from workers.model.checkpoint import load_model, resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random:llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the target's dtype (train-drafter: bf16 on a GPU)"
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_generate: needs a CUDA device")
    g = torch.Generator().manual_seed(0)
    out = {"model": a.model, "dtype": a.dtype, "batch": a.batch, "prompt_len": a.prompt_len, "new": a.new, "paths": {}}
    results = {}
    for path in ("plain", "fused"):
        dtype = getattr(torch, a.dtype)
        model = load_model(resolve_model_path(a.model), dtype=dtype, device="cuda", max_seq=a.prompt_len + a.new + 8)
        model.aux_layers = default_aux_layers(model.args.n_layers)
        vocab = model.args.vocab_size
        prompts = [torch.randint(3, vocab, (a.prompt_len - (i % 17),), generator=g).tolist() for i in range(a.batch)]
        g.manual_seed(0)  # the same prompts for both paths
        fast = batched_step(model) if path == "fused" else None
        if path == "fused" and fast is None:
            raise SystemExit("bench_generate: the fused batched step cannot run here")
        generate(model, prompts[:2], 4, set(), fast)  # warm-up (kernels, allocator)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        generate(model, prompts, 1, set(), fast)  # the prefills alone (one token each: no batched step)
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        samples = generate(model, prompts, a.new, set(), fast)
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        n = sum(len(x.tokens) - x.prompt_len for x in samples)
        results[path] = [x.tokens[x.prompt_len :] for x in samples]
        step_ms = (s - prefill_s) / max(1, a.new - 1) * 1e3
        out["paths"][path] = {"seconds": s, "prefill_s": prefill_s, "step_ms": step_ms, "response_tokens": n, "tok_s": n / s}
        print(
            f"[{path}] {a.batch} rows x {a.new} new tokens: {s:.2f} s ({prefill_s:.2f} s of prefills, {step_ms:.1f} ms a batched step), "
            f"{n / s:.0f} response tok/s",
            flush=True,
        )
        del model, fast, samples
        torch.cuda.empty_cache()
    same = sum(int((p == f).sum()) for p, f in zip(results["plain"], results["fused"]))
    total = sum(p.numel() for p in results["plain"])
    out["agreement"] = same / total
    out["fused_over_plain"] = out["paths"]["fused"]["tok_s"] / out["paths"]["plain"]["tok_s"]
    print(f"fused / plain: {out['fused_over_plain']:.2f}x; tokens agreeing: {out['agreement']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
