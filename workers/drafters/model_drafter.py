"""Drafting with a (small) autoregressive model: a separate draft checkpoint, or the verifier's
own first L layers and head (layer-skip self-drafting). Both are a `Transformer`, unsharded.

The drafter's KV cache holds the tokens it has fed so far (`fed`). Before each proposal it rolls
back to the longest prefix of `fed` that the verifier committed, feeds the committed tokens it
has not seen, then drafts k tokens one at a time (greedy, or sampled at the trial temperature,
keeping q for rejection sampling).

Batch > 1 (`begin_rows` / `propose_rows`): the same per sequence, every sequence a row of one
batch cache, drafted together: one pass feeds each row's unseen tokens (padded to the longest,
the padding rolled back; a new batch's prompts are prefilled packed, `Transformer.prefill_packed`
in passes of at most PREFILL_TOKENS tokens: by `prefill_rows` as the batch starts, in a drafter
process while the verifier prefills, else at the first proposal), then k - 1
passes of one token per row. Greedy, past a batch's first proposal, on CUDA graphs (the drafter's
StepRunner): those k passes are one CUDA graph per (rows, k) (`warm_rows` captures them before
timing), through the runner's fused step where it built one: every row's feed padded to k + 1 at its
own positions over the whole static cache, each row's first draft read at its own last token (`at`)
and its next ones at the following positions, all on the device; one host read of every row's k
drafts. The padding sits past each row's tokens, where its drafts overwrite it before any query
reads it. Elsewhere (sampling, CPU, a feed wider than k + 1, a row near the cache's end) the eager
passes.
"""

from __future__ import annotations

import sys
import time

import torch

from workers.engine.drafter import Drafter
from workers.engine.graphs import RowInputs
from workers.engine.link import Proposal
from workers.engine.steps import StepRunner
from workers.engine.verify import probs as softmax_t
from workers.engine.verify import sample
from workers.model.transformer import PREFILL_TOKENS, Transformer, prefill_groups
from workers.spec.engine_config import EngineConfig


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
        # greedy batched drafts as one body per (rows, k): captured as CUDA graphs where the runner's
        # steps are (None: that; True on CPU runs the same body uncaptured, for tests)
        self.rows_static: bool | None = None
        self._rows_graphs: dict[tuple[int, int], tuple] = {}
        self._rows_views: dict[int, object] = {}
        self._rows_pool = None
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
            W = self.steps.max_width
            self._rows_in = RowInputs(n, W, self.device)  # tokens, positions, at: one host-to-device copy a step
            self._rows_graphs, self._rows_views, self._rows_pool = {}, {}, None  # bound to the old cache
        self._rows.reset()
        self._rows_fed = [[] for _ in range(n)]

    @torch.inference_mode()
    def prefill_rows(self, prompts: list[list[int]]) -> None:
        """A new batch's prompts into its rows, packed (after `begin_rows`): what the first proposal
        would feed, so it feeds each row's first token alone."""
        cache = self._rows.view(0, len(prompts))
        self._pack(prompts, cache)
        self._rows.lengths[: len(prompts)] = cache.lengths
        for seen, p in zip(self._rows_fed, prompts):
            seen[:] = p

    def _pack(self, feeds: list[list[int]], cache) -> torch.Tensor:
        """Every row from position 0, packed (no padding), in passes of at most PREFILL_TOKENS tokens:
        each row's last logits [rows, vocab]."""
        parts = []
        for rows in prefill_groups([len(f) for f in feeds], PREFILL_TOKENS):
            part = cache.view(rows.start, len(rows))
            parts.append(self.model.prefill_packed([feeds[i] for i in rows], part))
            cache.lengths[rows.start : rows.stop] = part.lengths
        return torch.cat(parts)

    def _static_rows(self) -> bool:
        return self.steps.use_graphs if self.rows_static is None else self.rows_static

    def warm_rows(self, k: int, sizes) -> None:
        """Capture the greedy batched drafts of k tokens for batches of `sizes` rows (CUDA graphs),
        outside any timing (after `begin`: greedy only); the GEMV picker's races at their widths first."""
        if not (self.steps.use_graphs and self.temperature <= 0 and 1 <= k < self.steps.max_width):
            return
        sizes = sorted(set(sizes))
        self.begin_rows(max(sizes))
        gemv = getattr(self.steps.fast, "gemv", None)
        if gemv is not None:
            gemv.prepare(sorted({n * (k + 1) for n in sizes} | set(sizes)))
        self._rows_in.zero()  # valid inputs for the captures' own runs (an earlier k's `at` may not be)
        for n in sizes:
            self._rows_graph(n, k)
        self._rows.reset()

    def _rows_graph(self, n: int, k: int):
        """The (n, k) graph, captured on first use; None where capturing failed (the eager passes then)."""
        key = (n, k)
        if key not in self._rows_graphs:
            from workers.engine.graphs import capture_graph

            try:
                graph, out, self._rows_pool = capture_graph(lambda: self._rows_run(n, k), self.device, self._rows_pool)
                self._rows_graphs[key] = (graph, out)
            except Exception as e:  # noqa: BLE001 - the eager passes still work
                print(
                    f"spectune: batched drafts ({n} rows, k = {k}) not captured ({type(e).__name__}: {str(e)[:160]}); eager passes",
                    file=sys.stderr,
                    flush=True,
                )
                self._rows_graphs[key] = None
        return self._rows_graphs[key]

    def _rows_run(self, n: int, k: int) -> torch.Tensor:
        """Device ops only (graph-safe): greedy drafts [n, k] after each row's staged feed (tokens,
        positions [n, k + 1], its last real entry `at`) over the whole static cache of the first n rows."""
        if n not in self._rows_views:
            self._rows_views[n] = self._rows.view(0, n)
        cache, model, W = self._rows_views[n], self.model, k + 1
        body = self.steps.fast or model  # the fused step's bodies take B rows (its GEMV picker included)
        tok, pos, at = self._rows_in.views(n, W)
        at = at.view(n, 1)
        h = body.hidden_at(tok, pos, cache, cache.max_seq)
        h = h.gather(1, at[:, :, None].expand(n, 1, h.shape[-1]))  # each row's last real token
        nxt = model.logits(h)[:, 0].argmax(-1)
        drafts, p = [nxt], pos.gather(1, at)
        for _ in range(k - 1):
            p = p + 1
            nxt = model.logits(body.hidden_at(nxt.view(n, 1), p, cache, cache.max_seq))[:, 0].argmax(-1)
            drafts.append(nxt)
        return torch.stack(drafts, dim=1)

    def _rows_static_drafts(self, feeds: list[list[int]], starts: list[int], k: int) -> list[list[int]] | None:
        """Greedy drafts of every row through the static body (a graph on CUDA); None where it does not apply."""
        n, W = len(feeds), k + 1
        if W > self.steps.max_width or max(len(f) for f in feeds) > W or max(starts) + 2 * k > self._rows.max_seq:
            return None  # a wide feed, or positions past the cache: the eager passes (which say so)
        graph = None
        if self.steps.use_graphs and (graph := self._rows_graph(n, k)) is None:
            return None
        self._rows_in.send(
            [t for f in feeds for t in f + [f[-1]] * (W - len(f))],
            [s + j for s in starts for j in range(W)],
            [len(f) - 1 for f in feeds],
        )
        if graph is None:
            return self._rows_run(n, k).tolist()
        graph[0].replay()
        return graph[1].tolist()  # one host read for every row

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
        static = not self.temperature > 0 and any(cache.lengths) and self._static_rows() and k >= 1
        if static and (chosen := self._rows_static_drafts(feeds, list(cache.lengths), k)) is not None:
            for i, (f, seen) in enumerate(zip(feeds, fed)):
                cache.lengths[i] += len(f) + k - 1  # the last draft is not fed
                seen.extend(f + chosen[i][:-1])
            self._rows.lengths[:n] = cache.lengths
            share = (time.perf_counter() - t0) / max(1, len(live))
            return {i: Proposal(tokens=chosen[i], draft_s=share) for i in live}
        if not any(cache.lengths):  # a new batch not prefilled by `prefill_rows`: every row from position 0
            logits = self._pack(feeds, cache)
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
