"""Every row's greedy EAGLE-3 chain of a batch in one head pass per depth (batch > 1, placement rank0).

    rows = Eagle3Rows(head, 8, fast=step)              # one 8-row head cache; on CUDA a graph per (rows, k)
    rows.warm(k, {8, 3})                               # capture (rows, k) before timing (CUDA)
    rows.begin(n)                                      # a batch of n rows (n <= 8)
    rows.rows[i].prefill(prompt); rows.rows[i].observe(states)   # row i's drafter, as Eagle3Drafter's
    rows.feed_prompts({i: prompt_i + [first_i], ...}, k)   # optional: the prompts' entries now, one packed pass
    proposals = rows.propose({i: committed_i, ...}, k)  # {row: Proposal} for the live rows
    proposals = rows.propose(..., k, on_device=True)    # drafts left on the device (Proposal.device_tokens)
    rows.launch_ahead(rows, drafts, argmax, keep, aux, k)  # behind the verify pass: the next step's drafts

Each row keeps `Eagle3Drafter`'s bookkeeping (the verifier's states not yet fed, how many positions
they cover, `ctx`: the entries fed with them) in its own row of one head cache. A proposal for the
live rows:

    backlog   a row with more entries to feed than a step sends (the prompt, at a batch's first
              proposal, unless `feed_prompts` took it after the prefill): all but its last entry go
              into its cache in one packed pass for every such row (`Eagle3Head.write_kv`: one
              layer, so these entries need their K/V only)
    depth 1   one pass over [n, k + 1]: row i's entries (x_{j+1}, fc(aux_j)) at its own positions,
              padded after its last entry; each row's first draft from its own last entry (`at`)
    depth 2.. k - 1 passes of one entry per row: the row's draft and its pre-norm output, at the
              position after its previous entry

A row's states of a batched verify pass arrive as a reference (`observe_rows`: the pass's aux
outputs, the row, how many positions), not a copy: where every drafting row's only unfed states are
that one pass's (every step after a batch's first), the depth-1 input of all rows is that pass's
[n, W] block, copied once per aux layer, instead of a slice, a concatenation and a copy per row.
With `on_device` the drafts stay on the device for the verify pass (engine.overlap, greedy): no host
read between the head's passes and the verifier's, the drafts read back with its argmaxes
(workers/engine/batched.py), and CUDA events around the passes give the draft time.

The look-ahead (`launch_ahead`): right behind a verify pass, before the host reads its verdict, the
next step's depth passes are queued on the device, each row fed drafts[:a] + argmax[a] (a: the drafts
it keeps, counted on the device by the greedy rule, or the strategy's plan) with that pass's aux
states; the host decides and books the step while the head drafts. The next `propose` takes those
drafts where every row is one the look-ahead drafted for, fed exactly those states (else it drafts
afresh over the same entries), so a step's GPU waits for the host only to read the verdict.

Padding sits at positions past a row's entries: a query reads slots up to its own position only, and
the row's next drafts overwrite them before any query reaches them. A row that does not draft this
step (finished, or its head cache full) is fed one scratch entry at its first free position (at most
max_seq - k - 1), which nothing reads. Outputs are each row's `Eagle3Drafter` chain (greedy), up to
the last bits of matrix products over more rows (`tests/engine/test_eagle3_rows.py`).

On CUDA (the drafter's chain captured) the depth passes of n rows and k drafts are one CUDA graph over
static inputs (tokens, positions, aux states, `at`) and the whole static head cache, through the
chain's `HeadFastStep` where it built one (merged weights, GEMV picker, the split-KV Triton attention
reading each row up to its own positions), captured by `warm`; elsewhere the same body runs eagerly
(on the eager head step, over the filled part of the cache).
"""

from __future__ import annotations

import sys
import time

import torch

from workers.engine.drafter import Drafter
from workers.engine.graphs import RowInputs, capture_graph, to_device
from workers.engine.link import Proposal
from workers.model.transformer import aux_rows
from workers.spec import MAX_DRAFT_TOKENS


class _PassRows:
    """Row `row`'s first n positions of a batched pass's aux outputs (valid until the next pass)."""

    __slots__ = ("aux", "row", "n")

    def __init__(self, aux: list[torch.Tensor], row: int, n: int):
        self.aux, self.row, self.n = aux, row, n

    def tensor(self) -> torch.Tensor:
        return aux_rows(self.aux, self.row, self.n)


class _Ahead:
    """A look-ahead's launch (`Eagle3Rows.launch_ahead`): for which rows and k, over which pass's aux
    states, its drafts [n, k] on the device, its CUDA-event span and host seconds."""

    __slots__ = ("rows", "k", "n", "aux", "out", "span", "host_s")

    def __init__(self, rows, k, n, aux, out, span, host_s):
        self.rows, self.k, self.n, self.aux, self.out, self.span, self.host_s = rows, k, n, aux, out, span, host_s


class _RowState:
    __slots__ = ("states", "n_states", "ctx")

    def __init__(self):
        self.states: list = []  # aux states the verifier sent, not yet fed (fc not yet applied): tensors or _PassRows
        self.n_states = 0  # positions the verifier has sent states for
        self.ctx = 0  # cache entries fed with the verifier's states (the rest are drafts)


class Eagle3Row(Drafter):
    """Row i of an `Eagle3Rows`: what the batch loop hands a sequence (prefill, observe); its
    proposals come from `Eagle3Rows.propose` with the other rows'."""

    kind = "eagle3"
    reads_hidden = True

    def __init__(self, group: Eagle3Rows, row: int):
        self.group, self.row = group, row

    def prefill(self, prompt: list[int]) -> None:
        self.group.reset_row(self.row)

    def observe(self, hidden: torch.Tensor) -> None:
        self.group.observe(self.row, hidden)

    def observe_rows(self, aux: list, row: int, n: int) -> None:
        self.group.observe_pass(self.row, aux, row, n)

    def propose(self, committed: list[int], k: int) -> Proposal:
        return self.group.propose({self.row: committed}, k)[self.row]


class Eagle3Rows:
    def __init__(self, head, rows: int, fast=None, capture: bool | None = None):
        """head: the Eagle3Head (shared with the drafter); rows: the most rows a batch holds; fast:
        the chain's HeadFastStep (None: the eager head step); capture: CUDA graphs (default: on a GPU)."""
        self.head, self.n_rows, self.fast = head, rows, fast
        self.device = head.fc.weight.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.cache = head.new_cache(rows)
        self.rows = [Eagle3Row(self, i) for i in range(rows)]
        self.state = [_RowState() for _ in range(rows)]
        self.n = rows  # rows of the current batch (`begin`)
        width, dtype = MAX_DRAFT_TOKENS + 1, head.fc.weight.dtype
        self._in = RowInputs(rows, width, self.device)  # tokens, positions, at: one host-to-device copy a step
        self._aux = torch.zeros(rows, width, head.fc.in_features, dtype=dtype, device=self.device)  # fc's input
        cuda = self.device.type == "cuda"
        self._views = {}  # n -> the first n rows of the cache (the tensors a graph captured)
        # around the depth passes when the drafts stay on the device: the draft time, read after the verify pass
        # two pairs in turn: a look-ahead records the next step's span before this step's is read
        self._spans = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(2)] if cuda else None
        self._span_turn = 0
        self.graphs: dict[tuple[int, int], tuple] = {}  # (n, k) -> (graph, drafts [n, k])
        self._pool = None
        self.passes = 0  # head passes run (a test counts them: one per depth)
        self._ahead: _Ahead | None = None  # the next step's drafts, launched behind the verify pass (`launch_ahead`)
        self._index: tuple | None = None  # (live rows, their device index)
        self.ahead_used = 0  # proposals that took the look-ahead's drafts (a test counts them)

    def begin(self, n: int) -> None:
        """A new batch of n rows (rows 0 .. n - 1); each row is reset by its `prefill`."""
        if not 1 <= n <= self.n_rows:
            raise ValueError(f"a batch of {n} rows on a head cache of {self.n_rows}")
        self.n = n

    def reset_row(self, i: int) -> None:
        self.cache.lengths[i] = 0
        self.state[i] = _RowState()

    @torch.inference_mode()
    def observe(self, i: int, hidden: torch.Tensor) -> None:
        """Row i: the verifier's aux states [m, 3 x target_hidden] of its next m committed positions."""
        if hidden.shape[0]:
            self.state[i].states.append(hidden.to(self.device, self.head.fc.weight.dtype))
            self.state[i].n_states += hidden.shape[0]

    def observe_pass(self, i: int, aux: list[torch.Tensor], row: int, n: int) -> None:
        """Row i: positions 0..n-1 of row `row` of the last batched pass, by reference. A reference
        still unfed from an earlier pass would now read this pass's outputs (a graph's static
        outputs are overwritten by every replay): `propose` feeds or drops the references of every
        row it drafts for before the next pass (a finished row keeps its last one, never read, and
        is observed no more), and a caller that skipped it is stopped here."""
        if any(isinstance(st, _PassRows) for st in self.state[i].states):
            raise RuntimeError(f"EAGLE-3 row {i}: states of an earlier batched pass were never fed (propose between passes)")
        if n:
            self.state[i].states.append(_PassRows(aux, row, n))
            self.state[i].n_states += n

    @torch.inference_mode()
    def feed_prompts(self, committed: dict[int, list[int]], k: int) -> None:
        """After a batch's prefill (row -> prompt + first token): every row's prompt entries but the
        last into its head cache in one packed pass, what its first proposal would feed first, so
        the head's share of the prefill is prefill time rather than a decode step's (in a serving
        engine the head runs in the prefill's forward). The last entry waits for the first step. A
        row without room for k drafts after its prompt is left as it is (it never drafts)."""
        backlog = []
        for i, tokens in committed.items():
            r = self.state[i]
            feed = tokens[r.ctx + 1 : r.n_states + 1]
            if r.n_states != len(tokens) - 1 or len(feed) < 2 or r.n_states + k > self.cache.max_seq:
                continue  # propose says what is wrong, or has nothing to pack
            aux = _cat(r.states)
            self.cache.rollback(i, r.ctx)
            backlog.append((i, feed[:-1], aux[:-1], r.ctx))
            r.ctx += len(feed) - 1
            self.cache.lengths[i] = r.ctx
            r.states = [aux[-1:]]
        if backlog:
            self._write_backlog(backlog)

    def _view(self, n: int):
        if n not in self._views:
            self._views[n] = self.cache.view(0, n)
        return self._views[n]

    @torch.inference_mode()
    def propose(self, committed: dict[int, list[int]], k: int, on_device: bool = False) -> dict[int, Proposal]:
        """k greedy drafts for each row in `committed` (row -> its committed tokens: every live row
        of the batch), from one pass per depth over the batch's n rows. on_device: each drafting
        row's drafts as a device view [k] (`Proposal.device_tokens`, with CUDA events around the
        passes where captured), not read back."""
        t0 = time.perf_counter()
        n, W, cache, max_seq = self.n, k + 1, self.cache, self.cache.max_seq
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"k = {k} drafts: 1 .. {MAX_DRAFT_TOKENS}")
        ahead, self._ahead = self._ahead, None
        if ahead is not None and on_device and (taken := self._take_ahead(ahead, committed, k)) is not None:
            return taken
        feeds: dict[int, tuple[list[int], list]] = {}  # row -> (tokens, its unfed states)
        backlog = []  # (row, tokens, aux, first position)
        for i, tokens in committed.items():
            r = self.state[i]
            if r.n_states != len(tokens) - 1:
                raise RuntimeError(f"EAGLE-3 row {i}: hidden states for {r.n_states} positions, {len(tokens)} tokens committed")
            cache.rollback(i, r.ctx)
            if r.n_states + k > max_seq:  # no room: no drafts, now or later (n_states only grows), so its
                r.states = []  # states are never fed: dropped (a reference would outlive its pass)
                continue
            states, r.states = r.states, []
            feed = tokens[r.ctx + 1 : r.n_states + 1]
            if len(feed) > W:  # the prompt (a batch's first proposal): all but the last entry in the packed pass
                aux = _cat(states)
                backlog.append((i, feed[:-1], aux[:-1], cache.lengths[i]))
                cache.lengths[i] += len(feed) - 1
                feed, states = feed[-1:], [aux[-1:]]
            feeds[i] = (feed, states)
        span = self._next_span() if on_device and self.capture and feeds else None
        if span:  # from here: the prompts' packed pass is draft time too
            span[0].record()
        if backlog:
            self._write_backlog(backlog)
        drafts: dict[int, list[int] | torch.Tensor] = {}
        if feeds:
            for i, r in enumerate(self.state[:n]):
                if i not in feeds:  # scratch at its first free position (a full row's last ones: it drafts no more)
                    cache.lengths[i] = min(r.ctx, max(0, max_seq - k - 1))
            out = self._draft(feeds, n, k)
            if span:
                span[1].record()
            out = out if on_device else out.tolist()  # one host read for every row
            for i, r in enumerate(self.state[:n]):
                if i in feeds:
                    drafts[i] = out[i]
                    cache.lengths[i] += len(feeds[i][0]) + k - 1  # the last draft is not fed
                    r.ctx = r.n_states
                else:
                    cache.lengths[i] = r.ctx  # its entries, as before the pass
        share = (time.perf_counter() - t0) / max(1, len(committed))  # one pass drafts every row
        if on_device:
            return {
                i: Proposal(tokens=[], device_tokens=drafts[i], gpu_span=span, draft_s=share)
                if i in drafts
                else Proposal(tokens=[], draft_s=share)
                for i in committed
            }
        return {i: Proposal(tokens=drafts.get(i, []), draft_s=share) for i in committed}

    def _row_index(self, rows: list[int]) -> torch.Tensor:
        """`rows` as a device index, sent without a host sync (pinned, non-blocking; a pageable copy
        would wait for the verify pass), kept while the batch's live rows stay the same."""
        key = tuple(rows)
        if self._index is None or self._index[0] != key:
            self._index = (key, to_device(rows, self.device))
        return self._index[1]

    def greedy_keep(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Device ops: the drafts each of `rows` keeps by the greedy rule (while d_i equals the verify
        pass's argmax at i: `StepStrategy.decide_greedy`), [len(rows)]."""
        k = drafts.shape[1]
        return (drafts == targets.index_select(0, self._row_index(rows))[:, :k]).long().cumprod(1).sum(1)

    @torch.inference_mode()
    def launch_ahead(
        self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, aux: list[torch.Tensor], k: int
    ) -> bool:
        """The next step's depth passes, queued on the device right behind the verify pass that judged
        this step's drafts, before the host reads its verdict (engine.overlap, greedy or simulated
        acceptance): while the host decides and books the step, the head already drafts the next one.
        rows: the live rows, in order; drafts [len(rows), k]: what they proposed (on the device);
        targets [>= n, >= k + 1]: the verify pass's argmax per row and position; keep [len(rows)] (on
        the device): the drafts each row keeps (`greedy_keep`, or the strategy's plan), so its next
        entries are drafts[:a] + targets[a] at the positions after its fed entries, with the pass's aux
        states (`aux`, rows 0 .. a). Every row's next feed is then exactly what `propose` would stage:
        `propose` takes these drafts where every row it drafts for is one of these, fed that pass's
        states (`_take_ahead`), unless the step's verdicts kept other counts than `keep` (the batched
        step compares them and calls `drop_ahead`); otherwise it drafts afresh, over the same entries.
        Returns whether it launched (not: a row still holding unfed states, or without room for two
        more steps). No host sync: every input goes to the device behind the verify pass."""
        n, W, cache, max_seq = self.n, k + 1, self.cache, self.cache.max_seq
        state = self.state
        if not rows or len(rows) != drafts.shape[0] or aux[0].shape[0] < n or aux[0].shape[1] < W:
            return False
        if any(state[i].states or state[i].ctx != state[i].n_states or state[i].n_states + 1 + 2 * k > max_seq for i in rows):
            return False
        t0 = time.perf_counter()
        live = set(rows)
        starts = [state[i].ctx if i in live else min(state[i].ctx, max(0, max_seq - k - 1)) for i in range(n)]
        self._in.send([0] * (n * W), [p + j for p in starts for j in range(W)], [0] * n)
        tok, _, at = self._in.views(n, W)
        index = self._row_index(rows)
        keep = keep.to(torch.long)
        cols = torch.arange(W, device=self.device)
        padded = torch.cat([drafts, drafts[:, -1:]], dim=1)  # [rows, W]: position k is never a kept draft
        tok.index_copy_(0, index, torch.where(cols[None, :] < keep[:, None], padded, targets.index_select(0, index)[:, :W]))
        at.index_copy_(0, index, keep)
        self._copy_pass_aux(aux, n, W)  # each row's states of [last, d_1 .. d_k] in the pass
        for i in range(n):
            cache.lengths[i] = starts[i]
        span = self._next_span() if self.capture else None
        if span:
            span[0].record()
        out = self._passes(n, k)
        if span:
            span[1].record()
        for i in range(n):
            cache.lengths[i] = state[i].ctx  # as before: a fresh `propose` re-feeds from here
        self._ahead = _Ahead(tuple(rows), k, n, aux, out, span, time.perf_counter() - t0)
        return True

    def drop_ahead(self) -> None:
        """The step's verdicts kept other drafts than the look-ahead assumed: the next proposal drafts afresh."""
        self._ahead = None

    def _next_span(self):
        """CUDA events around one step's depth passes (the draft time, read once the step's verdict is)."""
        if self._spans is None:
            return None
        self._span_turn ^= 1
        return self._spans[self._span_turn]

    def _take_ahead(self, ahead: _Ahead, committed: dict[int, list[int]], k: int) -> dict[int, Proposal] | None:
        """The look-ahead's drafts where every row of `committed` is one it drafted for, fed exactly the
        states it assumed (the judged pass's, one reference, of 1 + its kept drafts positions), else None.
        A row it drafted for that has since finished is left out (its entries past its own are never read)."""
        if ahead.k != k or ahead.n != self.n or not set(committed) <= set(ahead.rows):
            return None
        for i, tokens in committed.items():
            r = self.state[i]
            if len(r.states) != 1 or not isinstance(ref := r.states[0], _PassRows) or ref.aux is not ahead.aux or ref.row != i:
                return None
            if r.n_states != len(tokens) - 1 or r.n_states - r.ctx != ref.n or ref.n > k + 1:
                return None
        for i in committed:
            r = self.state[i]
            self.cache.lengths[i] = r.n_states + k - 1  # its new entries and k - 1 drafts fed (the last is not)
            r.states, r.ctx = [], r.n_states
        self.ahead_used += 1
        share = ahead.host_s / len(committed)
        span = ahead.span
        return {i: Proposal(tokens=[], device_tokens=ahead.out[i], gpu_span=span, draft_s=share) for i in committed}

    def _write_backlog(self, backlog) -> None:
        dev = self.device
        tokens = torch.tensor([t for _, f, _, _ in backlog for t in f], device=dev)
        rows = torch.tensor([i for i, f, _, _ in backlog for _ in f], device=dev)
        pos = torch.tensor([s + j for _, f, _, s in backlog for j in range(len(f))], device=dev)
        aux = torch.cat([a for _, _, a, _ in backlog])
        self.head.write_kv(tokens, self.head.fc(aux), rows, pos, self.cache)

    def _draft(self, feeds: dict[int, tuple[list[int], list]], n: int, k: int) -> torch.Tensor:
        """Stage every row's entries and run the depth passes: drafts [n, k] (target ids)."""
        W, lengths = k + 1, self.cache.lengths
        tok, pos, at = [], [], []
        for i in range(n):
            feed = feeds[i][0] if i in feeds else [0]
            tok += feed + [feed[-1]] * (W - len(feed))
            pos += range(lengths[i], lengths[i] + W)
            at.append(len(feed) - 1)
        self._in.send(tok, pos, at)
        self._stage_aux(feeds, n, W)
        return self._passes(n, k)

    def _passes(self, n: int, k: int) -> torch.Tensor:
        """The depth passes over the staged inputs of n rows (cache lengths at each row's first entry):
        the graph of (n, k), captured on first use, else eagerly over the filled part of the cache."""
        self.passes += k
        if not self.capture:
            return self._run(n, k, kv_len=min(self.cache.max_seq, max(self.cache.lengths[:n]) + k + 1 + k))
        if (n, k) not in self.graphs:
            self.graphs[(n, k)] = self._capture(n, k)
        graph, out = self.graphs[(n, k)]
        graph.replay()
        return out

    def _copy_pass_aux(self, aux: list[torch.Tensor], n: int, w: int) -> None:
        """fc's input of the first n rows' first w entries from one batched pass's aux outputs: one
        copy per aux layer (rows past their entries copy padding nothing reads)."""
        col = 0
        for a in aux:
            d = a.shape[-1]
            self._aux[:n, :w, col : col + d].copy_(a[:n, :w])
            col += d

    def _stage_aux(self, feeds: dict[int, tuple[list[int], list]], n: int, W: int) -> None:
        """fc's input: each feeding row's unfed states at its first entries. Where every one is one
        reference into the same batched pass (each step after a batch's first), that pass's block of
        the first n rows, one copy per aux layer (rows past their entries copy padding nothing reads)."""
        refs = [st[0] for _, st in feeds.values()]
        if all(len(st) == 1 for _, st in feeds.values()) and all(isinstance(r, _PassRows) for r in refs):
            aux = refs[0].aux
            if all(r.aux is aux and r.row == i for r, i in zip(refs, feeds)) and aux[0].shape[0] >= n:
                self._copy_pass_aux(aux, n, min(W, aux[0].shape[1]))
                return
        for i, (feed, states) in feeds.items():
            self._aux[i, : len(feed)].copy_(_cat(states))

    def warm(self, k: int, sizes) -> None:
        """Capture the depth passes of k drafts for every batch of `sizes` rows (CUDA), outside any
        timing: the GEMV picker's races at their widths first. Writes scratch entries: every row is
        reset by its prefill before use."""
        if not self.capture:
            return
        sizes = sorted(n for n in set(sizes) if 1 <= n <= self.n_rows)
        if self.fast is not None:
            self.fast.prepare(sorted({n * (k + 1) for n in sizes} | set(sizes)), heads=sizes)
        self._in.zero()  # valid inputs for the captures' own runs (an earlier k's `at` may not be)
        for n in sizes:
            if (n, k) not in self.graphs:
                self.cache.lengths[:n] = [0] * n
                self.graphs[(n, k)] = self._capture(n, k)
        self.cache.reset()

    def _step(self, tok, g, pos, cache, kv_len: int, at=None):
        if self.fast is not None:
            return self.fast.step_rows(tok, g, pos, cache, at)
        return self.head.step_rows(tok, g, pos, cache, kv_len, at)

    def _run(self, n: int, k: int, kv_len: int | None = None) -> torch.Tensor:
        """Device ops only (graph-safe): the depth passes over the staged rows -> drafts [n, k]."""
        head, W = self.head, k + 1
        cache = self._view(n)
        kv_len = kv_len or cache.max_seq
        tok, pos, at = self._in.views(n, W)
        h, logits = self._step(tok, head.fc(self._aux[:n, :W]), pos, cache, kv_len, at)
        nxt = head.to_target(logits.argmax(-1))  # [n]
        drafts = [nxt]
        h = h.gather(1, at.view(n, 1, 1).expand(n, 1, h.shape[-1]))  # [n, 1, hidden]: each row's last entry
        p = pos.gather(1, at.view(n, 1))
        for _ in range(k - 1):
            p = p + 1
            h, logits = self._step(nxt.view(n, 1), h, p, cache, kv_len)
            nxt = head.to_target(logits.argmax(-1))
            drafts.append(nxt)
        return torch.stack(drafts, dim=1)

    def _capture(self, n: int, k: int):
        try:
            graph, out, self._pool = capture_graph(lambda: self._run(n, k), self.device, self._pool)
        except Exception as e:  # noqa: BLE001 - the eager head step still works
            if self.fast is None:
                raise
            print(
                f"spectune: EAGLE-3 batched head pass through the fast step failed ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200]}); eager head steps",
                file=sys.stderr,
                flush=True,
            )
            self.fast = None
            self.graphs.clear()
            self._pool = None
            graph, out, self._pool = capture_graph(lambda: self._run(n, k), self.device, self._pool)
        return graph, out


def _cat(states: list) -> torch.Tensor:
    """A row's unfed states, in order, as one tensor [positions, n_aux x dim]."""
    parts = [st.tensor() if isinstance(st, _PassRows) else st for st in states]
    return torch.cat(parts) if len(parts) > 1 else parts[0]
