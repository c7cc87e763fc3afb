"""The CUDA fast path of a decode / verify step: merged projections and torch.compile'd layer bodies.

A step of a few tokens streams every weight once, so its time is the weight bytes over memory
bandwidth plus a floor of ~2-3 us per kernel, even inside a CUDA graph. The plain model launches
~45 small kernels per layer (norms, rope, SiLU, casts); here each layer is two compiled regions
around an eager attention core:

    qkv body (compiled):  x += previous layer's MLP output; norm; one QKV GEMM; rope
    attention (eager):    K/V written into the cache in place (index_copy_), attention, o_proj
    mlp body (compiled):  x += attention output; norm; one gate/up GEMM; SiLU * up; down

with the allreduces between them left to the backend. The cache write stays outside the compiled
regions on purpose: an in-place write to a graph input is functionalised by Inductor into a copy
of the whole per-layer cache (profiled on H200: two cache-sized copies per layer per step, 0.2 ms
of a 5.2 ms Llama-3-8B step at 512 positions, growing with the cache). The residual add of each
MLP output is folded into the next layer's qkv body (the last one into the final norm), saving a
kernel per layer. Attention is `workers.model.transformer.attend` (SDPA over the masked static cache) or a
faster drop-in given as `attend_fn` (workers/kernels/attention.py). Weights are shared with the
plain model (views of the merged tensors), so the prefill and the CPU path are unchanged.

On CUDA the GEMMs leave the compiled bodies by default: each goes through workers/kernels/gemv.py's
picker (cuBLAS or a Triton GEMV per shape and width, by a timed race), with SiLU * up in the
gate/up GEMM's epilogue (`_hidden_with_picked_gemms`, or `_hidden_with_fused_norms` with a
fusing allreduce); SPECTUNE_GEMV=off keeps the compiled bodies above.

With the Triton attention, rope moves out of the qkv body into one kernel that also writes K/V
into the cache (`decode_attention.rope_write_attend`): four kernels per layer become one. With an
allreduce that also adds the residual and applies the next norm in its kernel (`symm_mem_ll`,
`AllReduce.fuses_add_norm`), the norms leave the compiled bodies (`_hidden_with_fused_norms`).

    fast = FusedStep(model)             # merges weights once
    h = fast.hidden_at(tokens, pos, cache, kv_len)
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

from workers.model.transformer import Transformer, attend, rms_norm, silu_mul
from workers.model.rope import apply_rope


def _qkv_body(x, delta, norm_w, eps: float, wqkv, bqkv, cos, sin, nq: int, nkv: int, hd: int):
    # no module in the arguments: every layer shares one compiled graph per step width
    if delta is not None:
        x = x + delta
    return (x, *_qkv_from_normed(rms_norm(x, norm_w, eps), wqkv, bqkv, cos, sin, nq, nkv, hd))


def _qkv_raw_body(x, delta, norm_w, eps: float, wqkv, bqkv):
    # the qkv body for an attention that applies rope itself (decode_attention.rope_write_attend)
    if delta is not None:
        x = x + delta
    return x, F.linear(rms_norm(x, norm_w, eps), wqkv, bqkv)


def _norm_body(x, norm_w, eps: float):
    return rms_norm(x, norm_w, eps)


def _qkv_from_normed(h, wqkv, bqkv, cos, sin, nq: int, nkv: int, hd: int):
    B, T, _ = h.shape
    q, k, v = F.linear(h, wqkv, bqkv).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
    q = apply_rope(q.view(B, T, nq, hd).transpose(1, 2), cos, sin)
    k = apply_rope(k.view(B, T, nkv, hd).transpose(1, 2), cos, sin)
    return q, k, v.view(B, T, nkv, hd).transpose(1, 2)


def _mlp_core(h, w_gate_up, w_down):
    return F.linear(silu_mul(F.linear(h, w_gate_up)), w_down)


def _mlp_body(x, delta, norm_w, eps: float, w_gate_up, w_down):
    x = x + delta
    return x, _mlp_core(rms_norm(x, norm_w, eps), w_gate_up, w_down)


def _final_norm(x, delta, norm_w, eps: float):
    return rms_norm(x + delta, norm_w, eps)


def _add_norm_body(x, delta, norm_w, eps: float):
    # the residual add (none before the first layer) and the norm reading it, for a GEMM outside
    x = x if delta is None else x + delta
    return x, rms_norm(x, norm_w, eps)


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
    def __init__(self, model: Transformer, compile: bool = True, attend_fn=None, gemv: bool | None = None):
        self.model = model
        # attend_fn(q, k, v, mask, k_cache, v_cache, pos, gqa_group, kv_map) -> [B, T, H * D]
        self.attend_fn = attend_fn or attend
        self.needs_mask = attend_fn is None  # the Triton attention reads positions, not a mask
        self.merged = []
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv, bqkv = _merge([a.q_proj, a.k_proj, a.v_proj])
            wgu, _ = _merge([m.gate_proj, m.up_proj])
            self.merged.append((wqkv, bqkv, wgu))
        # an attention that takes the merged projection, applies rope and writes the cache itself
        # (one kernel where the compiled rope and the eager cache writes took four per layer)
        self.rope_attend = getattr(attend_fn, "with_rope", None)
        self.qkv_body, self.mlp_body, self.final_norm = _qkv_body, _mlp_body, _final_norm
        self.qkv_raw_body = _qkv_raw_body
        self.norm_body, self.qkv_from_normed, self.mlp_core = _norm_body, _qkv_from_normed, _mlp_core
        self.add_norm_body, self.silu_mul = _add_norm_body, silu_mul
        if compile:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self.qkv_body = torch.compile(_qkv_body, dynamic=False)
            self.qkv_raw_body = torch.compile(_qkv_raw_body, dynamic=False)
            self.mlp_body = torch.compile(_mlp_body, dynamic=False)
            self.final_norm = torch.compile(_final_norm, dynamic=False)
            self.norm_body = torch.compile(_norm_body, dynamic=False)
            self.qkv_from_normed = torch.compile(_qkv_from_normed, dynamic=False)
            self.mlp_core = torch.compile(_mlp_core, dynamic=False)
            self.add_norm_body = torch.compile(_add_norm_body, dynamic=False)
            self.silu_mul = torch.compile(silu_mul, dynamic=False)
        # the step's GEMMs through workers/kernels/gemv.py's picker (cuBLAS or a Triton GEMV per shape, by a
        # timed race on first use): on CUDA unless SPECTUNE_GEMV=off (the compiled bodies with cuBLAS
        # inside); `gemv=True` forces it on (CPU tests of the layout)
        self.gemv = None
        device = model.embed_tokens.weight.device
        if gemv if gemv is not None else (device.type == "cuda" and gemv_mode() != "off"):
            from workers.kernels.gemv import GemvPicker

            # QKV goes through the picker only into the Triton rope + attention (with SDPA it stays
            # in the compiled rope body), so only then does it get a race
            qkv = [w for w, _, _ in self.merged] if self.rope_attend is not None else []
            self.gemv = GemvPicker({"qkv": qkv, "gate_up": [w for _, _, w in self.merged],
                                    "o": [layer.self_attn.o_proj.weight for layer in model.layers],
                                    "down": [layer.mlp.down_proj.weight for layer in model.layers]},
                                   silu_mul=self.silu_mul)

    def _add_norm_allreduce(self):
        """The TP allreduce, if it sums, adds the residual and normalises in one kernel (else None)."""
        layers = self.model.layers
        ar = layers[0].self_attn.reduce if len(layers) else None
        return ar if getattr(ar, "fuses_add_norm", False) else None

    def _linear(self, role: str, x, w, b=None):
        return F.linear(x, w, b) if self.gemv is None else self.gemv.linear(role, x, w, b)

    def _mlp(self, h, w_gate_up, w_down, ar=None) -> tuple[torch.Tensor, bool]:
        """The MLP of the normed `h`: (output, whether it was pushed into `ar`'s peers already)."""
        if self.gemv is None:
            return self.mlp_core(h, w_gate_up, w_down), False
        return self._row_parallel("down", self.gemv.swiglu("gate_up", h, w_gate_up), w_down, ar)

    def _row_parallel(self, role: str, x, w, ar) -> tuple[torch.Tensor, bool]:
        """A row-parallel GEMM (o_proj, down) whose output an allreduce sums next: through the
        picker, pushed to the peers by its epilogue where the allreduce takes that (symm_mem_ll)."""
        if self.gemv is None:
            return F.linear(x, w), False
        target = None if ar is None else ar.push_target(x.numel() // x.shape[-1] * w.shape[0], x.dtype, w.shape[0])
        if target is None:
            return self.gemv.linear(role, x, w), False
        return self.gemv.linear_push(role, x, w, target)

    def hidden_at(self, tokens, pos, cache, kv_len: int) -> torch.Tensor:
        model = self.model
        cos, sin, mask = model.rope_and_mask(pos, kv_len, masked=self.needs_mask)
        if (ar := self._add_norm_allreduce()) is not None:
            return self._hidden_with_fused_norms(ar, tokens, pos, cache, cos, sin, mask)
        if self.gemv is not None:
            return self._hidden_with_picked_gemms(tokens, pos, cache, cos, sin, mask)
        x, delta = model.embed_tokens(tokens), None  # the residual stream is x + delta
        for layer, (wqkv, bqkv, wgu), k_cache, v_cache in zip(model.layers, self.merged, cache.k, cache.v):
            a, m = layer.self_attn, layer.mlp
            eps = layer.input_layernorm.eps
            if self.rope_attend is not None:
                x, qkv = self.qkv_raw_body(x, delta, layer.input_layernorm.weight, eps, wqkv, bqkv)
                core = self.rope_attend(qkv, cos, sin, k_cache, v_cache, pos, a.n_heads, a.n_kv_heads, a.kv_map)
            else:
                x, q, k, v = self.qkv_body(x, delta, layer.input_layernorm.weight, eps, wqkv, bqkv, cos, sin,
                                           a.n_heads, a.n_kv_heads, a.head_dim)
                core = self.attend_fn(q, k, v, mask, k_cache, v_cache, pos, a.gqa_group, a.kv_map)
            attn_out = a.reduce(F.linear(core, a.o_proj.weight))
            x, mlp_out = self.mlp_body(x, attn_out, layer.post_attention_layernorm.weight, eps, wgu, m.down_proj.weight)
            delta = m.reduce(mlp_out)
        if delta is None:  # a model without layers
            return model.norm(x)
        return self.final_norm(x, delta, model.norm.weight, model.norm.eps)

    def _hidden_with_fused_norms(self, ar, tokens, pos, cache, cos, sin, mask) -> torch.Tensor:
        """The layout for an allreduce that fuses the residual add and the next norm (symm_mem_ll):
        per layer QKV GEMM, attention, o_proj, [allreduce + add + norm], gate/up with SiLU * up
        (one kernel through the picker's Triton GEMV, else the compiled GEMM + SiLU + down), down,
        [allreduce + add + next layer's norm (the final norm after the last)]: two kernels fewer
        per layer than allreduce, then a compiled body that adds and normalises. o_proj and down
        may push their output to the peers from the GEMM epilogue (`_row_parallel`)."""
        model = self.model
        layers = model.layers
        x = model.embed_tokens(tokens)
        first = layers[0].input_layernorm
        h = self.norm_body(x, first.weight, first.eps)
        for i, (layer, (wqkv, bqkv, wgu), k_cache, v_cache) in enumerate(zip(layers, self.merged, cache.k, cache.v)):
            a, m = layer.self_attn, layer.mlp
            core = self._attention(layer, h, wqkv, bqkv, k_cache, v_cache, pos, cos, sin, mask)
            post = layer.post_attention_layernorm
            o, pushed = self._row_parallel("o", core, a.o_proj.weight, ar)
            x, h = ar.add_norm(o, x, post.weight, post.eps, pushed=pushed)
            nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
            mlp_out, pushed = self._mlp(h, wgu, m.down_proj.weight, ar)
            x, h = ar.add_norm(mlp_out, x, nxt.weight, nxt.eps, pushed=pushed)
        return h

    def _attention(self, layer, h, wqkv, bqkv, k_cache, v_cache, pos, cos, sin, mask):
        """QKV projection of the normed `h`, rope, cache write and attention: [B, T, H * D]."""
        a = layer.self_attn
        if self.rope_attend is not None:
            return self.rope_attend(self._linear("qkv", h, wqkv, bqkv), cos, sin, k_cache, v_cache, pos,
                                    a.n_heads, a.n_kv_heads, a.kv_map)
        q, k, v = self.qkv_from_normed(h, wqkv, bqkv, cos, sin, a.n_heads, a.n_kv_heads, a.head_dim)  # SDPA: compiled
        return self.attend_fn(q, k, v, mask, k_cache, v_cache, pos, a.gqa_group, a.kv_map)

    def _hidden_with_picked_gemms(self, tokens, pos, cache, cos, sin, mask) -> torch.Tensor:
        """The layout with every GEMM through the GEMV picker (the allreduce, if any, sums alone):
        per layer [add + norm], QKV, attention, o_proj, allreduce, [add + norm], gate/up (with
        SiLU * up in its epilogue where Triton runs it), down, allreduce; each GEMM the faster of
        cuBLAS and the Triton GEMV."""
        model = self.model
        x, delta = model.embed_tokens(tokens), None
        for layer, (wqkv, bqkv, wgu), k_cache, v_cache in zip(model.layers, self.merged, cache.k, cache.v):
            a, m = layer.self_attn, layer.mlp
            x, h = self.add_norm_body(x, delta, layer.input_layernorm.weight, layer.input_layernorm.eps)
            core = self._attention(layer, h, wqkv, bqkv, k_cache, v_cache, pos, cos, sin, mask)
            post = layer.post_attention_layernorm
            x, h = self.add_norm_body(x, a.reduce(self._linear("o", core, a.o_proj.weight)), post.weight, post.eps)
            delta = m.reduce(self._mlp(h, wgu, m.down_proj.weight)[0])
        if delta is None:  # a model without layers
            return model.norm(x)
        return self.final_norm(x, delta, model.norm.weight, model.norm.eps)


def gemv_mode() -> str:
    """SPECTUNE_GEMV: auto (the default), cublas, triton, or off (also 0 / false)."""
    raw = os.environ.get("SPECTUNE_GEMV", "auto").strip().lower()
    mode = "off" if raw in ("off", "0", "false", "no") else raw
    if mode not in ("auto", "cublas", "triton", "off"):
        raise ValueError(f"SPECTUNE_GEMV={raw!r}: use auto, cublas, triton or off")
    return mode


def try_fused(model: Transformer, compile: bool = True, attend_fn=None) -> FusedStep | None:
    """FusedStep, or None (with one line on stderr) if this torch cannot build it. A bad engine
    switch in the environment is an error, not a fallback."""
    gemv_mode()
    try:
        return FusedStep(model, compile=compile, attend_fn=attend_fn)
    except Exception as e:  # noqa: BLE001 - the plain path still works
        print(f"spectune: fused step unavailable ({type(e).__name__}: {e}); using the plain model", file=sys.stderr)
        return None
