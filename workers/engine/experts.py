"""How many distinct routed experts a verify pass of an MoE verifier reads (Workload.count_experts).

A verify pass of W tokens reads, in every MoE layer, the union of the experts its W tokens route to: at
batch 1 that union, not the model's active-parameter count, is what a deeper k costs. After a run the
verifier feeds each decoded sequence (prompt and output) through the model once, untimed and eager, with
every MoE layer recording its tokens' expert ids (MoE.census), then counts the union over consecutive
passes of W output tokens, for W = 1 .. MAX_WIDTH:

    union(W) = mean over MoE layers and over passes [P + jW, P + (j + 1)W) of |experts of those tokens|

(P: the prompt's length; a last pass shorter than W is left out). A token's routing depends only on the
tokens before it, so one forward of the whole sequence routes each output token as decoding did (up to
floating-point order). Random weights route almost uniformly: their union is an upper bound on what real
text reads. Every rank runs the forward (its allreduces are collective); rank 0 counts.

    totals = count_experts(model, [prompt + output, ...], [len(prompt), ...])   # {W: (sum, layer-passes)}
"""

from __future__ import annotations

import torch

from workers.model.moe import MoE

MAX_WIDTH = 9  # k + 1 for k up to 8: the widths the report's table shows


def moe_layers(model) -> list[MoE]:
    """The verifier's MoE layers (an MTP layer's drafts are not the verifier's pass)."""
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]


@torch.no_grad()
def count_experts(model, sequences: list[list[int]], prompt_lengths: list[int], cache) -> dict[int, tuple[float, int]]:
    """{W: (distinct experts summed over layers and passes, number of layer-passes)}; {} for a dense model.
    `cache`: the run's KV cache, reused (reset before each sequence; the next prompt resets it again)."""
    layers = moe_layers(model)
    if not layers:
        return {}
    totals = {W: [0.0, 0] for W in range(1, MAX_WIDTH + 1)}
    device = next(model.parameters()).device
    for seq, start in zip(sequences, prompt_lengths):
        if len(seq) <= start:
            continue
        for layer in layers:
            layer.census = []
        try:
            cache.reset()
            model.hidden(torch.tensor([seq], device=device), cache)
            routed = [torch.cat(layer.census)[start:] for layer in layers]  # [output tokens, top_k] per layer
        finally:
            for layer in layers:
                layer.census = None
        for W, acc in totals.items():
            for ids in routed:
                sizes = union_sizes(ids, W)
                acc[0] += sum(sizes)
                acc[1] += len(sizes)
    return {W: (total, n) for W, (total, n) in totals.items() if n}


def union_sizes(ids: torch.Tensor, width: int) -> list[int]:
    """|experts of tokens [jW, (j + 1)W)| for each whole pass j of `ids` [tokens, top_k] (one layer's routing)."""
    passes = ids.shape[0] // width
    if passes == 0:
        return []
    chunks = ids[: passes * width].reshape(passes, -1)  # one row per pass: its tokens' expert ids
    return [len(set(row.tolist())) for row in chunks]
