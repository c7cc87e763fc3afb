"""Verify-pass time against its width on a GPU, for dense and MoE verifiers, with the distinct experts
each pass reads and the HBM roofline of the bytes it actually reads.

    python -m scripts.verify_widths --model random:qwen3-8b random:qwen3-30b-a3b:layers=24 --widths 1 2 3 4 5 6 7 8 9 \
        --context 256 --json OUT.json

Per model (bf16, TP 1, the engine's graphed steps with their defaults: the fused step where the family
has one, else the plain model, as latent attention runs): a prompt of --context random tokens is
prefilled, then for each width w the step of w random tokens is run once eagerly, every MoE layer
logging its expert ids (MoE.census: the distinct experts each MoE layer reads), and timed as a
CUDA-graph replay (median of 200, CUDA events).

Bytes a pass of width w reads: every weight but the embedding table (unless the head shares it), of
the stacked expert weights only the distinct experts' rows (3 matrices of I x dim each), plus the
cache entries of the context + w positions as the cache holds them (latent attention's absorbed
cache: one latent and rope key a token and layer). Over the measured copy bandwidth (read + write of a 2 GiB copy)
that is the roofline each replay is compared with. A dense model's bytes do not grow with w; an
MoE's grow with the union of the experts its w tokens route to, which is what makes deeper
speculation cost more on an MoE verifier at small batch. Random weights route almost uniformly, so
the union here is larger than real text's (the figures say so where they are quoted).
"""

from __future__ import annotations

import argparse
import json

import torch

from scripts.profile_step import copy_bandwidth, replay_ms


def weight_bytes(model) -> tuple[int, int]:
    """(bytes of every weight a step streams but the stacked experts, bytes of one expert's three matrices)."""
    seen, dense, per_expert = set(), 0, 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or (name == "embed_tokens.weight" and not model.args.tie_embeddings):
            continue
        seen.add(p.data_ptr())
        if ".experts." in name:  # counted per distinct expert a pass reads
            continue
        dense += p.numel() * p.element_size()
    if model.args.moe_layers:
        e = model.layers[model.args.moe_layers[0]].mlp.experts
        per_expert = sum(w[0].numel() * w.element_size() for w in (e.gate_proj, e.up_proj, e.down_proj))
    return dense, per_expert


def cache_bytes_per_position(cache) -> int:
    """Bytes one position takes in every layer's cache (all heads; a V that is a view of K, as in the
    absorbed latent cache, counted once)."""
    seen, total = set(), 0
    for t in [*cache.k, *cache.v]:
        if t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t[0, :, 0].numel() * t.element_size()
    return total


def measure(ref: str, widths: list[int], context: int, bw: float, mla: str = "absorbed") -> dict:
    from workers.engine.steps import StepGraph, StepRunner, no_cudnn_attention
    from workers.model.checkpoint import load_model, resolve_model_path
    from workers.model.moe import MoE
    from workers.spec.engine_config import EngineConfig

    no_cudnn_attention()
    device = torch.device("cuda")
    max_seq = -(-(context + max(widths) + 1) // 256) * 256
    model = load_model(resolve_model_path(ref), dtype=torch.bfloat16, device=device, max_seq=max_seq)
    engine = EngineConfig(mla=mla)
    model.absorb_latent_attention(engine.mla == "absorbed")  # as the worker does, before any cache
    a = model.args
    dense_bytes, expert_bytes = weight_bytes(model)
    runner = StepRunner(model, model.new_cache(1, max_seq), max_width=max(widths), engine=engine)
    runner.warm(widths)
    per_position = cache_bytes_per_position(runner.cache)
    moes = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, a.vocab_size, (context,), generator=gen).tolist()
    out = {
        "model": ref,
        "layers": a.layers_label or f"{a.n_layers} layers",
        "attention": runner.attention,
        "step": "fused" if runner.fast is not None else "plain model",
        "mla": mla if a.mla else None,
        "moe_kernel": runner.moe_experts,
        "dense_weight_gb": dense_bytes / 1e9,
        "expert_mb": expert_bytes / 1e6,
        "moe_layers": len(a.moe_layers),
        "experts": a.moe.n_experts if a.moe else 0,
        "top_k": a.moe.top_k if a.moe else 0,
        "context": context,
        "widths": {},
    }
    with torch.inference_mode():
        runner.cache.reset()
        runner.prefill(prompt)
        for w in widths:
            tokens = torch.randint(0, a.vocab_size, (w,), generator=gen).tolist()
            runner.cache.lengths[0] = context
            pos = torch.arange(context, context + w, device=device)[None]
            for m in moes:  # each MoE layer logs its tokens' expert ids (MoE.census), whichever way the step routes
                m.census = []
            try:
                if runner.fast is not None:  # eager, the step's own routing
                    runner.fast.hidden_at(torch.tensor([tokens], device=device), pos, runner.cache, runner.cache.max_seq)
                else:
                    model.hidden(torch.tensor([tokens], device=device), runner.cache)
                distinct = [int(torch.cat(m.census).unique().numel()) for m in moes]
            finally:
                for m in moes:
                    m.census = None
            runner.cache.lengths[0] = context
            runner.step(tokens)  # stages this width's tokens and positions into its graph
            ms = replay_ms(runner.graphs[StepGraph(w, True)][0], device)
            kv = (context + w) * per_position
            total = dense_bytes + sum(distinct) * expert_bytes + kv
            roof = total / bw * 1e3
            out["widths"][w] = {
                "replay_ms": ms,
                "distinct_experts_per_moe_layer": sum(distinct) / max(1, len(distinct)),
                "bytes_read_gb": total / 1e9,
                "roofline_ms": roof,
                "roofline_fraction": roof / ms,
            }
    del runner, model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> None:
    import functools
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["random:qwen3-8b", "random:qwen3-30b-a3b:layers=24"])
    ap.add_argument("--widths", type=int, nargs="+", default=list(range(1, 10)))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--mla", choices=["absorbed", "expanded"], default="absorbed", help="latent attention's cache (engine.mla)")
    ap.add_argument("--json", help="write the figures here too (-: to stdout, the table then to stderr)")
    a = ap.parse_args(argv)
    say = functools.partial(print, file=sys.stderr if a.json == "-" else sys.stdout)
    bw = copy_bandwidth(torch.device("cuda"))
    say(f"{torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s; context {a.context}")
    results = []
    for ref in a.model:
        r = measure(ref, a.widths, a.context, bw, a.mla)
        results.append(r)
        mla = f", {r['mla']} latent cache" if r["mla"] else ""
        say(f"\n{ref} ({r['layers']}; {r['step']}, attention {r['attention']}{mla}; dense weights {r['dense_weight_gb']:.2f} GB", end="")
        say(
            f", {r['experts']} experts top-{r['top_k']} on {r['moe_layers']} layers, {r['expert_mb']:.1f} MB each)" if r["experts"] else ")"
        )
        say(" width  replay ms  x width 1  distinct experts/layer  GB read  roofline ms  of roofline")
        base = r["widths"][a.widths[0]]["replay_ms"]
        for w, x in r["widths"].items():
            say(
                f" {w:5d}  {x['replay_ms']:9.3f}  {x['replay_ms'] / base:9.2f}  {x['distinct_experts_per_moe_layer']:22.1f}"
                f"  {x['bytes_read_gb']:7.2f}  {x['roofline_ms']:11.3f}  {x['roofline_fraction']:10.0%}"
            )
    if a.json:
        figures = {"device": torch.cuda.get_device_name(), "copy_bw_tb_s": bw / 1e12, "models": results}
        if a.json == "-":
            json.dump(figures, sys.stdout, indent=1)
        else:
            with open(a.json, "w") as f:
                json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
