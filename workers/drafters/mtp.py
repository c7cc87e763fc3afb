"""The MTP drafter (`drafter.kind: mtp`): DeepSeek-V3's own multi-token-prediction layer, drafting a
chain of k tokens by reusing that one layer (as vLLM's and SGLang's MTP proposers do), inside every
verifier rank.

    model = load_model(path, tp=part, mtp=True)      # the verifier with its MTP layer (workers/model)
    model.aux_layers = (model.args.n_layers,)        # the verifier hands over its final normed states
    drafter = MtpDrafter(MtpHead(model))

One MTP step at position i reads the verifier's final normed hidden state h_i and the token after it,
x_{i+1} (`MtpLayer`, workers/model/transformer.py):

    m_i = block(eh_proj([enorm(embed(x_{i+1})); hnorm(h_i)]))      logits = lm_head(shared_head.norm(m_i))

predicting x_{i+2}. As vLLM does, the embedding at position 0 is zeroed (its token has no state before
it). A drafted position has no verifier state, so the next draft reads the layer's own output m_i
instead. The drafter keeps the layer's own one-layer KV cache and follows exactly the EAGLE-3 chain's
bookkeeping (workers/drafters/eagle3/head.py `Eagle3Drafter`: roll back to the entries fed with the
verifier's states, feed the committed positions since, draft k), which it reuses: only the head
differs. The block is the model's own kind (latent attention, routed + shared experts) and is split
across the TP ranks as the model's layers are, its allreduces in line with theirs: every rank drafts
the same chain in lockstep, from the same committed tokens and the same (allreduced) states.

The embedding and the output head are the model's own: DeepSeek-V3 shares them with its MTP layer
(the checkpoint's copies under the MTP layer's name are not read). On a GPU a greedy chain (the
feed and its k drafts) is one CUDA-graph replay per feed width, EAGLE-3's `Eagle3Chain` over this
head's `step_at`; sampled chains and CPU runs take the host loop.
"""

from __future__ import annotations

import torch

from workers.drafters.eagle3.chain import Eagle3Chain, pick_entries
from workers.drafters.eagle3.head import Eagle3Drafter, step_appended
from workers.model.transformer import KVCache, Transformer, cache_buffers
from workers.spec import MAX_DRAFT_TOKENS


class MtpHead:
    """A verifier model's MTP layer as a one-layer draft head: the interface `Eagle3Drafter` drafts
    through (`fuse`, `step`, `new_cache`, `to_target`, dtype, device, vocabularies)."""

    def __init__(self, model: Transformer):
        if model.mtp is None:
            raise ValueError("MtpHead needs a model loaded with its MTP layer (load_model(..., mtp=True))")
        self.model, self.layer = model, model.mtp
        weight = self.layer.eh_proj.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.target_vocab = self.draft_vocab = model.args.vocab_size

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """The verifier's final normed states [n, dim]: the layer reads them as they are."""
        return states.to(self.dtype)

    def new_cache(self, rows: int = 1) -> KVCache:
        k, v = cache_buffers(self.layer.self_attn, rows, self.model.max_seq, self.dtype, self.device)
        return KVCache(k=[k], v=[v], lengths=[0] * rows)

    @property
    def aux_dim(self) -> int:
        return self.model.args.dim

    def step(self, tokens: torch.Tensor, g: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [T] (x_{i+1}) with states g [T, dim] appended at the cache length -> (the layer's
        outputs [T, dim], the next token's logits of the last entry [vocab], float32)."""
        return step_appended(self, tokens, g, cache, "the MTP layer's")

    def step_at(self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache: KVCache, kv_len: int, at=None):
        """`step` at explicit positions pos [1, T] over the first kv_len cache slots under a position
        mask, device ops only (kv_len = cache.max_seq: static shapes, what the chain's CUDA graph
        captures, workers/drafters/eagle3/chain.py); leaves cache.lengths to the caller. at [1]: the
        entry whose logits are returned (a device index; default the last)."""
        emb = self.model.embed_tokens(tokens)[None].masked_fill((pos == 0)[..., None], 0.0)
        x = self.layer.join(emb, g[None].to(self.dtype))
        cos, sin, mask = self.model.rope_and_mask(pos, kv_len)
        h = self.layer(x, cos, sin, mask, cache.k[0], cache.v[0], pos)
        logits = self.model.logits(self.layer.shared_head.norm(pick_entries(h, at)))
        return h[0], logits[0, 0]

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids  # the whole vocabulary: draft ids are target ids


class MtpDrafter(Eagle3Drafter):
    """Chain drafting (greedy, or sampled at the trial temperature) from the verifier's final states
    through its MTP layer; one per sequence (`fork`). Greedy chains run as one CUDA graph per feed
    width on a GPU (`Eagle3Chain` with the head's own step: the layer's feed and its k drafts in one
    replay, its drafts left on the device for the verify pass under engine.overlap as EAGLE-3's are);
    chain True runs that device-only body uncaptured (CPU tests), False the host loop. Not fed
    on the device (`fed_ready` False: the verifier's device loop hands over EAGLE-3's aux layers, not
    the final states)."""

    kind = "mtp"
    proposes_on_device = True  # a greedy chain's drafts may stay on the device (`Eagle3Drafter.propose_on_device`)

    def __init__(self, head: MtpHead, chain: bool | None = None, lookup: int = 0, tree_width: int = 0):
        self._own_state(head, lookup, tree_width)
        self.chain = Eagle3Chain(head, self.cache, MAX_DRAFT_TOKENS + 1)
        self.use_chain = self.chain.capture if chain is None else chain
        # around a chain whose drafts stay on the device: its GPU time is the draft time, read after the step's sync
        self._span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.chain.capture else None
        self.begin(0.0, 0)
        self.prefill([])

    def fork(self) -> MtpDrafter:
        other = MtpDrafter(self.head, chain=self.use_chain, lookup=self.lookup, tree_width=self.tree_width)
        other.begin(self.temperature, int(self.generator.initial_seed()))
        return other

    def batch_rows(self, n: int, k: int):
        return None  # one fork per row

    def fed_ready(self, k: int, graphed: bool) -> bool:
        return False
