"""Where the time of the EAGLE-3 draft chain goes on a GPU: replay times against the roofline, and a kernel table.

    python -m workers.drafters.eagle3.checkpoint --target random:llama-3-8b --draft-vocab 32000 --out /tmp/head8b
    python -m scripts.profile_chain --head /tmp/head8b --target random:llama-3-8b -k 4 --width 4 [--json OUT.json]

Builds the head as a decode does (`load_head`, bf16, on the GPU), then per chain body (the fast
head step of workers/drafters/eagle3/chain.py, and the eager head step) captures the chain of k
drafts after `width` fed entries as the drafter does and times its replays (CUDA events, median).
The roofline is the weight bytes k head steps stream (decoder layer, draft lm_head), plus fc once, over the
measured copy bandwidth. Then torch.profiler lists the fast chain's kernels by total time, with
their count per chain.
"""

from __future__ import annotations

import argparse
import json

import torch


def chain_weight_bytes(head) -> int:
    """Bytes one head step streams: the decoder layer and the draft lm_head (not fc: the verifier's
    states are fused once per chain, `fc_bytes`; not the embedding: one row is read)."""
    layer = sum(p.numel() * p.element_size() for p in head.midlayer.parameters())
    return layer + head.lm_head.weight.numel() * head.lm_head.weight.element_size()


def fc_bytes(head) -> int:
    return head.fc.weight.numel() * head.fc.weight.element_size()


def main(argv=None) -> None:
    from scripts.profile_step import copy_bandwidth, kernel_rows, replay_ms
    from workers.drafters.eagle3.chain import Eagle3Chain, HeadFastStep
    from workers.drafters.eagle3.checkpoint import load_head, target_embedding
    from workers.model.checkpoint import load_args, resolve_model_path
    from workers.spec import MAX_DRAFT_TOKENS
    from workers.spec.engine_config import EngineConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", required=True, help="EAGLE-3 head folder (public format)")
    ap.add_argument("--target", default="random:llama-3-8b")
    ap.add_argument("-k", type=int, default=4, help="drafts per chain")
    ap.add_argument("--width", type=int, default=4, help="entries fed before drafting (accepted + 1)")
    ap.add_argument("--max-seq", type=int, default=2048)
    ap.add_argument("--position", type=int, default=300, help="cache length when the chain starts")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_chain: needs a CUDA device")
    if not (1 <= a.width <= MAX_DRAFT_TOKENS + 1 and a.k >= 1 and a.position + a.width + a.k - 1 <= a.max_seq):
        raise SystemExit(f"profile_chain: need 1 <= --width <= {MAX_DRAFT_TOKENS + 1}, -k >= 1 and --position + width + k - 1 <= --max-seq")
    device = torch.device("cuda")
    args = load_args(a.target)
    embed = target_embedding(a.target, torch.bfloat16, device)
    bw = copy_bandwidth(device)
    out = {"k": a.k, "width": a.width, "copy_bw_tb_s": bw / 1e12, "bodies": {}}
    for body in ("fast", "eager"):
        head = load_head(resolve_model_path(a.head), embed, args, dtype=torch.bfloat16, device=device, max_seq=a.max_seq)
        fast = HeadFastStep(head, EngineConfig()) if body == "fast" else None
        cache = head.new_cache()
        chain = Eagle3Chain(head, cache, MAX_DRAFT_TOKENS + 1, capture=True, fast=fast)
        chain.warm(a.k)
        aux = torch.randn(a.width, head.fc.in_features, dtype=torch.bfloat16, device=device)
        cache.lengths[0] = a.position
        chain.draft(list(range(1, a.width + 1)), aux, a.k)  # captures (width, k)
        graph, _ = chain.graphs[(a.width, a.k)]
        ms = replay_ms(graph, device)
        nbytes = a.k * chain_weight_bytes(head) + fc_bytes(head)
        roof_ms = nbytes / bw * 1e3
        r = {"replay_ms": ms, "weight_gb": nbytes / 1e9, "roofline_ms": roof_ms, "roofline_fraction": roof_ms / ms}
        if fast is not None:
            r["attention"] = fast.attention
            rows = kernel_rows(graph.replay, unit="chain")
            r["kernels"] = rows[: a.top]
            r["kernel_us_total"] = sum(x["us_per_chain"] for x in rows)
            r["kernel_count"] = sum(x["count_per_chain"] for x in rows)
        out["bodies"][body] = r
        print(
            f"[{body}] chain of {a.k} after {a.width}: replay {ms:.3f} ms, roofline {roof_ms:.3f} ms ({roof_ms / ms:.0%}), "
            f"{nbytes / 1e9:.2f} GB at {bw / 1e12:.2f} TB/s",
            flush=True,
        )
        for x in r.get("kernels", []):
            print(f"  {x['us_per_chain']:8.1f} us  x{x['count_per_chain']:4.0f}  {x['kernel']}")
        del head, chain, cache, fast
        torch.cuda.empty_cache()
    out["eager_over_fast"] = out["bodies"]["eager"]["replay_ms"] / out["bodies"]["fast"]["replay_ms"]
    print(f"eager / fast: {out['eager_over_fast']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
