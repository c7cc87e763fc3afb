"""Drafting with a (small) autoregressive model: a separate draft checkpoint, or the verifier's
own first L layers and head (layer-skip self-drafting). Both are a `Transformer`, unsharded.

The drafter's KV cache holds the tokens it has fed so far (`fed`). Before each proposal it rolls
back to the longest prefix of `fed` that the verifier committed, feeds the committed tokens it
has not seen, then drafts k tokens one at a time (greedy, or sampled at the trial temperature,
keeping q for rejection sampling).

Batch > 1 (`begin_rows` / `propose_rows`): the same per sequence, every sequence a row of one
batch cache, drafted together: one pass feeds each row's unseen tokens (padded to the longest,
the padding rolled back; a new batch's first proposal, where every row starts at 0, prefills them
packed: `Transformer.prefill_packed`, in passes of at most PREFILL_TOKENS tokens), then k - 1
passes of one token per row. Eager (no CUDA graph yet).
"""

from __future__ import annotations

import time

import torch

from workers.drafters.base import Drafter
from workers.engine.config import EngineConfig
from workers.engine.link import Proposal
from workers.engine.steps import StepRunner
from workers.engine.verify import probs as softmax_t
from workers.engine.verify import sample
from workers.model.transformer import PREFILL_TOKENS, Transformer, prefill_groups


class ModelDrafter(Drafter):
    kind = "draft_model"

    def __init__(self, model: Transformer, kind: str | None = None, max_width: int = 17, engine: EngineConfig | None = None):
        self.model = model
        self.device = model.embed_tokens.weight.device
        self.begin(temperature=0.0, seed=0)
        self.cache = model.new_cache(1)
        self.steps = StepRunner(model, self.cache, max_width, engine=engine)
        self.fed: list[int] = []
        self._rows = None  # batch > 1: the batch cache (begin_rows)
        self._rows_fed: list[list[int]] = []
        if kind:
            self.kind = kind

    def begin(self, temperature: float, seed: int) -> None:
        self.temperature = temperature
        self.generator = torch.Generator().manual_seed(seed)  # CPU: `sample` draws on the CPU

    def warm(self, k: int) -> None:
        # step graphs for every feed width, and the greedy chains of k drafts after each
        self.steps.warm(range(1, k + 2), chain=k)
        self.fed = []

    def prefill(self, prompt: list[int]) -> None:
        self.cache.reset()
        self.fed = []

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        self.fed.extend(tokens)
        return self.steps.step(tokens)[-1]

    def begin_rows(self, n: int) -> None:
        if self._rows is None or len(self._rows.lengths) < n:
            self._rows = self.model.new_cache(n, self.cache.max_seq)
        self._rows.reset()
        self._rows_fed = [[] for _ in range(n)]

    @torch.inference_mode()
    def propose_rows(self, committed: list[list[int]], live: list[int], k: int) -> dict[int, Proposal]:
        t0 = time.perf_counter()
        n = len(committed)
        cache, fed = self._rows.view(0, n), self._rows_fed
        cache.lengths = list(self._rows.lengths[:n])
        feeds = []
        for i, seq in enumerate(committed):
            keep, limit = 0, min(len(fed[i]), len(seq) - 1)  # always re-feed at least the last token
            while keep < limit and fed[i][keep] == seq[keep]:
                keep += 1
            cache.rollback(i, keep)
            del fed[i][keep:]
            feeds.append(seq[keep:])
        if not any(cache.lengths):  # a new batch: every row from position 0, packed (no padding)
            parts = []
            for rows in prefill_groups([len(f) for f in feeds], PREFILL_TOKENS):
                part = cache.view(rows.start, len(rows))
                parts.append(self.model.prefill_packed([feeds[i] for i in rows], part))
                cache.lengths[rows.start : rows.stop] = part.lengths
            logits = torch.cat(parts)
        else:
            width = max(len(f) for f in feeds)
            base = list(cache.lengths)
            rows = torch.tensor([f + [f[-1]] * (width - len(f)) for f in feeds], device=self.device)
            logits = self.model(rows, cache)[torch.arange(n), torch.tensor([len(f) - 1 for f in feeds])]  # after each row's last real token
            for i, f in enumerate(feeds):
                cache.rollback(i, base[i] + len(f))  # the padding is forgotten
        for f, seen in zip(feeds, fed):
            seen.extend(f)
        drafts: list[list[int]] = [[] for _ in range(n)]
        qs: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for step in range(k):
            if self.temperature > 0:
                q = softmax_t(logits, self.temperature)
                chosen = [sample(q[i], self.generator) for i in range(n)]
                for i in range(n):
                    qs[i].append(q[i])
            else:
                chosen = logits.argmax(dim=-1).tolist()  # one host sync for every row
            for i, tok in enumerate(chosen):
                drafts[i].append(tok)
            if step + 1 < k:
                logits = self.model(torch.tensor(chosen, device=self.device)[:, None], cache)[:, -1]
                for i, tok in enumerate(chosen):
                    fed[i].append(tok)
        self._rows.lengths[:n] = cache.lengths
        share = (time.perf_counter() - t0) / max(1, len(live))  # the pass drafts every live row at once
        return {i: Proposal(tokens=drafts[i], probs=torch.stack(qs[i]).cpu() if qs[i] else None, draft_s=share) for i in live}

    @torch.inference_mode()
    def propose(self, committed: list[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        keep = 0
        limit = min(len(self.fed), len(committed) - 1)  # always re-feed at least the last token
        while keep < limit and self.fed[keep] == committed[keep]:
            keep += 1
        self.cache.rollback(0, keep)
        del self.fed[keep:]
        if len(committed) + k > self.cache.max_seq:
            return Proposal(tokens=[], draft_s=time.perf_counter() - t0)
        feed = committed[keep:]
        if self.temperature <= 0:  # greedy: all k drafts in one CUDA graph where one applies
            chain = self.steps.draft_chain(feed, k)
            if chain is not None:
                self.fed.extend(feed + chain[:-1])  # the last draft is not fed
                return Proposal(tokens=chain, draft_s=time.perf_counter() - t0)
        logits = self._feed(feed)
        tokens, qs = [], []
        for i in range(k):
            if self.temperature > 0:
                q = softmax_t(logits, self.temperature)
                tok = sample(q, self.generator)
                qs.append(q)
            else:
                tok = int(logits.argmax().item())
            tokens.append(tok)
            if i + 1 < k:
                logits = self._feed([tok])
        q_all = torch.stack(qs).cpu() if qs else None
        return Proposal(tokens=tokens, probs=q_all, draft_s=time.perf_counter() - t0)
