"""EAGLE-3 draft head: the public checkpoint format, the head model and the drafter (chain or tree).

Format (what SGLang, vLLM, SpecForge and the published heads share): `config.json` with
`architectures: ["LlamaForCausalLMEagle3"]` and Llama fields for the one decoder layer, plus
`draft_vocab_size` (default: vocab_size), `target_hidden_size` (default: hidden_size) and
`eagle_config.eagle_aux_hidden_state_layer_ids` (the target layers whose *input* residual stream
feeds `fc`; default (2, L // 2, L - 3) of an L-layer target). Tensors:

    fc.weight                                   [hidden, 3 * target_hidden]
    midlayer.self_attn.{q,k,v}_proj.weight      [heads * head_dim, 2 * hidden]  (reads [embedding; hidden])
    midlayer.self_attn.o_proj.weight            [hidden, heads * head_dim]
    midlayer.mlp.{gate,up,down}_proj.weight     SwiGLU
    midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight
    norm.weight, lm_head.weight                 [draft_vocab, hidden]
    d2t [draft_vocab] int64: target id = draft id + d2t[draft id];  t2d [vocab] bool: in the draft vocabulary
    embed_tokens.weight                         optional; else the target's embedding

One head step at position i reads the fused hidden state g_i and the embedding of the token
after it, x_{i+1}:
    a = attn([input_layernorm(embed(x_{i+1})); hidden_norm(g_i)]);  h = g_i + a;  h = h + mlp(post_attention_layernorm(h))
logits = lm_head(norm(h)) predict x_{i+2}. g_i = fc(target aux states at i) where the verifier
computed position i; a drafted position has no target state, so the next draft reads the head's
own pre-norm output h instead (the chain).

The drafter keeps its own one-layer KV cache. Entry i holds (g_i, x_{i+1}). Before each proposal
it rolls back to the entries fed with the verifier's states, feeds the committed positions the
verifier has sent states for since (every committed position but the last), then drafts k tokens:
a chain (top-1, or sampled), or with `tree_width` a tree (workers/drafters/eagle3/tree.py), with
`lookup` n-gram continuations instead of the chain or as the tree's branches. In the device loop
(workers/engine/device_loop.py) a greedy chain is fed on the device instead (`draft_fed`: the verify
pass's k + 1 entries, drafting from the last one kept). Loading heads: workers/drafters/eagle3/checkpoint.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from workers.drafters.eagle3.chain import pick_entries
from workers.drafters.eagle3.tree import shape_tree
from workers.drafters.ngram import NgramIndex
from workers.engine.drafter import Drafter
from workers.engine.link import Proposal
from workers.engine.verify import probs as softmax_t
from workers.engine.verify import sample
from workers.model.args import CheckpointError, ModelArgs, ModelConfigError
from workers.model.rope import apply_rope, rope_tables
from workers.model.transformer import MLP, Attention, KVCache, RMSNorm, attend
from workers.spec import MAX_DRAFT_TOKENS, tree_size
from workers.spec.engine_config import EngineConfig

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice (vLLM, SGLang): the inputs of layers 2, L // 2 and L - 3."""
    return (min(2, n_layers - 1), n_layers // 2, max(0, n_layers - 3))


@dataclass(frozen=True)
class Eagle3Config:
    args: ModelArgs  # the decoder layer's shape (dim = hidden_size) and rotary settings
    draft_vocab: int
    target_hidden: int
    aux_layers: tuple[int, ...] | None  # None: the target's defaults

    @classmethod
    def from_hf_config(cls, cfg: dict) -> Eagle3Config:
        arch = cfg.get("architectures") or []
        if not any(a in ARCHITECTURES for a in arch):
            raise ModelConfigError(f"architectures {arch} names no EAGLE-3 head (expected {ARCHITECTURES[0]})")
        args = ModelArgs.from_hf_config({**cfg, "model_type": "llama", "num_hidden_layers": 1})
        eagle = cfg.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids")
        return cls(
            args=args,
            draft_vocab=int(cfg.get("draft_vocab_size") or args.vocab_size),
            target_hidden=int(cfg.get("target_hidden_size") or args.dim),
            aux_layers=tuple(int(i) for i in aux) if aux else None,
        )

    def to_hf_config(self) -> dict:
        a = self.args
        return {
            "architectures": [ARCHITECTURES[0]],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": a.dim,
            "intermediate_size": a.intermediate_size,
            "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.n_kv_heads,
            "head_dim": a.head_dim,
            "num_hidden_layers": 1,
            "rms_norm_eps": a.norm_eps,
            "rope_theta": a.rope_theta,
            "max_position_embeddings": a.max_position_embeddings,
            "vocab_size": a.vocab_size,
            "draft_vocab_size": self.draft_vocab,
            "target_hidden_size": self.target_hidden,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            **({"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers)}} if self.aux_layers else {}),
        }


def load_config(path: str | Path) -> Eagle3Config:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"EAGLE-3 head {str(path)!r} has no config.json")
    try:
        return Eagle3Config.from_hf_config(json.loads((path / "config.json").read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/config.json is not valid JSON: {e}") from None


def check_fits(cfg: Eagle3Config, target: ModelArgs, path) -> tuple[int, ...]:
    """The aux layer ids this head reads from `target`; ModelConfigError (one line) where it does not fit."""
    if cfg.target_hidden != target.dim:
        raise ModelConfigError(
            f"EAGLE-3 head {path}: target_hidden_size {cfg.target_hidden} differs from the model's hidden size {target.dim}"
        )
    if cfg.args.vocab_size != target.vocab_size:
        raise ModelConfigError(f"EAGLE-3 head {path}: vocab_size {cfg.args.vocab_size} differs from the model's {target.vocab_size}")
    if not 1 <= cfg.draft_vocab <= target.vocab_size:
        raise ModelConfigError(f"EAGLE-3 head {path}: draft_vocab_size {cfg.draft_vocab} is not within 1..{target.vocab_size}")
    aux = cfg.aux_layers or default_aux_layers(target.n_layers)
    if len(aux) != 3 or not all(0 <= i < target.n_layers for i in aux):
        raise ModelConfigError(
            f"EAGLE-3 head {path}: eagle_aux_hidden_state_layer_ids {list(aux)} must be 3 layers of 0..{target.n_layers - 1}"
        )
    return tuple(aux)


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over [normed embedding; normed hidden] (2 x hidden wide)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        wide = 2 * args.dim
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(wide, old.out_features, bias=False))
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.hidden_norm = RMSNorm(args.dim, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)

    def qkv_input(self, emb: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(g)], dim=-1)

    def finish(self, g: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = g + self.self_attn.o_proj(attn_out)
        return h + self.mlp(self.post_attention_layernorm(h))


def step_appended(head, tokens: torch.Tensor, g: torch.Tensor, cache: KVCache, owner: str):
    """A chain head's `step_at` (EAGLE-3's, the MTP layer's) for T entries appended at the cache length,
    the length then advanced; `owner` names the head's cache in the error past its end."""
    T, start = tokens.shape[0], cache.lengths[0]
    kv_len = start + T
    if kv_len > cache.max_seq:
        raise ValueError(f"sequence length {kv_len} exceeds {owner} cache ({cache.max_seq})")
    out = head.step_at(tokens, g, torch.arange(start, kv_len, device=tokens.device)[None], cache, kv_len)
    cache.lengths[0] = kv_len
    return out


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config, max_seq: int = 2048):
        super().__init__()
        a = cfg.args
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(a.vocab_size, a.dim)
        self.fc = nn.Linear(3 * cfg.target_hidden, a.dim, bias=False)
        self.midlayer = Eagle3Layer(a)
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.lm_head = nn.Linear(a.dim, cfg.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
        self.register_buffer(
            "t2d",
            torch.ones(a.vocab_size, dtype=torch.bool) if cfg.draft_vocab == a.vocab_size else torch.zeros(a.vocab_size, dtype=torch.bool),
        )
        cos, sin = rope_tables(a, max_seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    # what a chain drafter reads of its head (Eagle3Drafter; the MTP head, workers/drafters/mtp.py, has the same)
    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def aux_dim(self) -> int:
        """Width of the verifier's states a position hands over (`fuse`'s input)."""
        return self.fc.in_features

    @property
    def target_vocab(self) -> int:
        return self.t2d.shape[0]

    @property
    def draft_vocab(self) -> int:
        return self.lm_head.out_features

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """The verifier's states of n positions [n, 3 x target_hidden] -> the head's input g [n, hidden]."""
        return self.fc(states)

    def new_cache(self, rows: int = 1) -> KVCache:
        a, p = self.cfg.args, self.fc.weight
        shape = (rows, a.n_kv_heads, self.rope_cos.shape[0], a.head_dim)
        return KVCache(
            k=[torch.zeros(shape, dtype=p.dtype, device=p.device)],
            v=[torch.zeros(shape, dtype=p.dtype, device=p.device)],
            lengths=[0] * rows,
        )

    def step(self, tokens: torch.Tensor, g: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [T] (x_{i+1}), g [T, hidden] (fused states) appended at the cache length ->
        (pre-norm outputs [T, hidden], draft-vocabulary logits of the last entry, float32)."""
        return step_appended(self, tokens, g, cache, "the EAGLE-3 head's")

    def step_at(
        self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache: KVCache, kv_len: int, at: torch.Tensor | None = None
    ):
        """`step` at explicit positions pos [1, T], attending to the first kv_len cache slots under a
        position mask; leaves cache.lengths to the caller. kv_len = cache.max_seq makes every shape
        static (what the chain's CUDA graph captures, workers/drafters/eagle3/chain.py). at [1]: the
        entry whose logits are returned (a device index; default the last)."""
        h, logits = self.step_rows(tokens[None], g[None], pos, cache, kv_len, at)
        return h[0], logits[0]

    def step_rows(
        self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache: KVCache, kv_len: int, at: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step_at` for n rows of the cache at once: tokens [n, T], fused states g [n, T, hidden] at
        positions pos [n, T] (each row its own) -> (pre-norm outputs [n, T, hidden], draft logits
        [n, draft_vocab] of each row's last entry, or of entry at[i] for row i (a device index
        [n]), float32). Rows attend to their own first kv_len slots under a position mask."""
        n, T = tokens.shape
        dtype = self.fc.weight.dtype
        cos, sin = self.rope_cos[pos][:, None].to(dtype), self.rope_sin[pos][:, None].to(dtype)
        mask = (torch.arange(kv_len, device=pos.device)[None, None, :] <= pos[:, :, None])[:, None]
        attn = self.midlayer.self_attn
        g = g.to(dtype)
        x = self.midlayer.qkv_input(self.embed_tokens(tokens), g)
        hd = attn.head_dim
        q = attn.q_proj(x).view(n, T, -1, hd).transpose(1, 2)
        k = attn.k_proj(x).view(n, T, -1, hd).transpose(1, 2)
        v = attn.v_proj(x).view(n, T, -1, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, k, v, mask, cache.k[0], cache.v[0], pos, attn.gqa_group, attn.kv_map)
        h = self.midlayer.finish(g, out)
        return h, self.lm_head(self.norm(pick_entries(h, at)))[:, 0].float()

    def write_kv(self, tokens: torch.Tensor, g: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> None:
        """Cache entries without a step: token i (tokens [N], fused states g [N, hidden]) at position
        pos[i] of cache row rows[i]. One layer: an entry's K/V read nothing but its own input, so
        entries whose outputs nobody reads (the prompt's, but for its last) need only these (one
        packed pass for every row: the batched head's prefill, workers/drafters/eagle3/rows.py)."""
        dtype = self.fc.weight.dtype
        attn = self.midlayer.self_attn
        x = self.midlayer.qkv_input(self.embed_tokens(tokens)[None], g[None].to(dtype))  # [1, N, 2 hidden]
        cos, sin = self.rope_cos[pos][None, None].to(dtype), self.rope_sin[pos][None, None].to(dtype)
        k = apply_rope(attn.k_proj(x).view(1, -1, attn.n_kv_heads, attn.head_dim).transpose(1, 2), cos, sin)
        v = attn.v_proj(x).view(1, -1, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        cache.k[0][rows, :, pos] = k[0].transpose(0, 1)  # [N, Hkv, D] into slots (row, :, pos)
        cache.v[0][rows, :, pos] = v[0].transpose(0, 1)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        # index_select, not d2t[ids]: indexing by a 0-dim tensor (an argmax) reads it on the host,
        # a sync that invalidates the chain's CUDA graph capture
        return draft_ids + self.d2t.index_select(0, draft_ids.reshape(-1)).view(draft_ids.shape)


class Eagle3Drafter(Drafter):
    """Chain drafting (top-1, or sampled at the trial temperature) or tree drafting (each depth's
    top-W, `tree_width`) from the verifier's hidden states."""

    proposes_on_device = True

    kind = "eagle3"
    reads_hidden = True

    def __init__(
        self,
        head: Eagle3Head,
        chain: bool | None = None,
        engine: EngineConfig | None = None,
        fast=None,
        lookup: int = 0,
        tree_width: int = 0,
    ):
        """engine: the trial's engine settings; on a GPU with compile and CUDA graphs on, the chain's
        head steps go through `HeadFastStep` (built once per head). fast: that step given directly
        (CPU tests of its body). lookup (drafter.lookup): where the committed sequence's last `lookup`
        tokens occurred before, draft what followed them instead of running the head for a chain;
        with a tree, the continuations of the two longest matches (lookup down to 1 token) join it
        as branches (0: never). tree_width (drafter.tree_width): >= 2 drafts a
        tree, the head's top-w tokens at each depth (workers/drafters/eagle3/tree.py, through the
        chain's graph where it runs); 0 or 1: a chain."""
        from workers.drafters.eagle3.chain import Eagle3Chain, fast_step

        self._own_state(head, lookup, tree_width)
        if fast is None and engine is not None and engine.compile and engine.cuda_graphs and self.device.type == "cuda":
            fast = fast_step(head, engine)
        # greedy proposals through the device-only chain (chain None: on a GPU, where it is one CUDA
        # graph per feed width; True on CPU runs the same body uncaptured, for tests)
        self.chain = Eagle3Chain(head, self.cache, MAX_DRAFT_TOKENS + 1, fast=fast)
        self.use_chain = self.chain.capture if chain is None else chain
        # around a chain left on the device (propose_on_device): its GPU time, read after the step's sync
        self._span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.chain.capture else None
        self._batch_rows = {}  # rows -> Eagle3Rows (`batch_rows`)
        self.begin(0.0, 0)
        self.prefill([])

    def _own_state(self, head, lookup: int, tree_width: int) -> None:
        """What every chain drafter on `head` holds of its own (this class's and the MTP drafter's): the
        head, the n-gram lookup index, the draft cache."""
        self.head, self.device = head, head.device
        self.lookup, self.tree_width = lookup, tree_width
        self.index = (NgramIndex(lookup, 1) if tree_width >= 2 else NgramIndex(lookup, lookup)) if lookup else None
        self.cache = head.new_cache()

    def fork(self) -> Eagle3Drafter:
        """Another sequence's drafter on the same head: its own cache and chain (graphs on CUDA, once warmed)."""
        other = Eagle3Drafter(  # fast: None once it failed
            self.head, chain=self.use_chain, fast=self.chain.fast, lookup=self.lookup, tree_width=self.tree_width
        )
        other.begin(self.temperature, int(self.generator.initial_seed()))
        return other

    def batch_rows(self, n: int, k: int):
        """Greedy chains (no lookup, no tree): every row of a batch drafted in one head pass per
        depth (workers/drafters/eagle3/rows.py; on CUDA one graph per (rows, k) through this
        drafter's fast step); else None (one fork per row). One per row count, kept with its graphs."""
        if self.temperature > 0 or self.lookup or self._width(k) != 1:
            return None
        from workers.drafters.eagle3.rows import Eagle3Rows

        if n not in self._batch_rows:
            self._batch_rows[n] = Eagle3Rows(self.head, n, fast=self.chain.fast, capture=self.chain.capture)
        return self._batch_rows[n]

    def warm(self, k: int) -> None:
        if self.use_chain:
            self.chain.warm(k, width=self._width(k))
        self.prefill([])

    def begin(self, temperature: float, seed: int) -> None:
        self.temperature = temperature
        self.generator = torch.Generator().manual_seed(seed)

    def prefill(self, prompt: list[int]) -> None:
        self.cache.reset()
        self.states: list[torch.Tensor] = []  # aux states the verifier sent, not yet fed (fc not yet applied)
        self.n_states = 0  # positions the verifier has sent states for
        self.ctx = 0  # cache entries fed with the verifier's states (the rest are drafts)
        if self.index:
            self.index.reset()

    @torch.inference_mode()
    def observe(self, hidden: torch.Tensor) -> None:
        """The verifier's aux states [n, 3 x target_hidden] of the next n committed positions."""
        if hidden.shape[0]:  # fused by fc when fed: inside the chain's graph, or eagerly
            self.states.append(hidden.to(self.device, self.head.dtype))
            self.n_states += hidden.shape[0]

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft distribution over the target vocabulary (zero outside the draft vocabulary)."""
        q = torch.zeros(self.head.target_vocab, dtype=torch.float32, device=logits.device)
        q[self.head.to_target(torch.arange(logits.shape[0], device=logits.device))] = softmax_t(logits, self.temperature)
        return q

    def propose(self, committed: list[int], k: int) -> Proposal:
        return self._propose(committed, k, on_device=False)

    def propose_on_device(self, committed: list[int], k: int) -> Proposal:
        """As `propose`, but a greedy chain's drafts stay on the device (`Proposal.device_tokens`):
        the verify pass reads them there (engine.overlap: a prompt's first step in the device loop,
        or every step where the loop does not run, read back with the argmaxes in one sync). Where
        the chain does not apply: host tokens."""
        return self._propose(committed, k, on_device=True)

    def fed_ready(self, k: int, graphed: bool) -> bool:
        """Whether this run drafts greedy head chains that can be fed on the device
        (workers/engine/device_loop.py): no lookup (a host decision per step), no tree, and the chain
        captured exactly where the verify pass is (`graphed`; an eager pass on a GPU would hand a
        captured chain new aux tensors each step, a capture per step)."""
        plain_chain = self.use_chain and self.temperature <= 0 and not self.lookup and self._width(k) == 1
        return plain_chain and self.chain.capture == graphed

    @torch.inference_mode()
    def draft_fed(self, feed, k: int, span: tuple | None = None) -> None:
        """The chain after a feed left on the device by the verifier's acceptance (`DeviceFeed`),
        its drafts into `feed.drafts`; span: CUDA events recorded around it."""
        if span:
            span[0].record()
        self.chain.draft_fed(feed, k)
        if span:
            span[1].record()

    @torch.inference_mode()
    def _propose(self, committed: list[int], k: int, on_device: bool) -> Proposal:
        t0 = time.perf_counter()
        n = self.n_states  # entries 0..n-1 can be fed: (g_i, x_{i+1}); n == len(committed) - 1 in step
        if n != len(committed) - 1:
            raise RuntimeError(f"EAGLE-3 drafter: hidden states for {n} positions, {len(committed)} tokens committed")
        tree = self._width(k) > 1
        if self.index and not tree and (copied := self.index.propose(committed, k)):
            # a repeat: its continuation is the draft; the states wait in self.states for the next
            # chain, which feeds every position since ctx (so the head's cache never misses one)
            return Proposal(tokens=copied, draft_s=time.perf_counter() - t0)
        self.cache.rollback(0, self.ctx)
        if n + k > self.cache.max_seq:
            return Proposal(tokens=[], draft_s=time.perf_counter() - t0)
        aux = torch.cat(self.states) if len(self.states) > 1 else self.states[0]
        self.states = []
        feed = committed[self.ctx + 1 : n + 1]
        # greedy, or a tree (its drafts are deterministic under sampling too): fc and the whole chain in one replay
        if self.use_chain and (tree or self.temperature <= 0):
            on_device = on_device and not tree  # a tree's parents are built on the host
            span = self._span if on_device else None
            if span:  # from here: an eager backlog is draft time too
                span[0].record()
            if len(feed) > self.chain.ready_width:  # the prompt's states, a lookup backlog: all but the last eagerly
                self.head.step(torch.tensor(feed[:-1], device=self.device), self.head.fuse(aux[:-1]), self.cache)
                feed, aux = feed[-1:], aux[-1:]
            tokens = self.chain.draft(feed, aux, k, on_device, width=self._width(k))
            if span:
                span[1].record()
            if tokens is not None:
                self.ctx = n
                if tree:
                    return self._tree([top[0] for top in tokens], [top[1:] for top in tokens], committed, k, t0)
                if on_device:
                    return Proposal(tokens=[], device_tokens=tokens, gpu_span=span, draft_s=time.perf_counter() - t0)
                return Proposal(tokens=tokens, draft_s=time.perf_counter() - t0)
        h, logits = self.head.step(torch.tensor(feed, device=self.device), self.head.fuse(aux), self.cache)
        self.ctx = n
        tokens, qs, alternatives = [], [], []
        for i in range(k):
            if tree:  # deterministic under sampling too: the tree rule treats every draft as one-hot
                top = self.head.to_target(logits.topk(self._width(k)).indices).tolist()
                tok = top[0]
                alternatives.append(top[1:])
            elif self.temperature > 0:
                q = self._q(logits)
                tok = sample(q, self.generator)
                qs.append(q)
            else:
                tok = int(self.head.to_target(logits.argmax()).item())
            tokens.append(tok)
            if i + 1 < k:
                h, logits = self.head.step(torch.tensor([tok], device=self.device), h[-1:], self.cache)
        if tree:
            return self._tree(tokens, alternatives, committed, k, t0)
        q_all = torch.stack(qs).cpu() if qs else None
        return Proposal(tokens=tokens, probs=q_all, draft_s=time.perf_counter() - t0)

    def _width(self, k: int) -> int:
        """Tokens drafted at each of k depths: tree_width (at most the draft vocabulary) for a tree,
        else 1 (a chain; also a tree with no room for a sibling, k = MAX_DRAFT_TOKENS, whose lookup,
        matching `lookup` down to 1 token, then replaces the head as in a chain)."""
        w = min(self.tree_width, self.head.draft_vocab) if self.tree_width >= 2 else 1
        return w if tree_size(k, w) > k else 1

    def _tree(self, chain: list[int], alternatives: list[list[int]], committed: list[int], k: int, t0: float) -> Proposal:
        """The tree of the head's chain, its runners-up and, with lookup, up to two n-gram
        continuations (workers/drafters/eagle3/tree.py)."""
        branches = self.index.continuations(committed, k, 2) if self.index else []
        tokens, parents = shape_tree(chain, alternatives, branches)
        return Proposal(tokens=tokens, parents=parents, draft_s=time.perf_counter() - t0)
