"""Mixture-of-experts MLP: a router picks `top_k` of `n_experts` SwiGLU experts per token; the layer's
output is the routed experts' outputs weighted by the router's scores.

    moe = MoE(args)                 # args.moe: workers/model/args.py MoEArgs
    y = moe(x)                      # x [B, T, dim] -> [B, T, dim] (through `reduce`, the TP allreduce)

Expert weights are stacked per layer: `experts.gate_proj` / `experts.up_proj` [E, I, dim],
`experts.down_proj` [E, dim, I]. A Hugging Face checkpoint stores each expert's matrices apart
(`mlp.experts.{e}.gate_proj.weight`); workers/model/checkpoint.py stacks them while loading.
Tensor parallelism splits every expert by its intermediate dimension I (workers/model/tp.py): each
rank holds 1/TP of every expert, the router is replicated, and the partial sums of the routed
outputs go through one allreduce, as a dense MLP's do.

The routing rule of each family is a `Router` (softmax top-k for Qwen3-MoE); a family with shared
experts or another scoring adds a router and a shared path here, not another MoE layer.

Two ways to run the experts, the same numbers:
- `experts_by_expert` (eager): a loop over the experts some token chose, each reading its weights
  once for all its tokens, contributions summed per token in ascending expert id (transformers'
  order, so float32 results match it bit for bit where the GEMMs do). It reads routing results on
  the host: not for CUDA graphs.
- `experts_dense` (graph-safe, any device): every expert over every token, unrouted pairs weighted
  0. Static shapes, no host sync; reads every expert, so it is the fallback inside CUDA graphs
  where the grouped Triton kernel (workers/kernels/moe.py) cannot run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workers.model.args import ModelArgs


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Router(nn.Module):
    """Softmax top-k (Qwen3-MoE): probabilities over all experts in float32, the k largest kept,
    renormalised to sum 1 when `norm_topk_prob`, then cast to the activations' dtype."""

    def __init__(self, dim: int, n_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, dim))
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, dim] -> (weights [N, k] in x's dtype, expert ids [N, k])."""
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids


class Experts(nn.Module):
    """Stacked expert weights (module names as the loader maps a checkpoint's per-expert tensors)."""

    def __init__(self, n_experts: int, dim: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(n_experts, inter, dim))
        self.up_proj = nn.Parameter(torch.empty(n_experts, inter, dim))
        self.down_proj = nn.Parameter(torch.empty(n_experts, dim, inter))

    @property
    def n_experts(self) -> int:
        return self.gate_proj.shape[0]


def experts_by_expert(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """sum_k weights[n, k] * expert_{ids[n, k]}(x[n]) for x [N, dim], summed per token in ascending
    expert id starting from zero (transformers' index_add order)."""
    out = torch.zeros_like(x)
    hit = torch.bincount(ids.flatten(), minlength=experts.n_experts).nonzero().flatten().tolist()
    for e in hit:
        token, slot = torch.where(ids == e)
        h = x[token]
        h = F.silu(F.linear(h, experts.gate_proj[e])) * F.linear(h, experts.up_proj[e])
        out.index_add_(0, token, F.linear(h, experts.down_proj[e]) * weights[token, slot, None])
    return out


def experts_dense(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The same sum with static shapes: every expert over all N tokens, a token's weight for an
    expert it did not choose being 0 (no host sync; reads all E experts)."""
    E = experts.n_experts
    dense_w = torch.zeros(x.shape[0], E, dtype=x.dtype, device=x.device).scatter_(1, ids, weights)  # [N, E]
    out = torch.zeros_like(x)
    for e in range(E):
        h = F.silu(F.linear(x, experts.gate_proj[e])) * F.linear(x, experts.up_proj[e])
        out = out + F.linear(h, experts.down_proj[e]) * dense_w[:, e, None]
    return out


# experts(x [N, dim], weights [N, k], ids [N, k], experts) -> [N, dim]: how a step runs the routed experts
ExpertsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Experts], torch.Tensor]


class MoE(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        m = args.moe
        self.gate = Router(args.dim, m.n_experts, m.top_k, m.norm_topk_prob)
        self.experts = Experts(m.n_experts, args.dim, m.intermediate_size)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _identity
        # what a CUDA graph capture runs (the engine sets the grouped kernel where it runs): the
        # eager loop reads routing results on the host, which a capture cannot
        self.graph_experts: ExpertsFn = experts_dense

    def routed(self, h: torch.Tensor, run_experts: ExpertsFn | None = None) -> torch.Tensor:
        """The routed experts' output of normed h [..., dim], before the allreduce."""
        flat = h.reshape(-1, h.shape[-1])
        weights, ids = self.gate(flat)
        if run_experts is None:
            capturing = flat.is_cuda and torch.cuda.is_current_stream_capturing()
            run_experts = self.graph_experts if capturing else experts_by_expert
        return run_experts(flat, weights, ids, self.experts).view(h.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.routed(x))
