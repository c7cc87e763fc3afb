"""Mixture-of-experts MLP: a router picks `top_k` of `n_experts` SwiGLU experts per token; the layer's
output is the routed experts' outputs weighted by the router's scores, plus the shared experts'
(a dense SwiGLU every token goes through) where the family has them.

    moe = MoE(args, shared=None)    # args.moe: workers/model/args.py MoEArgs; shared: a dense MLP or None
    y = moe(x)                      # x [B, T, dim] -> [B, T, dim] (through `reduce`, the TP allreduce)

Expert weights are stacked per layer: `experts.gate_proj` / `experts.up_proj` [E, I, dim],
`experts.down_proj` [E, dim, I]. A Hugging Face checkpoint stores each expert's matrices apart
(`mlp.experts.{e}.gate_proj.weight`); workers/model/checkpoint.py stacks them while loading.
Tensor parallelism splits every expert by its intermediate dimension I (workers/model/tp.py): each
rank holds 1/TP of every expert and of the shared experts, the router is replicated, and the
partial sums of the routed and shared outputs go through one allreduce together, as a dense MLP's do.

The routing rule of each family is a router (`make_router`): softmax top-k (`Router`, Qwen3-MoE) or
DeepSeek-V3's grouped sigmoid top-k (`GroupedSigmoidRouter`), each returning (weights [N, k],
expert ids [N, k]) with static shapes, nothing read back to the host; shared experts are the
`shared` dense path.

Two ways to run the experts, the same numbers:
- `experts_by_expert` (eager): a loop over the experts some token chose, each reading its weights
  once for all its tokens, contributions summed per token in ascending expert id (transformers'
  order, so float32 results match it bit for bit where the GEMMs do). It reads routing results on
  the host: not for CUDA graphs. Eager passes run it unless the engine sets `eager_experts` (on CUDA,
  the grouped kernel: a prefill's dozens of experts a layer in two kernels, not a launch each).
- `experts_dense` (graph-safe, any device): every expert over every token, unrouted pairs weighted
  0. Static shapes, no host sync; reads every expert, so it is the fallback inside CUDA graphs
  where the grouped Triton kernel (workers/kernels/moe.py) cannot run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workers.model.args import ModelArgs, MoEArgs


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
        return softmax_top_k(x, self.weight, self.top_k, self.norm_topk_prob)


def softmax_top_k(x: torch.Tensor, weight: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`Router`'s rule as a function of tensors and constants (no module: one torch.compile'd graph
    serves every layer, workers/engine/fused_step.py)."""
    probs = torch.softmax(F.linear(x, weight), dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), ids


class GroupedSigmoidRouter(nn.Module):
    """DeepSeek-V3's router (transformers' DeepseekV3TopkRouter; `noaux_tc` in DeepSeek's code), in
    float32 whatever the model's dtype (its weight and bias are kept float32, `keeps_float32`):

        s      = sigmoid(W x)                              [N, E] scores
        b      = s + e_score_correction_bias               what the choice ranks (never a weight)
        group  = sum of the 2 largest b in each of n_group groups of E / n_group experts
        choose = top_k of b among the experts of the topk_group best groups
        w      = s[choose], / (sum + 1e-20) when norm_topk_prob, then x routed_scaling_factor

    With topk_group = n_group every group is kept (n_group 1: Kimi-K2), and the group step is
    skipped: it would mask nothing."""

    keeps_float32 = True

    def __init__(self, dim: int, m: MoEArgs):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(m.n_experts, dim))
        self.e_score_correction_bias = nn.Parameter(torch.empty(m.n_experts))
        self.top_k, self.norm_topk_prob, self.scaling = m.top_k, m.norm_topk_prob, m.routed_scaling_factor
        self.n_group, self.topk_group = m.n_group, m.topk_group

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, dim] -> (weights [N, k] in x's dtype, expert ids [N, k])."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        biased = scores + self.e_score_correction_bias.float()
        if self.topk_group < self.n_group:
            N, E = biased.shape
            group_scores = biased.view(N, self.n_group, E // self.n_group).topk(2, dim=-1)[0].sum(dim=-1)
            best = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
            keep = torch.zeros_like(group_scores).scatter_(1, best, 1.0)
            keep = keep[:, :, None].expand(N, self.n_group, E // self.n_group).reshape(N, E)
            biased = biased.masked_fill(keep == 0, float("-inf"))
        ids = biased.topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * self.scaling).to(x.dtype), ids


def make_router(dim: int, m: MoEArgs) -> nn.Module:
    """The router of `m.router`: x [N, dim] -> (weights [N, k], ids [N, k])."""
    if m.router == "softmax":
        return Router(dim, m.n_experts, m.top_k, m.norm_topk_prob)
    if m.router == "sigmoid_grouped":
        return GroupedSigmoidRouter(dim, m)
    raise ValueError(f"unknown router {m.router!r}")


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
# route(router, x [N, dim]) -> (weights [N, k], ids [N, k]): how a step runs the router (default: the module)
RouteFn = Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class MoE(nn.Module):
    """Router `gate`, routed `experts`, optional `shared_experts` (a dense SwiGLU module whose own
    `reduce` is never set: its partial sum joins the routed one before this layer's allreduce)."""

    def __init__(self, args: ModelArgs, shared: nn.Module | None = None):
        super().__init__()
        m = args.moe
        self.gate = make_router(args.dim, m)
        self.experts = Experts(m.n_experts, args.dim, m.intermediate_size)
        self.shared_experts = shared
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = _identity
        # what a CUDA graph capture runs (the engine sets the grouped kernel where it runs): the
        # eager loop reads routing results on the host, which a capture cannot
        self.graph_experts: ExpertsFn = experts_dense
        # what an eager pass (prefill, the census) runs; the engine may set the grouped kernel on CUDA
        self.eager_experts: ExpertsFn = experts_by_expert
        # workers/engine/experts.py: when a list, every eager pass appends its tokens' expert ids here
        self.census: list[torch.Tensor] | None = None

    def routed(self, h: torch.Tensor, run_experts: ExpertsFn | None = None, route: RouteFn | None = None) -> torch.Tensor:
        """The routed experts' output of normed h [..., dim], before the allreduce (no shared experts).
        run_experts: the experts' way (default: the graph's or the eager one); route: the router's (default:
        the module; the fused step's compiled or Triton copy of the same rule)."""
        flat = h.reshape(-1, h.shape[-1])
        weights, ids = self.gate(flat) if route is None else route(self.gate, flat)
        if self.census is not None:
            self.census.append(ids.detach().cpu())
        if run_experts is None:
            capturing = flat.is_cuda and torch.cuda.is_current_stream_capturing()
            run_experts = self.graph_experts if capturing else self.eager_experts
        return run_experts(flat, weights, ids, self.experts).view(h.shape)

    def local(self, h: torch.Tensor, run_experts: ExpertsFn | None = None) -> torch.Tensor:
        """This rank's part of the layer's output: routed + shared experts (transformers' order of
        the sum), before the allreduce."""
        out = self.routed(h, run_experts)
        if self.shared_experts is not None:
            out = out + self.shared_experts(h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.local(x))
