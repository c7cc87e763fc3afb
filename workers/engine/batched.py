"""Batch > 1: B sequences decode together in static batches (`Workload.batch_size`).

`Verifier.run` hands a run with batch_size > 1 to `decode_batches`. Per batch of up to B prompts
(in workload order; the last batch may hold fewer):

    prefill   every prompt on its own row of a B-row KV cache, together: packed into one row of
              tokens per pass (`Transformer.prefill_packed`: no padding through the matrix
              products, causal attention per prompt), consecutive prompts in passes of at most
              `BatchSteps.prefill_tokens` tokens (eager, any lengths); first tokens
    steps     until every sequence of the batch is done:
        propose   for the live sequences, by the run's strategy (plain, in-rank drafter, drafter process,
                  simulated): `StepStrategy.propose_rows`, all rows in one head pass per depth for EAGLE-3
        score     one pass over [B, W] tokens, W = 1 + the longest proposal: row b is
                  [last_b, d_1 .. d_n] padded with its last token; a finished row is fed its last
                  token W times (masked: its logits are ignored and its cache rolled back)
        decide    for each live row on its own logits rows 0 .. n_b (the same rules as batch 1)
        commit    each row appends its tokens and rolls its cache back to base_b + 1 + accepted_b

The attention mask is per row and by position (`Transformer.rope_and_mask`), so rows of different
lengths, the padding and stale cache entries never mix: every sequence's greedy output is its
batch-1 output, up to floating-point near ties (a batch changes the GEMM shapes).

What runs batched: plain decoding, drafters inside the verifier ranks (the n-gram lookup: a copy
per row; an EAGLE-3 head at placement rank0 fed each row's hidden states: greedy chains for every
row in one head pass per depth, workers/drafters/eagle3/rows.py, else a copy per row), a drafter
process (a draft model or layer-skip, drafting every row in one pass, greedy drafts one CUDA graph
per (rows, k): `run_drafter_batched`), and simulated acceptance, wherever every rank decides for
itself (greedy decoding or simulated acceptance). A drafter process then exchanges one proposal
and one result per live sequence and step, in row order. On CUDA (engine.cuda_graphs) each pass shape (rows,
width) is one CUDA graph over static inputs and the whole static cache, captured before timing
(`BatchSteps`); it runs the batch-1 steps' fused step (merged weights, compiled bodies, the GEMV
picker, the split-KV Triton attention reading each row only up to its own positions) where the
engine built one, else the plain layers with SDPA under the position mask. A batch's wall time (prefills included) is charged once to the run; each prompt's
`seconds` runs from its batch's start to its own last token, its `prefill_s` from the batch's
start to its first token (the end of its prefill pass).

Drafters and the batched prefill: an in-rank EAGLE-3 head is handed its row's states of the packed
pass (after the batch's prefill every row's prompt entries go into the head cache in one packed
pass, `Eagle3Head.write_kv`: prefill time, as a serving engine runs the head in the prefill's
forward); an n-gram copy indexes its row's
prompt; a drafter process (draft model, layer-skip) prefills every row in packed passes of its
own as the batch starts, while the verifier prefills (`ModelDrafter.prefill_rows`).

    passes = BatchSteps(model, model.new_cache(B), use_graphs=True, allreduce=allreduce)
    prompts, stats = decode_batches(rank, strategy, model, workload, passes=passes)   # rank.cache: passes.full
"""

from __future__ import annotations

import sys
import time

import torch

from workers.engine.device_loop import phase
from workers.engine.link import VerifyResult
from workers.engine.rank import Rank, Sequence, finish
from workers.engine.strategies import StepStrategy
from workers.model.transformer import PREFILL_TOKENS, KVCache, Transformer, prefill_groups
from workers.spec import PromptResult, Workload, batch_refusal
from workers.spec.run_stats import RunStats, StepRecord, relative_margins


def static_pass(model: Transformer, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, fast=None) -> torch.Tensor:
    """Logits [n, W, V] of `tokens` [n, W] at positions `pos` [n, W] over the whole static cache: no
    shape depends on the sequences' lengths (graph-safe). fast: the fused step (merged weights,
    compiled bodies, the split-KV Triton attention reading each row up to its own positions), else
    the plain layers with SDPA under the position mask."""
    return model.logits((fast or model).hidden_at(tokens, pos, cache, cache.max_seq))


class BatchSteps:
    """The verify passes of batched decoding on one B-row cache (`full`, kept for the graphs' life):
    eager, or on CUDA one graph per (rows, width). Every TP rank must warm and run the same shapes."""

    def __init__(
        self, model: Transformer, full: KVCache, use_graphs: bool, allreduce=None, fast=None, prefill_tokens: int = PREFILL_TOKENS
    ):
        self.model, self.full, self.allreduce = model, full, allreduce
        self.prefill_tokens = prefill_tokens  # tokens per batched prefill pass (a longer prompt takes one alone)
        self.fast = fast  # the batch-1 steps' FusedStep (workers/engine/fused_step.py): its bodies take B rows too
        self.device = model.embed_tokens.weight.device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, width) -> (graph, inputs, staging, logits, allreduce calls)
        self._aux: dict[tuple[int, int], list[torch.Tensor]] = {}  # EAGLE-3: each graph's captured aux states (static outputs)
        self._pool = None

    def run(self, feed: list[list[int]], cache: KVCache, device_drafts=None) -> torch.Tensor:
        """Logits [n, W, V] of one pass over the rows of `feed` (n rows of W tokens) appended at each
        row's length in `cache` (the first n rows of `full`); every row's length advances by W.
        device_drafts: (rows, drafts [len(rows), k] on the device): those rows' tokens 1..k, in
        place of what `feed` holds there (never read on the host here)."""
        n, W = len(feed), len(feed[0])
        starts = list(cache.lengths)
        if max(starts) + W > cache.max_seq:
            raise ValueError(f"sequence length {max(starts) + W} exceeds the cache ({cache.max_seq})")
        if self.graphs.get((n, W)) is None:
            # eager (attends to the filled part only): no graphs here, or a shape `warm` did not capture
            # (capturing now would write scratch K/V into live rows)
            tokens = torch.tensor(feed, device=self.device)
            _overlay(tokens, device_drafts)
            return self.model(tokens, cache)
        if cache.k and cache.k[0].data_ptr() != self.full.k[0].data_ptr():
            raise ValueError("a batched pass runs on the rows of the cache its graphs were captured on")
        graph, inputs, staging, logits, calls = self.graphs[(n, W)]
        staging[0] = torch.tensor(feed)
        staging[1] = torch.tensor(starts)[:, None] + torch.arange(W)
        inputs.copy_(staging, non_blocking=True)
        _overlay(inputs[0], device_drafts)
        graph.replay()
        if self.model.aux_layers:
            self.model.aux = self._aux[(n, W)]
        if calls and self.allreduce is not None:  # a replay issues the allreduces its capture recorded
            self.allreduce.counters.calls += calls
        cache.lengths = [s + W for s in starts]
        return logits

    def warm(self, rows: set[int], widths: range) -> None:
        """Capture every (rows, width) a run will use, outside the timing; writes scratch K/V (the
        cache is reset before each batch)."""
        if not self.use_graphs:
            return
        gemv = getattr(self.fast, "gemv", None)
        if gemv is not None:  # the GEMV races (compiling, timing) per token count n x W, before any collective
            gemv.prepare(sorted({n * W for n in rows for W in widths}))
        if getattr(self.allreduce, "world_size", 1) > 1 and getattr(self.allreduce, "group", None) is not None:
            import torch.distributed as dist

            dist.barrier(group=self.allreduce.group)  # every rank starts the captures' collectives together
        for n in sorted(rows):
            for W in widths:
                if self.use_graphs and (n, W) not in self.graphs:
                    self.graphs[(n, W)] = self._capture_or_eager(n, W)
        self.full.reset()
        if (check := getattr(self.allreduce, "raise_if_timed_out", None)) is not None:
            check()  # a peer that arrived too late during the captures left wrong sums: say so now

    def _capture_or_eager(self, n: int, W: int):
        try:
            return self._capture(n, W)
        except Exception as e:  # noqa: BLE001 - a shape the graph cannot take: the eager pass still works
            print(
                f"spectune: batched pass ({n} x {W}) not captured ({type(e).__name__}: {str(e)[:160]}); running eagerly",
                file=sys.stderr,
                flush=True,
            )
            self.use_graphs = False
            return None

    def _capture(self, n: int, W: int):
        cache = self.full.view(0, n)
        inputs = torch.zeros(2, n, W, dtype=torch.long, device=self.device)  # token ids, positions
        staging = torch.zeros(2, n, W, dtype=torch.long).pin_memory()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # lazy kernels and the allocator, before the capture
            for _ in range(2):
                static_pass(self.model, inputs[0], inputs[1], cache, self.fast)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        counters = getattr(self.allreduce, "counters", None)
        before = counters.calls if counters is not None else 0
        with torch.cuda.graph(graph, pool=self._pool):
            logits = static_pass(self.model, inputs[0], inputs[1], cache, self.fast)
        calls = (counters.calls - before) if counters is not None else 0
        if counters is not None:
            counters.calls = before  # the capture itself ran nothing
        self._pool = graph.pool()
        self._aux[(n, W)] = list(self.model.aux)
        return graph, inputs, staging, logits, calls


def _overlay(tokens: torch.Tensor, device_drafts) -> None:
    """tokens [n, W] on the device: rows `rows` take their drafts at positions 1..k (device ops only)."""
    if device_drafts is None:
        return
    rows, drafts = device_drafts
    k = drafts.shape[1]
    if rows == list(range(tokens.shape[0])):
        tokens[:, 1 : 1 + k].copy_(drafts)
    else:
        tokens[torch.tensor(rows, device=tokens.device), 1 : 1 + k] = drafts


def why_not_batched(w: Workload, linked_drafter: bool, hidden_over_link: bool, tree: bool = False) -> str | None:
    """Why this run cannot decode in batches (None: it can): workers.spec.batch_refusal on the run's facts."""
    return batch_refusal(
        w.batch_size,
        drafter_process=linked_drafter,
        hidden_over_link=hidden_over_link,
        tree=tree and w.num_draft_tokens > 0,
        sampled=w.temperature > 0 and not w.simulated,
    )


def _step(rank: Rank, strategy: StepStrategy, passes: BatchSteps, cache: KVCache, seqs: list[Sequence], hidden) -> StepRecord:
    live = [s for s in seqs if not s.done]
    t0 = time.perf_counter()
    with phase("spectune.propose"):
        proposals = strategy.propose_rows(live)
    t1 = time.perf_counter()
    width = 1 + max(len(p.tokens) for p in proposals.values())
    feed = []
    if any(p.parents is not None for p in proposals.values()):
        raise ValueError(batch_refusal(2, drafter_process=False, hidden_over_link=False, tree=True, sampled=False))
    # drafts left on the device (an EAGLE-3 head's rows under engine.overlap): the verify pass reads
    # them there, queued behind the head's passes; the host reads them with the argmaxes
    on_device = [s.row for s in live if proposals[s.row].device_tokens is not None]
    drafts = torch.stack([proposals[r].device_tokens for r in on_device]) if on_device else None
    if drafts is not None:
        width = max(width, 1 + drafts.shape[1])
    for s in seqs:
        row = [s.tokens[-1], *proposals[s.row].tokens] if s.row in proposals else [s.tokens[-1]]
        feed.append(row + [row[-1]] * (width - len(row)))
    base = list(cache.lengths)
    calls0, comm0 = rank.counters.calls, rank.counters.seconds
    with phase("spectune.verify"):
        logits = passes.run(feed, cache, (on_device, drafts) if on_device else None)  # [n, W, V]; every row +W
    with phase("spectune.decide"):
        # one transfer to the host: the drafts left on the device and, greedy, every row's argmax (margins,
        # where recorded, and sampling read the logits themselves); queued before the look-ahead
        argmax = logits.argmax(dim=-1) if rank.w.temperature <= 0 else None
        k = drafts.shape[1] if on_device else 0
        more = any(rank.w.max_new_tokens - s.n_generated > k + 1 for s in live)  # a next step (unless an EOS ends it)
        keep = None
        if argmax is not None and hidden is not None and on_device and len(on_device) == len(live) and more:
            keep = strategy.ahead_keep(on_device, drafts, argmax)  # the drafts each row keeps, on the device
        parts = ([drafts.flatten()] if on_device else []) + ([argmax.flatten()] if argmax is not None else [])
        read = HostRead(parts + ([keep] if keep is not None else []))
        if keep is not None:  # the head drafts the next step behind this pass while the host books this one
            strategy.look_ahead(on_device, drafts, argmax, keep, hidden.model.aux)
        values = read.values()
        if keep is not None:
            values, assumed = values[: -len(on_device)], values[-len(on_device) :]
        kept = _decide_rows(rank, strategy, cache, seqs, live, proposals, logits, base, hidden, (on_device, drafts), argmax, values)
        if keep is not None and any(not r.done and r.accepted != a for r, a in zip(kept, assumed)):
            strategy.drop_ahead()  # the verdicts kept other drafts than the look-ahead drafted from
    t2 = time.perf_counter()
    draft_s, verify_s = sum(p.draft_s for p in proposals.values()), t2 - t1
    # drafts left on the device: one span around every row's head passes, done once decide read the
    # argmaxes; the verify time is the rest of the step (as batch 1's overlapped steps count it). Drafts
    # of the look-ahead ran mostly during the step before, behind its host's booking: there the span is
    # the head's GPU time all the same, and the rest of the step undercounts the verify pass by the overlap
    if (span := next((p.gpu_span for p in proposals.values() if p.gpu_span is not None), None)) is not None:
        draft_s = span[0].elapsed_time(span[1]) / 1e3
        verify_s = max(0.0, t2 - t0 - draft_s)
    return StepRecord(
        drafted=sum(len(p.tokens) for p in proposals.values()),
        accepted=sum(r.accepted for r in kept),
        emitted=sum(len(r.tokens) for r in kept),
        step_s=t2 - t0,
        verify_s=verify_s,
        draft_s=draft_s,
        comm_calls=rank.counters.calls - calls0,
        comm_s=rank.counters.seconds - comm0,
        rows=len(live),
        row_drafts=tuple((len(proposals[s.row].tokens), r.accepted) for s, r in zip(live, kept)),
    )


class HostRead:
    """Device tensors read back in one transfer: on CUDA queued now into pinned memory behind an event,
    so that work queued after it (a look-ahead) does not delay the read; `values()` waits for the event."""

    def __init__(self, parts: list[torch.Tensor]):
        self.event = self.host = None
        if not parts:
            self.flat = []
            return
        flat = torch.cat(parts)
        if not flat.is_cuda:
            self.flat = flat.tolist()
            return
        self.host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        self.host.copy_(flat, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def values(self) -> list:
        if self.event is None:
            return self.flat
        self.event.synchronize()
        return self.host.tolist()


def _decide_rows(
    rank: Rank, strategy: StepStrategy, cache: KVCache, seqs, live, proposals, logits, base, hidden, device_drafts, argmax, read
) -> list[VerifyResult]:
    """Each live row's verdict on its own logits rows (the batch-1 rules), published and committed;
    its in-rank EAGLE-3 head handed the states of what it kept; every row's cache rolled back.
    device_drafts: (rows, drafts [len(rows), k]) still on the device; read: those drafts, then (greedy)
    every row's argmax [n, W], on the host (`HostRead`)."""
    rows, drafts = device_drafts
    k = drafts.shape[1] if rows else 0
    for i, r in enumerate(rows):
        proposals[r].tokens = read[i * k : (i + 1) * k]
    targets = None
    if argmax is not None:
        W, read = argmax.shape[1], read[len(rows) * k :]
        targets = [read[b * W : (b + 1) * W] for b in range(argmax.shape[0])]
    kept = []
    for s in live:
        p = proposals[s.row]
        if targets is not None and s.top2 is None:
            n, new = strategy.decide_greedy(s, p, targets[s.row][: 1 + len(p.tokens)])
        else:
            n, new = strategy.decide(s, p, logits[s.row, : 1 + len(p.tokens)])
        new, done = finish(new, s.n_generated, rank.w)
        res = rank.publish(VerifyResult(accepted=n, tokens=new, done=done))
        if hidden is not None:  # EAGLE-3 in the rank: this row's states of [last, accepted drafts] to its head
            s.drafter.observe_rows(hidden.model.aux, s.row, 1 + res.accepted)
        # keep [last, d_1..d_accepted]; the correction / bonus token is fed next step
        cache.rollback(s.row, base[s.row] + 1 + res.accepted)
        s.commit(res)
        s.steps += 1
        s.accepted += len(res.tokens) - 1
        kept.append(res)
    for s in seqs:
        if s.row not in proposals:
            cache.rollback(s.row, base[s.row])  # a finished row: its padding pass is forgotten
    return kept


def _prefill(
    rank: Rank, strategy: StepStrategy, model: Transformer, seqs: list[Sequence], cache: KVCache, budget: int, observe: bool, t_batch: float
) -> list[float]:
    """Every sequence's prompt into its row of `cache` (reset), consecutive rows packed into passes of
    at most `budget` tokens; after each pass, in row order, each row's first token is published, its
    in-rank drafter handed its states (`observe`) and the strategy told. Returns each row's seconds
    from `t_batch` to its first token. Every TP rank runs the same passes (their allreduces line up)."""
    prompts = [list(s.tokens) for s in seqs]  # before any commit: the prompts alone
    done = [0.0] * len(seqs)
    for rows in prefill_groups([len(p) for p in prompts], budget):
        part = cache.view(rows.start, len(rows))
        logits = model.prefill_packed([prompts[b] for b in rows], part)  # [rows, V]
        cache.lengths[rows.start : rows.stop] = part.lengths
        lengths = [len(prompts[b]) for b in rows]
        for i, b in enumerate(rows):
            seq = seqs[b]
            seq.commit(rank.publish(rank.first_token(logits[i])))
            if observe:  # EAGLE-3 in the rank: this row's states of its prompt, out of the packed pass
                seq.drafter.observe(model.packed_rows(lengths, i))
            strategy.prefilled(seq, logits[i])
        now = time.perf_counter()
        for b in rows:
            done[b] = now - t_batch
    strategy.prefilled_rows(seqs)  # an in-rank EAGLE-3 head's prompt entries, all rows in one pass
    if cache.k and cache.k[0].is_cuda:  # its kernels run now: prefill time, not the first step's
        torch.cuda.synchronize(cache.k[0].device)
    return done


def decode_batches(
    rank: Rank, strategy: StepStrategy, model: Transformer, w: Workload, passes: BatchSteps, check=None
) -> tuple[list[PromptResult], RunStats]:
    """Every prompt of `w`, B at a time on the B rows of `passes.full`. `check(tokens)` runs on each
    finished sequence's output (the TP ranks' agreement check)."""
    if not rank.local:
        raise ValueError("batched decoding needs every rank to decide for itself (greedy decoding or simulated acceptance)")
    B, full = w.batch_size, passes.full
    # hidden states (EAGLE-3 inside the rank) go to each row's own head here, not through Rank.publish (row 0's)
    hidden, rank.hidden = rank.hidden, None
    if len(full.lengths) < B:
        raise ValueError(f"the batch cache holds {len(full.lengths)} rows, batch_size is {B}")
    # every pass shape the run can meet, captured before the timing: full batches and the last one
    sizes = {B, len(w.prompts) % B or B}
    passes.warm(sizes, range(1, w.num_draft_tokens + 2))
    drafters = strategy.row_drafters(B, sizes)
    stats, results = RunStats(), []
    for first in range(0, len(w.prompts), B):
        chunk = w.prompts[first : first + B]
        cache = full.view(0, len(chunk))
        cache.reset()
        t_batch = time.perf_counter()
        strategy.begin_batch(len(chunk))
        seqs = []
        for b, prompt in enumerate(chunk):
            seq = Sequence.of(prompt, row=b)
            seq.started, seq.drafter = t_batch, drafters[b]
            strategy.begin_prompt(seq)
            seqs.append(seq)
        prefill_s = _prefill(rank, strategy, model, seqs, cache, passes.prefill_tokens, hidden is not None, t_batch)
        ended = {s.row: time.perf_counter() for s in seqs if s.done}
        while any(not s.done for s in seqs):
            stats.steps.append(_step(rank, strategy, passes, cache, seqs, hidden))
            now = time.perf_counter()
            ended.update({s.row: now for s in seqs if s.done and s.row not in ended})
            if rank.on_progress is not None:
                rank.on_progress(sum(s.n_generated for s in seqs), now - t_batch)
        stats.seconds += time.perf_counter() - t_batch
        for s in seqs:
            if check is not None:
                check(s.generated)
            stats.tokens += s.n_generated
            results.append(
                PromptResult(
                    tokens=s.generated,
                    seconds=ended[s.row] - t_batch,
                    steps=s.steps,
                    accepted=s.accepted,
                    prefill_s=prefill_s[s.row],
                    margins=relative_margins(s.top2 or []),
                )
            )
    return results, stats


def run_drafter_batched(drafter, link, w: Workload) -> None:
    """The drafter process's side of `decode_batches` (same batches, same message order): per batch,
    the first tokens of every row; then per step a proposal for each live row (k > 0) and each live
    row's result, in row order."""
    drafter.begin(w.temperature, w.seed + 1)
    B, k = w.batch_size, w.num_draft_tokens
    if k > 0:  # lazy kernels and allocations before the verifier's clock starts (the verifier warms its passes alike)
        with torch.inference_mode():
            drafter.warm_rows(k, {B, len(w.prompts) % B or B})  # a model drafter's CUDA graphs per (rows, k)
            drafter.begin_rows(B)
            drafter.propose_rows([[1, 2, 3]] * B, list(range(B)), k)
    link.drafter_ready()
    with torch.inference_mode():
        for first in range(0, len(w.prompts), B):
            committed = [list(p) for p in w.prompts[first : first + B]]
            done = [False] * len(committed)
            drafter.begin_rows(len(committed))
            if k > 0:  # the prompts now, beside the verifier's prefill: the first step feeds first tokens only
                drafter.prefill_rows(committed)
            for i in range(len(committed)):
                res = link.recv_result_from_verifier()
                committed[i].extend(res.tokens)
                done[i] = res.done
            while not all(done):
                live = [i for i, d in enumerate(done) if not d]
                if k > 0:
                    proposals = drafter.propose_rows(committed, live, k)
                    for i in live:
                        link.send_proposal(proposals[i])
                for i in live:
                    res = link.recv_result_from_verifier()
                    committed[i].extend(res.tokens)
                    done[i] = res.done
