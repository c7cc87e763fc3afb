"""Tensor parallelism as a pass over a loaded `Transformer`: each rank keeps its slice, in place.

    shard(model, rank, world, allreduce, vocab_parallel=False)

- Attention is split by query head: rank r keeps a contiguous, balanced range of query heads
  (uneven when the head count does not divide, e.g. SmolLM2's 9 heads at TP 2 -> 5 + 4) and the
  KV heads those query heads read (a KV head whose group straddles two ranks is kept by both).
  q/k/v are column-parallel (output rows sliced), o_proj row-parallel (input columns sliced).
- The MLP is column-parallel in gate/up and row-parallel in down.
- Each row-parallel output is a partial sum; it goes through the one `allreduce` object
  (`Attention.reduce`, `MLP.reduce`): the single place where comm backends plug in.
- lm_head is replicated, or vocab-parallel (rows sliced, logits all-gathered) when asked and the
  vocabulary divides. Embeddings and norms are replicated.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from workers.model.args import check_tp
from workers.model.transformer import Transformer


def head_range(n_heads: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of the query heads rank `rank` holds: balanced, earlier ranks take the remainder."""
    base, extra = divmod(n_heads, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _slice_linear(linear: nn.Linear, dim: int, start: int, end: int) -> None:
    """Keep rows (dim=0, output features) or columns (dim=1, input features) [start, end)."""
    w = linear.weight.detach().narrow(dim, start, end - start).clone()
    linear.weight = nn.Parameter(w, requires_grad=False)
    if dim == 0:
        linear.out_features = end - start
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.detach()[start:end].clone(), requires_grad=False)
    else:
        linear.in_features = end - start


def shard(model: Transformer, rank: int, world: int, allreduce, vocab_parallel: bool = False) -> Transformer:
    args = model.args
    check_tp(args, world)
    if world == 1:
        return model
    hd = args.head_dim
    group = args.n_heads // args.n_kv_heads
    q0, q1 = head_range(args.n_heads, rank, world)
    kv0, kv1 = q0 // group, (q1 - 1) // group + 1
    inter = args.intermediate_size // world
    for layer in model.layers:
        attn = layer.self_attn
        _slice_linear(attn.q_proj, 0, q0 * hd, q1 * hd)
        _slice_linear(attn.k_proj, 0, kv0 * hd, kv1 * hd)
        _slice_linear(attn.v_proj, 0, kv0 * hd, kv1 * hd)
        _slice_linear(attn.o_proj, 1, q0 * hd, q1 * hd)
        attn.kv_map = torch.arange(q0, q1, device=attn.kv_map.device) // group - kv0
        regular = q0 % group == 0 and q1 % group == 0  # whole KV groups: local head h reads KV h // group
        attn.gqa_group = group if regular else 0
        attn.reduce = allreduce
        mlp = layer.mlp
        _slice_linear(mlp.gate_proj, 0, rank * inter, (rank + 1) * inter)
        _slice_linear(mlp.up_proj, 0, rank * inter, (rank + 1) * inter)
        _slice_linear(mlp.down_proj, 1, rank * inter, (rank + 1) * inter)
        mlp.reduce = allreduce
    if vocab_parallel and args.vocab_size % world:
        print(f"spectune: vocab_parallel ignored: vocabulary {args.vocab_size} does not divide by tp={world}; lm_head stays replicated",
              file=sys.stderr, flush=True)
    if vocab_parallel and args.vocab_size % world == 0:
        v = args.vocab_size // world
        if args.tie_embeddings:  # untie first: the embedding stays whole
            model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone(), requires_grad=False)
        _slice_linear(model.lm_head, 0, rank * v, (rank + 1) * v)
        model.gather_vocab = allreduce.all_gather_last
    return model
