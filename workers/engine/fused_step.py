"""The CUDA fast path of a decode / verify step: merged projections, torch.compile'd pieces, one layer loop.

A step of a few tokens streams every weight once, so its time is the weight bytes over memory
bandwidth plus a floor of ~2-3 us per kernel, even inside a CUDA graph. The plain model launches
~45 small kernels per layer (norms, rope, SiLU, casts); here every layer runs

    QKV GEMM of the normed h (merged q/k/v weights); [Qwen3: RMSNorm of each q and k head];
    rope; K/V into the cache; attention; o_proj
    join:  x += allreduce(o_proj output); h = norm(x)
    gate/up GEMM (merged weights) with SiLU * up; down   [MoE layer: router, then the routed
                                                          experts (`EngineConfig.moe_kernel`)]
    join:  x += allreduce(down output); h = next layer's norm(x) (the final norm after the last)

Two choices are branches inside that one body, fixed when the step is built:
- the GEMMs: with `EngineConfig.gemv` other than off, each goes through workers/kernels/gemv.py's
  picker (cuBLAS or a Triton GEMV per shape and width, SiLU * up in the gate/up GEMM's epilogue);
  with off, plain GEMMs (the MLP one compiled body: GEMM, SiLU * up, GEMM);
- the join: where the allreduce adds the residual and applies the next norm in its own kernel
  (`AllReduce.fuses_add_norm`, a property of the backend fixed when it was built, e.g.
  symm_mem_ll) and `EngineConfig.fused_add_norm` is on, the join is that one kernel; otherwise the
  allreduce, then one compiled add + norm.
With `model.aux_layers` set (EAGLE-3) the residual stream entering those layers is kept in
`model.aux`, as the plain model keeps it. The QKV projection and rope are one compiled body for SDPA; with the Triton attention
(workers/kernels/attention.py `rope_write_attend`) Qwen3's q/k norm, rope and the cache write are
one kernel reading the merged projection, then the attention kernel. The cache write stays outside the compiled regions on
purpose: an in-place write to a graph input is functionalised by Inductor into a copy of the whole
per-layer cache. Weights are shared with the plain model (views of the merged tensors), so the
prefill and the CPU path are unchanged.

    fast = FusedStep(model, EngineConfig(), allreduce)     # merges weights once
    h = fast.hidden_at(tokens, pos, cache, kv_len)
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F

from workers.model.moe import MoE
from workers.model.rope import apply_rope
from workers.model.transformer import LatentAttention, Transformer, attend, rms_norm, silu_mul
from workers.spec.engine_config import EngineConfig


def _norm_body(x, norm_w, eps: float):
    return rms_norm(x, norm_w, eps)


def _add_norm_body(x, delta, norm_w, eps: float):
    # a row-parallel output joins the residual stream, and the next norm reads it
    x = x + delta
    return x, rms_norm(x, norm_w, eps)


def _qkv_from_normed(h, wqkv, bqkv, cos, sin, nq: int, nkv: int, hd: int, qk_norm=None):
    # no module in the arguments: every layer shares one compiled graph per step width.
    # qk_norm: (q weight, k weight, eps) of Qwen3's per-head RMSNorm, applied before rope
    B, T, _ = h.shape
    q, k, v = F.linear(h, wqkv, bqkv).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
    q, k = q.view(B, T, nq, hd), k.view(B, T, nkv, hd)
    if qk_norm is not None:
        q, k = rms_norm(q, qk_norm[0], qk_norm[2]), rms_norm(k, qk_norm[1], qk_norm[2])
    q = apply_rope(q.transpose(1, 2), cos, sin)
    k = apply_rope(k.transpose(1, 2), cos, sin)
    return q, k, v.view(B, T, nkv, hd).transpose(1, 2)


def _mlp_core(h, w_gate_up, w_down):
    return F.linear(silu_mul(F.linear(h, w_gate_up)), w_down)


def _merge(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several Linears with the same input; the Linears become views of it."""
    w = torch.cat([m.weight.detach() for m in linears], dim=0)
    b = torch.cat([m.bias.detach() for m in linears], dim=0) if linears[0].bias is not None else None
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(w[start : start + n], requires_grad=False)
        if b is not None:
            m.bias = torch.nn.Parameter(b[start : start + n], requires_grad=False)
        start += n
    return w, b


class FusedStep:
    """engine: compile (torch.compile the bodies), gemv (the picker's mode, or off) and
    fused_add_norm; allreduce: the TP allreduce the row-parallel outputs go through (None: a
    model of one rank). attend_fn: the attention core (None: SDPA over the masked cache)."""

    def __init__(self, model: Transformer, engine: EngineConfig, allreduce=None, attend_fn=None):
        if any(
            isinstance(layer.self_attn, LatentAttention) or getattr(layer.mlp, "shared_experts", None) is not None for layer in model.layers
        ):
            # DeepSeek-V3: the graphed steps run the plain model (`try_fused` falls back to it)
            raise NotImplementedError("no fused step for latent attention or shared experts (deepseek_v3)")
        self.model, self.engine, self.allreduce = model, engine, allreduce
        # attend_fn(q, k, v, mask, k_cache, v_cache, pos, gqa_group, kv_map) -> [B, T, H * D]
        self.attend_fn = attend_fn or attend
        self.needs_mask = attend_fn is None  # the Triton attention reads positions, not a mask
        # the join in the allreduce's kernel: the backend's fixed capability and the engine's choice
        self.fuse_norms = bool(engine.fused_add_norm and allreduce is not None and allreduce.fuses_add_norm)
        self.merged = []
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv, bqkv = _merge([a.q_proj, a.k_proj, a.v_proj])
            wgu = None if isinstance(m, MoE) else _merge([m.gate_proj, m.up_proj])[0]  # an MoE layer keeps its stacked experts
            self.merged.append((wqkv, bqkv, wgu))
        # an MoE layer's routed experts inside the graphs: the grouped kernel where it runs (moe_kernel
        # auto or triton), else the graph-safe dense loop (workers/model/moe.py)
        self.experts_fn, self.route_fn = None, None
        if any(w is None for _, _, w in self.merged):
            from workers.kernels import moe as moe_kernels
            from workers.model.moe import Router, experts_dense, softmax_top_k

            device = model.embed_tokens.weight.device
            if engine.moe_kernel == "triton" and not moe_kernels.available(device):
                raise RuntimeError("engine.moe_kernel=triton: the grouped MoE kernel does not run here (no Triton for this device)")
            grouped = engine.moe_kernel != "dense" and moe_kernels.available(device)
            self.experts_fn = moe_kernels.grouped_experts if grouped else experts_dense
            if grouped and engine.compile:
                # a width-1 MoE step is a floor of small kernels (the pairing, the pairs' sum; the router
                # below): compiled, each becomes one or two
                compiled = {f: torch.compile(getattr(moe_kernels, f), dynamic=False) for f in ("group_pairs", "sum_pairs")}
                self.experts_fn = functools.partial(
                    moe_kernels.grouped_experts, group=compiled["group_pairs"], combine=compiled["sum_pairs"]
                )
            if engine.compile and all(isinstance(layer.mlp.gate, Router) for layer in model.layers if isinstance(layer.mlp, MoE)):
                # the router: its GEMM and one Triton kernel where the grouped kernels run, else compiled
                # torch (also beside the dense experts); the eager passes keep the module's
                route = moe_kernels.softmax_top_k if grouped else torch.compile(softmax_top_k, dynamic=False)
                self.route_fn = lambda gate, x: route(x, gate.weight, gate.top_k, gate.norm_topk_prob)
        # an attention that takes the merged projection, applies rope and writes the cache itself
        # (one kernel where the compiled rope and the eager cache writes took four per layer)
        self.rope_attend = getattr(attend_fn, "with_rope", None)
        self.norm_body, self.add_norm_body, self.qkv_from_normed = _norm_body, _add_norm_body, _qkv_from_normed
        self.mlp_core, self.silu_mul = _mlp_core, silu_mul
        if engine.compile:
            # an alias: `import torch._dynamo` here would make `torch` a local name of the whole method
            import torch._dynamo as dynamo

            # one compiled graph per (rows, width): batch 1's widths and every batch size's (workers/engine/batched.py)
            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 256)
            dynamo.config.accumulated_cache_size_limit = max(dynamo.config.accumulated_cache_size_limit, 1024)
            self.norm_body = torch.compile(_norm_body, dynamic=False)
            self.add_norm_body = torch.compile(_add_norm_body, dynamic=False)
            self.qkv_from_normed = torch.compile(_qkv_from_normed, dynamic=False)
            self.mlp_core = torch.compile(_mlp_core, dynamic=False)
            self.silu_mul = torch.compile(silu_mul, dynamic=False)
        # the GEMV picker races on CUDA only; a forced mode (cublas, triton) builds it anywhere
        # (CPU tests of the layout, Triton under its interpreter)
        self.gemv = None
        device = model.embed_tokens.weight.device
        if engine.gemv != "off" and (device.type == "cuda" or engine.gemv != "auto"):
            from workers.kernels.gemv import GemvPicker

            # QKV goes through the picker only into the Triton rope + attention (with SDPA it stays
            # in the compiled rope body), so only then does it get a race
            qkv = [w for w, _, _ in self.merged] if self.rope_attend is not None else []
            self.gemv = GemvPicker(
                {
                    "qkv": qkv,
                    "gate_up": [w for _, _, w in self.merged if w is not None],
                    "o": [layer.self_attn.o_proj.weight for layer in model.layers],
                    "down": [layer.mlp.down_proj.weight for layer in model.layers if not isinstance(layer.mlp, MoE)],
                },
                mode=engine.gemv,
                silu_mul=self.silu_mul,
            )

    def _linear(self, role: str, x, w, b=None):
        return F.linear(x, w, b) if self.gemv is None else self.gemv.linear(role, x, w, b)

    def _mlp(self, h, w_gate_up, mlp):
        """down(silu(gate) * up) of the normed `h`: one compiled body, or the picker's two GEMMs; an
        MoE layer's routed experts (before the allreduce)."""
        if w_gate_up is None:
            return mlp.routed(h, self.experts_fn, self.route_fn)
        w_down = mlp.down_proj.weight
        if self.gemv is None:
            return self.mlp_core(h, w_gate_up, w_down)
        return self.gemv.linear("down", self.gemv.swiglu("gate_up", h, w_gate_up), w_down)

    def _join(self, partial, x, norm):
        """x + allreduce(partial) and norm of it: one allreduce kernel where it fuses the add and the
        norm, else the allreduce, then one compiled add + norm."""
        if self.fuse_norms:
            return self.allreduce.add_norm(partial, x, norm.weight, norm.eps)
        if self.allreduce is not None:
            partial = self.allreduce(partial)
        return self.add_norm_body(x, partial, norm.weight, norm.eps)

    def _attention(self, layer, h, wqkv, bqkv, k_cache, v_cache, pos, cos, sin, mask, tree=None):
        """QKV projection of the normed `h`, rope, cache write and attention: [B, T, H * D]. tree:
        a token tree's ancestor bits for the split-KV kernel, or "sdpa": SDPA under `mask` whatever
        the step's attention."""
        a = layer.self_attn
        qk_norm = (a.q_norm.weight, a.k_norm.weight, a.q_norm.eps) if a.q_norm is not None else None
        if self.rope_attend is not None and not isinstance(tree, str):
            qkv = self._linear("qkv", h, wqkv, bqkv)
            return self.rope_attend(
                qkv,
                cos,
                sin,
                k_cache,
                v_cache,
                pos,
                a.n_heads,
                a.n_kv_heads,
                a.kv_map,
                tree_bits=tree,
                gqa_group=a.gqa_group,
                qk_norm=qk_norm,
            )
        q, k, v = self.qkv_from_normed(h, wqkv, bqkv, cos, sin, a.n_heads, a.n_kv_heads, a.head_dim, qk_norm)  # SDPA: compiled
        return (attend if isinstance(tree, str) else self.attend_fn)(q, k, v, mask, k_cache, v_cache, pos, a.gqa_group, a.kv_map)

    def hidden_at(self, tokens, pos, cache, kv_len: int) -> torch.Tensor:
        cos, sin, mask = self.model.rope_and_mask(pos, kv_len, masked=self.needs_mask)
        return self._layers(tokens, pos, cos, sin, mask, cache)

    def hidden_tree(self, tokens, rope_pos, slots, cache, mask=None, bits=None) -> torch.Tensor:
        """A token tree (workers/engine/steps.py `_tree_replay`): rotated at `rope_pos`, K/V written
        at `slots`. With the split-KV attention it reads the ancestor `bits` [1, T]; otherwise SDPA
        under `mask` [1, 1, T, kv_len] (the kernel without bits reads every slot up to a query's
        slot, which a tree does not allow)."""
        cos, sin, _ = self.model.rope_and_mask(rope_pos, 0, masked=False)
        kernel_reads_bits = self.rope_attend is not None and bits is not None
        return self._layers(tokens, slots, cos, sin, mask, cache, tree=bits if kernel_reads_bits else "sdpa")

    def _layers(self, tokens, pos, cos, sin, mask, cache, tree=None) -> torch.Tensor:
        model = self.model
        layers = model.layers
        x = model.embed_tokens(tokens)
        if not len(layers):
            return model.norm(x)
        first = layers[0].input_layernorm
        h = self.norm_body(x, first.weight, first.eps)
        seen = {}
        for i, (layer, (wqkv, bqkv, wgu), k_cache, v_cache) in enumerate(zip(layers, self.merged, cache.k, cache.v)):
            if i in model.aux_layers:  # EAGLE-3: the residual stream entering layer i (a copy: a join may write x in place)
                seen[i] = x.clone()
            core = self._attention(layer, h, wqkv, bqkv, k_cache, v_cache, pos, cos, sin, mask, tree)
            x, h = self._join(self._linear("o", core, layer.self_attn.o_proj.weight), x, layer.post_attention_layernorm)
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
            x, h = self._join(self._mlp(h, wgu, layer.mlp), x, nxt)
        if model.aux_layers:
            seen[len(layers)] = h  # the final normed state (an MTP layer's input)
            model.aux = [seen[i] for i in model.aux_layers]
        return h


def try_fused(model: Transformer, engine: EngineConfig, allreduce=None, attend_fn=None) -> FusedStep | None:
    """FusedStep, or None (with one line on stderr) if this torch cannot build it."""
    try:
        return FusedStep(model, engine, allreduce, attend_fn)
    except Exception as e:  # noqa: BLE001 - the plain path still works
        print(f"spectune: fused step unavailable ({type(e).__name__}: {e}); using the plain model", file=sys.stderr)
        return None
