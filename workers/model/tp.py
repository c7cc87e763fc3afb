"""Tensor parallelism: which part of each weight a rank holds, and the pass that keeps only that part.

    parts(args, TPPart(rank, world, vocab_parallel))   # {param name: Part(dim, start, end)}: the one slicing rule
    load_model(path, tp=TPPart(...)); hook(model, part, allreduce)  # (workers/model/checkpoint.py) reads only the part

- Attention is split by query head: rank r keeps a contiguous, balanced range of query heads
  (uneven when the head count does not divide, e.g. SmolLM2's 9 heads at TP 2 -> 5 + 4) and the
  KV heads those query heads read (a KV head whose group straddles two ranks is kept by both).
  q/k/v (and their biases) are column-parallel (output rows sliced), o_proj row-parallel (input columns sliced).
- Latent attention (DeepSeek-V3) is split by head the same way: the per-head up-projections
  (q_b_proj, or q_proj without a query bottleneck; kv_b_proj) column-parallel, o_proj row-parallel;
  the latent down-projections (q_a_proj, kv_a_proj_with_mqa) and their norms replicated, so each
  rank computes the whole latent and expands only its heads.
- The MLP is column-parallel in gate/up and row-parallel in down. An MoE layer's experts are split
  the same way, each by its own intermediate dimension (every rank holds 1/TP of every expert, so
  routing needs no exchange), and its shared experts likewise; the router is replicated.
- Each row-parallel output is a partial sum; it goes through the one `allreduce` object
  (`Attention.reduce`, `MLP.reduce`, `MoE.reduce` on routed + shared): the single place where comm
  backends plug in, once after attention and once after the MLP or MoE.
- lm_head is replicated, or vocab-parallel (rows sliced, logits all-gathered) when asked and the
  vocabulary divides. Embeddings and norms are replicated.

`slice_params` applies `parts` to a model's parameters, real or on the meta device (the loader
slices an empty model first, then reads exactly those parts from the checkpoint); `hook` sets the
allreduce hooks and the local KV-head map on the materialised model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from workers.model.args import ModelArgs
from workers.model.transformer import Transformer


@dataclass(frozen=True)
class Part:
    """The part of a full tensor a rank holds: indices [start, end) along `dim`."""

    dim: int
    start: int
    end: int


@dataclass(frozen=True)
class TPPart:
    """Which rank of how many, and whether lm_head is split by vocabulary."""

    rank: int = 0
    world: int = 1
    vocab_parallel: bool = False

    def splits_vocab(self, args: ModelArgs) -> bool:
        return self.world > 1 and self.vocab_parallel and args.vocab_size % self.world == 0


def head_range(n_heads: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of the query heads rank `rank` holds: balanced, earlier ranks take the remainder."""
    base, extra = divmod(n_heads, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _heads(args: ModelArgs, tp: TPPart) -> tuple[int, int, int, int]:
    """(q0, q1, kv0, kv1): the rank's query heads and the KV heads they read."""
    group = args.n_heads // args.n_kv_heads
    q0, q1 = head_range(args.n_heads, tp.rank, tp.world)
    return q0, q1, q0 // group, (q1 - 1) // group + 1


def parts(args: ModelArgs, tp: TPPart, mtp: bool = False) -> dict[str, Part]:
    """Every parameter rank `tp.rank` holds only a part of, by its model name (a checkpoint's name
    without the `model.` prefix); a name not here is replicated whole. mtp: the model holds the MTP
    layer (`mtp.`), its block split as the layers are (its eh_proj and norms replicated)."""
    if tp.world == 1:
        return {}
    hd = args.head_dim
    q0, q1, kv0, kv1 = _heads(args, tp)
    inter = args.intermediate_size // tp.world
    q, kv = Part(0, q0 * hd, q1 * hd), Part(0, kv0 * hd, kv1 * hd)
    up, down = Part(0, tp.rank * inter, (tp.rank + 1) * inter), Part(1, tp.rank * inter, (tp.rank + 1) * inter)
    out: dict[str, Part] = {}
    if args.moe is not None:
        e_inter = args.moe.intermediate_size // tp.world
        e_up, e_down = Part(1, tp.rank * e_inter, (tp.rank + 1) * e_inter), Part(2, tp.rank * e_inter, (tp.rank + 1) * e_inter)
        s_inter = args.moe.n_shared_experts * e_inter  # the shared experts: one SwiGLU of n_shared x I
        s_up, s_down = Part(0, tp.rank * s_inter, (tp.rank + 1) * s_inter), Part(1, tp.rank * s_inter, (tp.rank + 1) * s_inter)
    blocks = [(f"layers.{i}.", args.is_moe(i)) for i in range(args.n_layers)] + ([("mtp.", args.mtp_moe)] if mtp else [])
    for prefix, is_moe in blocks:
        a, m = prefix + "self_attn.", prefix + "mlp."
        if args.mla:
            out.update(_latent_attention_parts(args, a, q0, q1))
        else:
            out.update(
                {a + "q_proj.weight": q, a + "k_proj.weight": kv, a + "v_proj.weight": kv, a + "o_proj.weight": Part(1, q0 * hd, q1 * hd)}
            )
        if is_moe:  # stacked experts [E, I, dim] / [E, dim, I] (workers/model/moe.py)
            out.update({m + "experts.gate_proj": e_up, m + "experts.up_proj": e_up, m + "experts.down_proj": e_down})
            if s_inter:
                out.update({m + f"shared_experts.{n}.weight": s_up for n in ("gate_proj", "up_proj")})
                out[m + "shared_experts.down_proj.weight"] = s_down
        else:
            out.update({m + "gate_proj.weight": up, m + "up_proj.weight": up, m + "down_proj.weight": down})
        if args.attention_bias:
            out.update({a + "q_proj.bias": q, a + "k_proj.bias": kv, a + "v_proj.bias": kv})
    if tp.splits_vocab(args):
        v = args.vocab_size // tp.world
        out["lm_head.weight"] = Part(0, tp.rank * v, (tp.rank + 1) * v)
    return out


def _latent_attention_parts(args: ModelArgs, a: str, q0: int, q1: int) -> dict[str, Part]:
    """Heads q0 .. q1 - 1 of a latent attention layer (prefix `a`): their rows of the per-head
    up-projections, their columns of o_proj; the rest is replicated."""
    m = args.mla
    q_name = "q_proj.weight" if m.q_lora_rank is None else "q_b_proj.weight"
    kv = m.qk_nope_head_dim + m.v_head_dim  # kv_b_proj's rows per head: [k_nope | v]
    return {
        a + q_name: Part(0, q0 * m.qk_head_dim, q1 * m.qk_head_dim),
        a + "kv_b_proj.weight": Part(0, q0 * kv, q1 * kv),
        a + "o_proj.weight": Part(1, q0 * m.v_head_dim, q1 * m.v_head_dim),
    }


def slice_params(model: Transformer, tp: TPPart) -> Transformer:
    """Keep only this rank's part of every parameter (`parts`), in place; works on the meta device."""
    args = model.args
    if tp.vocab_parallel and tp.world > 1 and not tp.splits_vocab(args):
        print(
            f"spectune: vocab_parallel ignored: vocabulary {args.vocab_size} does not divide by tp={tp.world}; lm_head stays replicated",
            file=sys.stderr,
            flush=True,
        )
    if tp.splits_vocab(args) and model.lm_head.weight is model.embed_tokens.weight:  # untie first: the embedding stays whole
        model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone(), requires_grad=False)
    for name, part in parts(args, tp, mtp=model.mtp is not None).items():
        owner, attr = name.rsplit(".", 1)
        module = model.get_submodule(owner)
        kept = getattr(module, attr).detach().narrow(part.dim, part.start, part.end - part.start).clone()
        setattr(module, attr, nn.Parameter(kept, requires_grad=False))
        if attr == "weight" and isinstance(module, nn.Linear):
            if part.dim == 0:
                module.out_features = part.end - part.start
            else:
                module.in_features = part.end - part.start
    return model


def hook(model: Transformer, tp: TPPart, allreduce) -> Transformer:
    """Route row-parallel outputs through `allreduce`, gather a split vocabulary, and map each local
    query head to its local KV head (on the model's device). The weights must be sliced already."""
    if tp.world == 1:
        return model
    args = model.args
    group = args.n_heads // args.n_kv_heads
    q0, q1, kv0, _ = _heads(args, tp)
    for layer in model.blocks():
        attn = layer.self_attn
        attn.kv_map = torch.tensor(
            [h // group - kv0 for h in range(q0, q1)], device=attn.o_proj.weight.device
        )  # no floor-divide op: on meta it would import torch._dynamo
        regular = q0 % group == 0 and q1 % group == 0  # whole KV groups: local head h reads KV h // group
        attn.gqa_group = group if regular else 0
        attn.reduce = allreduce
        layer.mlp.reduce = allreduce
    if tp.splits_vocab(args):
        model.gather_vocab = allreduce.all_gather_last
    return model
