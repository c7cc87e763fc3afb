"""The greedy EAGLE-3 draft chain as one CUDA graph: feed the verifier's new states, then k drafts.

    chain = Eagle3Chain(head, cache, max_width=17)      # capture: CUDA graphs (default on a GPU)
    drafts = chain.draft(tokens, aux, k)                # list of k target ids, or None (use the eager loop)
    chain.draft_fed(feed, k)                            # the device loop's: feed and drafts on the device

One replay fuses the verifier's aux states of the `T` staged entries (g_i = fc(aux_i)), runs the
head's step on them (tokens x_{i+1} and states g_i at positions start..start+T-1), takes the
argmax of the last entry's draft logits, maps it to a target id, and k - 1 times feeds that token
with the head's own pre-norm output at the next position, all on the device: k drafts cost one
launch instead of ~30 kernels and a sync per draft (read back with the verify pass's argmaxes under
engine.overlap, or, in the device loop, not at all). Positions live in a device
buffer, so no shape depends on the sequence length. A graph is captured per (T, k, width) on first
use, or ahead of timing by `warm`. `draft_fed` is the same chain after a feed the verifier's
acceptance left on the device (workers/engine/device_loop.py): its graph is bound to that feed.

A head step is either the eager one (`Eagle3Head.step_at` with kv_len = max_seq: SDPA over the
whole head cache under a position mask, separate norm, rope and cast kernels) or, given an
`EngineConfig` with compile on, `HeadFastStep`: the verifier's fast pieces
(workers/engine/fused_step.py) applied to the head's one layer, i.e. merged q/k/v and gate/up
weights, the GEMV picker for every GEMM (the draft lm_head too), compiled norm bodies and the
split-KV Triton attention, which applies rope, writes the cache and reads only the slots up to each
query's position.

Invariant (as the eager loop): after `draft` the cache holds start + T + k - 1 entries; the last
draft is not fed. `draft_fed` leaves the host's cache length alone (its positions are the feed's). Without capture (CPU) the same device-only body runs directly, which is how the
tests compare it with the eager loop.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from workers.engine.graphs import capture_graph
from workers.model.transformer import KVCache, rms_norm
from workers.spec.engine_config import EngineConfig


def pick_entries(out: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
    """out [n, T, d] -> [n, 1, d]: each row's last entry, or row i's entry at[i] (at [n], on the
    device: a gather, no host read)."""
    if at is None:
        return out[:, -1:]
    return out.gather(1, at.view(-1, 1, 1).expand(out.shape[0], 1, out.shape[-1]))


def _head_input(tokens, embed, g, w_emb, w_hidden, eps: float):
    # [input_layernorm(embedding of tokens); hidden_norm(g)]: what the head's q/k/v read (2 x hidden
    # wide); lookup, both norms and the concatenation in one compiled body
    emb = F.embedding(tokens, embed)  # tokens [n, T]
    return torch.cat([rms_norm(emb, w_emb, eps), rms_norm(g, w_hidden, eps)], dim=-1)


class HeadFastStep:
    """`Eagle3Head.step_at` through the verifier's FusedStep pieces (a FusedStep over the head's one
    layer: merged weights, GEMV picker, compiled bodies, the attention `engine.attention` picks).
    Merges the head's q/k/v and gate/up weights in place (the Linears become views): build one per head."""

    def __init__(self, head, engine: EngineConfig, attend_fn=None):
        """attend_fn: the attention core (None: the one `engine.attention` picks here; CPU tests
        pass the Triton attention, which runs there under its interpreter)."""
        from workers.engine.fused_step import FusedStep
        from workers.engine.steps import pick_attention

        self.head = head
        if attend_fn is None:
            attend_fn, self.attention = pick_attention(engine.attention, head.cfg.args.head_dim, head.fc.weight.device)
        else:
            self.attention = getattr(attend_fn, "__name__", "given")
        # FusedStep reads only `layers` and the embedding's device of the model it is given
        self.fused = FusedStep(SimpleNamespace(layers=[head.midlayer], embed_tokens=head.embed_tokens), engine, None, attend_fn)
        self.head_input = torch.compile(_head_input, dynamic=False) if engine.compile else _head_input
        if self.fused.gemv is not None:
            self.fused.gemv.weights["lm_head"] = [head.lm_head.weight]
        # rotary tables in the head's dtype once (a step gathers its rows: no cast kernels)
        dtype = head.fc.weight.dtype
        self.cos, self.sin = head.rope_cos.to(dtype), head.rope_sin.to(dtype)

    def prepare(self, widths, heads=(1,)) -> None:
        """Race the GEMV picker at these step widths (tokens a step feeds, all rows together) now,
        outside any capture or timing; the draft lm_head at `heads` (a step projects one entry per
        row: the last, or `at`)."""
        gemv = self.fused.gemv
        if gemv is not None:
            gemv.prepare(widths, roles=[r for r in gemv.weights if r != "lm_head"])
            gemv.prepare(heads, roles=["lm_head"])

    def step_at(self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache: KVCache, at: torch.Tensor | None = None):
        """As `Eagle3Head.step_at` with kv_len = cache.max_seq: (pre-norm outputs [T, hidden],
        draft logits of the last entry, or of entry `at` [1] (a device index), in the head's dtype:
        the chain reads only their argmax)."""
        h, logits = self.step_rows(tokens[None], g[None], pos, cache, at)
        return h[0], logits[0]

    def step_rows(self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache: KVCache, at: torch.Tensor | None = None):
        """As `Eagle3Head.step_rows` with kv_len = cache.max_seq (n rows: tokens [n, T], g [n, T,
        hidden], pos [n, T], at [n]): (pre-norm outputs [n, T, hidden], draft logits [n, vocab] of
        each row's last entry or entry at[i], in the head's dtype). The split-KV attention reads
        each row only up to its own positions."""
        head, f = self.head, self.fused
        layer, dtype = head.midlayer, head.fc.weight.dtype
        a = layer.self_attn
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        mask = None
        if f.needs_mask:  # SDPA: the whole cache under a position mask
            mask = (torch.arange(cache.max_seq, device=pos.device)[None, None, :] <= pos[:, :, None])[:, None]
        g = g.to(dtype)
        # one eps for both input norms (the head's layer builds them all from the config's rms_norm_eps)
        x = self.head_input(
            tokens, head.embed_tokens.weight, g, layer.input_layernorm.weight, layer.hidden_norm.weight, layer.input_layernorm.eps
        )
        wqkv, bqkv, wgu = f.merged[0]
        core = f._attention(layer, x, wqkv, bqkv, cache.k[0], cache.v[0], pos, cos, sin, mask)
        post = layer.post_attention_layernorm
        h, normed = f.add_norm_body(g, f._linear("o", core, a.o_proj.weight), post.weight, post.eps)
        h, out = f.add_norm_body(h, f._mlp(normed, wgu, layer.mlp), head.norm.weight, head.norm.eps)
        return h, f._linear("lm_head", pick_entries(out, at), head.lm_head.weight)[:, 0]


class Eagle3Chain:
    def __init__(self, head, cache: KVCache, max_width: int, capture: bool | None = None, fast: HeadFastStep | None = None):
        self.head, self.cache, self.max_width = head, cache, max_width
        self.fast = fast  # None: the head's eager step
        self.device = head.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        dtype = head.dtype
        self._tok = torch.zeros(max_width, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(1, max_width, dtype=torch.long, device=self.device)
        self._aux = torch.zeros(max_width, head.aux_dim, dtype=dtype, device=self.device)  # the head's `fuse` input
        pin = self.device.type == "cuda"
        self._staging = torch.zeros(2, max_width, dtype=torch.long).pin_memory() if pin else torch.zeros(2, max_width, dtype=torch.long)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # (T, k, width) or ("fed", ...)
        self._pool = None
        # the widest feed `warm` captured: a wider one (a backlog after lookup steps, drafter.lookup)
        # is fed eagerly by the drafter rather than captured inside a timed run
        self.ready_width = max_width

    def fits(self, T: int, k: int) -> bool:
        return 1 <= T <= self.max_width and k >= 1 and self.cache.lengths[0] + T + k - 1 <= self.cache.max_seq

    def draft(self, tokens: list[int], aux: torch.Tensor, k: int, on_device: bool = False, width: int = 1) -> list | torch.Tensor | None:
        """k greedy drafts (target ids) after feeding `tokens` with the verifier's aux states
        aux [T, 3 x target_dim] (fc applied inside); None where the chain does not apply (too wide a
        feed, a full cache). on_device: the drafts as the chain's own output tensor [k], not read
        back (no sync; valid until the next draft). width > 1 (a tree): each depth's top-`width`
        target ids, [k][width], the chain following the first."""
        T = len(tokens)
        if not self.fits(T, k):
            return None
        start = self.cache.lengths[0]
        self._staging[0, :T] = torch.tensor(tokens)
        self._staging[1, :T] = torch.arange(start, start + T)
        self._tok[:T].copy_(self._staging[0, :T], non_blocking=True)
        self._pos[0, :T].copy_(self._staging[1, :T], non_blocking=True)
        self._aux[:T].copy_(aux)
        if self.capture:
            if (T, k, width) not in self.graphs:
                self.graphs[(T, k, width)] = self._capture(lambda: self._run(T, k, width))
            graph, out = self.graphs[(T, k, width)]
            graph.replay()
        else:
            out = self._run(T, k, width)
        self.cache.lengths[0] = start + T + k - 1
        return out if on_device else out.tolist()

    def warm(self, k: int, width: int = 1) -> None:
        """Capture the chains of k drafts (each depth's top-`width`: a tree) after every feed width
        1..k + 1 (what a step sends), outside any timing. Writes scratch entries from position 0:
        reset the cache after."""
        if not self.capture:
            return
        self.ready_width = min(k + 1, self.max_width)
        if self.fast is not None:
            self.fast.prepare(range(1, min(k + 1, self.max_width) + 1))
        for T in range(1, min(k + 1, self.max_width) + 1):
            self.cache.lengths[0] = 0
            self.draft([0] * T, torch.zeros_like(self._aux[:T]), k, width=width)
        self.cache.lengths[0] = 0

    def draft_fed(self, feed, k: int) -> None:
        """k greedy drafts after a feed that lives on the device (`DeviceFeed`,
        workers/engine/device_loop.py), written into `feed.drafts` (the next verify pass's input):
        the verify pass's T entries at their positions with fc over its aux rows, the first draft
        from entry `feed.at` (the last accepted), then k - 1 more at the positions after it. No host
        read and no host bookkeeping: entries past `at` hold rejected drafts until the chain's own
        drafts overwrite them, and a query never reads a slot past its position."""
        if not self.capture:
            self._run_fed(feed, k)
            return
        key = ("fed", id(feed), k, tuple(a.data_ptr() for a in feed.aux))  # bound to the feed and the verify graph's aux rows
        if key not in self.graphs:
            self.graphs[key] = self._capture(lambda: self._run_fed(feed, k))
        self.graphs[key][0].replay()

    def _step(self, tok, g, pos, at=None):
        """One head step at device positions over the whole static cache (the fast body or the eager one)."""
        if self.fast is not None:
            return self.fast.step_at(tok, g, pos, self.cache, at)
        return self.head.step_at(tok, g, pos, self.cache, self.cache.max_seq, at)

    def _run(self, T: int, k: int, width: int = 1) -> torch.Tensor:
        """Device ops only (graph-safe): the k drafts after the T staged entries, as target ids
        [k]; width > 1: each depth's top-width [k, width], the chain fed its first."""
        head = self.head

        def pick(logits):  # (the token the chain feeds next, what the depth drafts)
            if width == 1:
                nxt = head.to_target(logits.argmax())
                return nxt, nxt
            top = head.to_target(logits.topk(width).indices)
            return top[0], top

        pos = self._pos[:, :T]
        h, logits = self._step(self._tok[:T], head.fuse(self._aux[:T]), pos)
        nxt, out = pick(logits)
        drafts, pos = [out], pos[:, -1:]
        for _ in range(k - 1):
            pos = pos + 1
            h, logits = self._step(nxt.view(1), h[-1:], pos)
            nxt, out = pick(logits)
            drafts.append(out)
        return torch.stack(drafts)

    def _run_fed(self, feed, k: int) -> None:
        """`draft_fed`'s body (device ops only)."""
        head, T = self.head, feed.tokens.shape[0]
        aux = torch.cat([a[0, :T] for a in feed.aux], dim=-1).to(head.dtype)
        h, logits = self._step(feed.tokens, head.fuse(aux), feed.positions, feed.at)
        nxt = head.to_target(logits.argmax())
        drafts, h, pos = [nxt], h.index_select(0, feed.at), feed.positions[:, :1] + feed.at
        for _ in range(k - 1):
            pos = pos + 1
            h, logits = self._step(nxt.view(1), h, pos)
            nxt = head.to_target(logits.argmax())
            drafts.append(nxt)
        feed.drafts.copy_(torch.stack(drafts))

    def _capture(self, run):
        try:
            return self._capture_body(run)
        except Exception as e:  # noqa: BLE001 - the eager head step still works
            if self.fast is None:
                raise
            print(
                f"spectune: EAGLE-3 fast head step failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); eager head steps",
                file=sys.stderr,
                flush=True,
            )
            self.fast = None  # the bodies read it when they run
            self.graphs.clear()  # every width again with the eager body, in a fresh pool
            self._pool = None
            return self._capture_body(run)

    def _capture_body(self, run):
        graph, out, self._pool = capture_graph(run, self.device, self._pool)
        return graph, out


def fast_step(head, engine: EngineConfig):
    """The head's one HeadFastStep (it merges the head's weights in place), or None with one line
    on stderr where this torch cannot build it (the eager head step still works)."""
    key = ("fast", engine)
    if key not in head.__dict__:
        try:
            head.__dict__[key] = HeadFastStep(head, engine)
        except Exception as e:  # noqa: BLE001 - the eager step still works
            print(f"spectune: EAGLE-3 fast head step unavailable ({type(e).__name__}: {e}); eager head steps", file=sys.stderr)
            head.__dict__[key] = None
    return head.__dict__[key]
