"""Step strategies of a verifier rank's decode loop: where a step's drafts come from and how it decides.

`Verifier.run` (workers/engine/verifier.py) is one prompt loop for every mode; the state it carries
(`Sequence`, `Rank`, `HiddenStates`) is in workers/engine/rank.py. Per prompt it resets
the cache, calls `begin_prompt`, prefills, publishes the first token, calls `prefilled`, then
`decode`, which runs steps until the sequence is done. Every host-path step is the same five moves:

    propose   up to k drafts for the sequence                     (per mode: `propose`)
    score     one forward pass over [last, d_1..d_n]; TP allreduces inside
    decide    on the ranks that decide: drafts kept + new tokens  (per mode: `decide`)
    publish   the VerifyResult to the ranks and the drafter that need it (`Rank.publish`)
    commit    append the new tokens, roll the KV cache back to [.., last, accepted drafts]

The modes, one class each (`strategy_for` picks one per run):
    PlainSteps            k = 0, the baseline: no drafts; greedy decoding on CUDA graphs keeps one
                          step in flight (`StepRunner.greedy_launch`) instead of stepping
    InRankDrafting        a drafter inside every verifier rank (n-gram, EAGLE-3) proposes from the committed
                          tokens each rank holds: no link message per step
    LinkedDrafting        proposals arrive over the draft link from the drafter process
    SimulatedAcceptance   proposals from either source, padded to k, and tau - 1 of them accepted per
                          step on average: engine speed apart from drafter quality

Hidden states (EAGLE-3): `Rank.score` is the one call of the model; `publish` hands the rows of the
kept positions to an in-rank drafter, or in `VerifyResult.hidden` to the drafter process. Under
`engine.overlap` on CUDA graphs an in-rank greedy chain (batch 1, no tree or lookup, the prompt
fitting both caches) takes each prompt whole through the device loop (workers/engine/device_loop.py: verify, acceptance and the next chain enqueued back to back,
no `publish`); where it does not, its drafts still stay on the device (`propose_for_step`): the
verify pass reads them there and `decide` reads them back with its argmaxes, one sync a step.
Trees (`Proposal.parents`, drafter.tree_width): scored in one pass under a tree mask, decided by
`tree_verify`, and the kept path's K/V moved behind the last token (`KVCache.keep_path`) before the
rollback; every rank finds the path once from the result's tokens (`Rank.publish`). Batch 1 only.
A batch of B sequences (workers/engine/batched.py) reuses `decide` per sequence and proposes
through `propose_rows`: `propose` per sequence, or, where the in-rank drafter drafts rows together
(`Drafter.batch_rows`: an EAGLE-3 head's greedy chains), every row in one pass per depth. All
per-sequence state lives in `Sequence` (tokens, done, steps, accepted, margins, its KV cache row,
its row's drafter).
"""

from __future__ import annotations

import time

import torch

from workers.engine.device_loop import AcceptOnDevice, decode_on_device, fits, phase, takes_device_loop
from workers.engine.device_loop import warm as warm_device_loop
from workers.engine.drafter import Drafter
from workers.engine.graphs import to_device
from workers.engine.link import Proposal, VerifyResult
from workers.engine.rank import Rank, Sequence, finish
from workers.engine.verify import tree_verify, verify
from workers.spec.run_stats import RunStats, StepRecord


class StepStrategy:
    """One mode of the decode loop. Subclasses say where drafts come from (`propose`) and how the
    deciding ranks pick the new tokens (`decide`); the step around them is shared."""

    margins = False  # record each token's top-2 logits (PlainSteps under greedy decoding)
    overlapped = False  # PlainSteps: greedy steps with one in flight instead of `step`

    def __init__(self, rank: Rank):
        self.r, self.w, self.k = rank, rank.w, rank.w.num_draft_tokens

    def begin_run(self, capture: bool = True) -> None:
        """Before timing: capture every step width this mode uses (all TP ranks together); a batched
        run (eager passes) captures nothing."""
        if capture:
            tree = 1 + self.r.tree_nodes if self.r.tree_nodes else 0
            self.r.steps.warm(range(1, self.k + 2), greedy=self.overlapped, margins=self.margins, tree=tree)

    def row_drafters(self, n: int, sizes=()) -> list[Drafter | None]:
        """One drafter per row of a batch of at most n rows (None: the mode drafts nothing by
        itself); sizes: the row counts the run's batches will have (what a drafter prepares for)."""
        return [None] * n

    def begin_batch(self, n: int) -> None:
        """A new batch of n rows, before its prompts' `begin_prompt`."""

    def begin_prompt(self, seq: Sequence) -> None:
        """A new prompt, before its prefill (the cache is reset already)."""

    def prefilled(self, seq: Sequence, logits: torch.Tensor) -> None:
        """After the prefill and the first token; `logits` are the prompt's last row."""

    def prefilled_rows(self, seqs: list[Sequence]) -> None:
        """A batch: after every row's prefill and first token (before the first step)."""

    def propose(self, seq: Sequence) -> Proposal:
        raise NotImplementedError

    def propose_for_step(self, seq: Sequence) -> Proposal:
        """The proposal of `step` (batch 1): `propose`, or drafts left on the device where the mode can."""
        return self.propose(seq)

    def propose_rows(self, seqs: list[Sequence]) -> dict[int, Proposal]:
        """A batched step's proposals for its live sequences, by row: `propose` per sequence, or
        every row in one pass where the mode's drafter drafts rows together."""
        return {s.row: self.propose(s) for s in seqs}

    def ahead_keep(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """A batched step's drafts of `rows` [len(rows), k] and the verify pass's argmaxes `targets`
        (greedy) are on the device and not yet read. A mode whose drafter can draft the next step
        behind them (`look_ahead`) returns here, on the device, the drafts each row will keep (the
        step reads them back with its verdict and compares); None: no look-ahead (the default)."""
        return None

    def look_ahead(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, aux: list[torch.Tensor]) -> None:  # noqa: B027
        """Queue the next step's drafting behind the verify pass (`Eagle3Rows.launch_ahead`), each row
        keeping `keep` of its drafts (`ahead_keep`)."""

    def drop_ahead(self) -> None:  # noqa: B027
        """The step's verdicts kept other drafts than `ahead_keep` said: the look-ahead is not used."""

    def decide(self, seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> tuple[int, list[int]]:
        """Drafts kept and the new tokens (kept drafts + one more); deciding ranks only. A tree keeps
        the path `tree_verify` walks (workers/engine/verify.py)."""
        if proposal.parents is not None:
            path, new = tree_verify(proposal.tokens, proposal.parents, logits, self.w.temperature, self.r.gen)
            return len(path), new
        # p: the verifier's probability of draft d_i, q: the drafter's (q = 1 for a deterministic drafter)
        # p >= q: accept d_i; p < q: accept it with probability p / q, else sample norm(max(0, p - q)) and stop
        # all accepted: sample a bonus token from p (greedy: accept while d_i == argmax, then take the argmax)
        return verify(proposal.tokens, proposal.probs, logits, self.w.temperature, self.r.gen)

    def decide_greedy(self, seq: Sequence, proposal: Proposal, targets: list[int]) -> tuple[int, list[int]]:
        """`decide` under greedy decoding from the argmax of each logits row, already on the host (a batch
        reads every row's argmax in one transfer): keep d_i while d_i == targets[i - 1], then targets[n]."""
        draft, n = proposal.tokens, 0
        while n < len(draft) and draft[n] == targets[n]:
            n += 1
        return n, draft[:n] + [targets[n]]

    def decode(self, seq: Sequence, stats: RunStats) -> None:
        while not seq.done:
            stats.steps.append(self.step(seq))
            self.r.progress(seq)

    def step(self, seq: Sequence) -> StepRecord:
        r = self.r
        t0 = time.perf_counter()
        with phase("spectune.propose"):
            proposal = self.propose_for_step(seq)
        t1 = time.perf_counter()
        calls0, comm0 = r.counters.calls, r.counters.seconds
        base = r.cache.lengths[seq.row]
        on_device = proposal.device_tokens is not None
        tree = proposal.parents
        with phase("spectune.verify"):
            logits = r.score(seq, [seq.tokens[-1], *proposal.tokens], proposal.device_tokens, tree)
        mine = None
        if r.decides:
            with phase("spectune.decide"):
                if on_device:  # greedy: the drafts and the verify pass's argmaxes in one transfer
                    k = proposal.device_tokens.shape[0]
                    read = torch.cat([proposal.device_tokens, logits.argmax(-1)]).tolist()
                    proposal.tokens = read[:k]
                    n, new = self.decide_greedy(seq, proposal, read[k:])
                else:
                    n, new = self.decide(seq, proposal, logits)
                new, done = finish(new, seq.n_generated, self.w)
                mine = VerifyResult(accepted=n, tokens=new, done=done)
        t2 = time.perf_counter()
        draft_s, verify_s = proposal.draft_s, t2 - t1
        # device drafts (greedy: every rank decides): the chain's own GPU time, its events done once decide read
        if proposal.gpu_span is not None and r.decides:
            draft_s = proposal.gpu_span[0].elapsed_time(proposal.gpu_span[1]) / 1e3
            verify_s = max(0.0, t2 - t0 - draft_s)
        with phase("spectune.publish"):
            res = r.publish(mine, tree=proposal if tree is not None else None)
        if tree is not None:  # the accepted path's K/V to base + 1, base + 2, ..., as a chain leaves them
            r.cache.keep_path(seq.row, base + 1, [base + 1 + i for i in res.path])
        # keep [last, d_1..d_accepted]; the correction / bonus token is fed next step
        r.cache.rollback(seq.row, base + 1 + res.accepted)
        seq.commit(res)
        seq.steps += 1
        seq.accepted += len(res.tokens) - 1
        return StepRecord(
            drafted=proposal.device_tokens.shape[0] if on_device else len(proposal.tokens),
            accepted=res.accepted,
            emitted=len(res.tokens),
            step_s=time.perf_counter() - t0,
            verify_s=verify_s,
            draft_s=draft_s,
            comm_calls=r.counters.calls - calls0,
            comm_s=r.counters.seconds - comm0,
        )


class PlainSteps(StepStrategy):
    """k = 0: one token per step from row 0 of the logits, no drafts (a drafter process only listens).
    `overlap`: greedy decoding that every rank decides for itself on CUDA graphs enqueues step n + 1
    before it reads step n's token."""

    def __init__(self, rank: Rank, overlap: bool):
        super().__init__(rank)
        greedy = self.w.temperature <= 0
        self.overlapped = overlap and greedy and rank.local and rank.steps.use_graphs
        self.margins = self.w.record_margins and greedy

    def prefilled(self, seq: Sequence, logits: torch.Tensor) -> None:
        if self.margins and self.r.decides:  # left on the device: one host sync per prompt (relative_margins)
            seq.top2 = [logits.float().topk(2).values]

    def propose(self, seq: Sequence) -> Proposal:
        return Proposal(tokens=[])

    def decide(self, seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> tuple[int, list[int]]:
        if seq.top2 is not None:
            seq.top2.append(logits[0].float().topk(2).values)
        return super().decide(seq, proposal, logits)

    def decode(self, seq: Sequence, stats: RunStats) -> None:
        if self.overlapped and not seq.done:
            self._decode_overlapped(seq, stats)
        else:
            super().decode(seq, stats)

    def _decode_overlapped(self, seq: Sequence, stats: RunStats) -> None:
        """Greedy steps with one in flight until EOS or max_new_tokens. Whether to launch the next
        step depends only on the tokens so far, which every rank holds alike, so all ranks replay
        the same steps (their collectives line up), the one past an EOS included."""
        r, w = self.r, self.w
        if seq.top2:
            seq.top2[0] = seq.top2[0].cpu()  # the prefill's, on the device; the steps' arrive on the host
        margins = seq.top2 is not None
        t_prev, calls0, comm0 = time.perf_counter(), r.counters.calls, r.counters.seconds
        slot = r.steps.greedy_launch(seq.tokens[-1], margins)
        per_step = r.counters.calls - calls0  # one replay's allreduces (counted at launch, a step ahead)
        while True:
            # this step's token is the last one max_new_tokens allows: nothing more to launch
            nxt = r.steps.greedy_launch(None, margins) if seq.n_generated + 1 < w.max_new_tokens else None
            token, first, second = r.steps.greedy_result(slot)
            new, done = finish([token], seq.n_generated, w)
            seq.commit(r.publish(VerifyResult(accepted=0, tokens=new, done=done)))  # to the drafter process, if any
            seq.steps += 1
            if margins:
                seq.top2.append(torch.tensor([first, second]))
            now = time.perf_counter()
            stats.steps.append(
                StepRecord(
                    drafted=0,
                    accepted=0,
                    emitted=len(new),
                    step_s=now - t_prev,
                    verify_s=now - t_prev,
                    draft_s=0.0,
                    comm_calls=per_step,
                    comm_s=r.counters.seconds - comm0,
                )
            )
            t_prev, comm0 = now, r.counters.seconds
            r.progress(seq)
            if done:
                if nxt is not None:
                    r.steps.greedy_result(nxt)  # the step past the EOS: finished, thrown away
                return
            slot = nxt


class InRankDrafting(StepStrategy):
    """The drafter runs inside this rank (every rank a copy, fed the same committed tokens). With
    overlap, greedy, on CUDA graphs, a greedy head chain (EAGLE-3) runs each prompt through the
    device loop (workers/engine/device_loop.py); elsewhere a drafter that can leaves its drafts on
    the device for the verify pass (`propose_on_device`)."""

    def __init__(self, rank: Rank, drafter: Drafter, overlap: bool = False):
        super().__init__(rank)
        self.drafter = drafter
        self.on_device = overlap and self.w.temperature <= 0
        self.simulated = False  # SimulatedAcceptance wraps this source: the device loop takes its planned n
        self.loop: AcceptOnDevice | None = None  # the device loop, where this run takes it
        self.rows = None  # a batch's drafter of every row at once (`Drafter.batch_rows`), where it applies

    def begin_run(self, capture: bool = True) -> None:
        super().begin_run(capture)
        self.drafter.begin(self.w.temperature, self.w.seed + 1)
        self.drafter.warm(self.k)
        r = self.r
        # a greedy head chain in this rank, drafting for this rank alone: verify, accept and draft
        # stay on the device (workers/engine/device_loop.py); all ranks take it alike (SPMD)
        self.loop = None
        r.steps.line_up()  # the drafter's warm-up (compiling, capturing) takes each rank its own time
        if capture and self.on_device and takes_device_loop(r, self.drafter, self.k):
            self.loop = AcceptOnDevice.for_steps(r.steps, self.k)
            warm_device_loop(self.loop, self.drafter, self.simulated)  # its verify pass holds the allreduces
            r.steps.line_up()

    def device_loop_for(self, seq: Sequence) -> AcceptOnDevice | None:
        """The device loop, where it takes this prompt whole (its steps fit both caches)."""
        ok = self.loop is not None and seq.drafter is None and fits(self.r.steps, self.drafter, seq, self.k, self.w.max_new_tokens)
        return self.loop if ok else None

    def decode(self, seq: Sequence, stats: RunStats) -> None:
        if (loop := self.device_loop_for(seq)) is not None and not seq.done:
            decode_on_device(self.r, self.drafter, loop, seq, stats)
        else:
            super().decode(seq, stats)

    def row_drafters(self, n: int, sizes=()) -> list[Drafter | None]:
        """Rows drafted together where the drafter can (an EAGLE-3 head's greedy chains: one head
        pass per depth for every row, `Drafter.batch_rows`), prepared for batches of `sizes` rows
        before any timing; else each row its own copy (a drafter keeps per-sequence state, e.g.
        the n-gram index)."""
        self.rows = self.drafter.batch_rows(n, self.k)
        if self.rows is not None:
            self.rows.warm(self.k, set(sizes) or {n})
            self.r.steps.line_up()
            return list(self.rows.rows[:n])
        forks = [self.drafter.fork() for _ in range(n - 1)]
        for i, f in enumerate(forks, 1):  # each its own seed; prepared (e.g. graphs captured) before any timing
            f.begin(self.w.temperature, self.w.seed + 1 + i)
            f.warm(self.k)
        if forks:
            self.r.steps.line_up()
        return [self.drafter, *forks]

    def begin_batch(self, n: int) -> None:
        if self.rows is not None:
            self.rows.begin(n)

    def begin_prompt(self, seq: Sequence) -> None:
        (seq.drafter or self.drafter).prefill(list(seq.tokens))

    def prefilled_rows(self, seqs: list[Sequence]) -> None:
        if self.rows is not None:  # the head's prompt entries, every row in one packed pass: prefill time
            self.rows.feed_prompts({s.row: s.tokens for s in seqs if not s.done}, self.k)

    def propose(self, seq: Sequence) -> Proposal:
        return (seq.drafter or self.drafter).propose(seq.tokens, self.k)

    def propose_rows(self, seqs: list[Sequence]) -> dict[int, Proposal]:
        if self.rows is None:
            return super().propose_rows(seqs)
        return self.rows.propose({s.row: s.tokens for s in seqs}, self.k, on_device=self.on_device)

    def _ahead_rows(self):
        """The batch's drafter of every row where it can draft ahead (drafts on the device), else None."""
        return self.rows if self.rows is not None and self.on_device and hasattr(self.rows, "launch_ahead") else None

    def ahead_keep(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Greedy: each row keeps its drafts while they equal the argmaxes (decide_greedy's rule, on the device)."""
        group = self._ahead_rows()
        return None if group is None else group.greedy_keep(rows, drafts, targets)

    def look_ahead(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, aux: list[torch.Tensor]) -> None:
        if (group := self._ahead_rows()) is not None:
            group.launch_ahead(rows, drafts, targets, keep, aux, self.k)

    def drop_ahead(self) -> None:
        if (group := self._ahead_rows()) is not None:
            group.drop_ahead()

    def propose_for_step(self, seq: Sequence) -> Proposal:
        d = seq.drafter or self.drafter
        return d.propose_on_device(seq.tokens, self.k) if self.on_device else d.propose(seq.tokens, self.k)


class LinkedDrafting(StepStrategy):
    """Proposals arrive over the draft link; the drafter process runs `run_drafter`."""

    def propose(self, seq: Sequence) -> Proposal:
        return self.r.link.recv_proposal()


class SimulatedAcceptance(StepStrategy):
    """Every step verifies k + 1 tokens (short proposals padded) and keeps tau - 1 drafts on average, or
    with a profile sum_{i<=chain} P_i of its chain (Workload.simulated_drafts); error diffusion over the
    run keeps the running mean exact. The tokens are meaningless, the timing is real."""

    def __init__(self, rank: Rank, source: StepStrategy):
        super().__init__(rank)
        self.source, self.credit = source, 0.0
        self.expected = rank.w.simulated_drafts  # chain -> drafts kept on average
        source.simulated = True

    def decode(self, seq: Sequence, stats: RunStats) -> None:
        """Through the device loop where the source takes it: each step's n planned here, from the
        same credit, and taken on the device instead of the drafts' verdict."""
        loop = self.source.device_loop_for(seq) if isinstance(self.source, InRankDrafting) and not seq.done else None
        if loop is None:
            return super().decode(seq, stats)
        plan, credits = [], []
        for _ in range(self.w.max_new_tokens):  # a step commits at least one token
            plan.append(self._take(self.k))
            credits.append(self.credit)
        ran = decode_on_device(self.r, self.source.drafter, loop, seq, stats, plan)
        self.credit = credits[ran - 1]  # the steps the prompt took

    def begin_run(self, capture: bool = True) -> None:
        self.source.begin_run(capture)

    def row_drafters(self, n: int, sizes=()) -> list[Drafter | None]:
        return self.source.row_drafters(n, sizes)

    def begin_batch(self, n: int) -> None:
        self.source.begin_batch(n)

    def begin_prompt(self, seq: Sequence) -> None:
        self.source.begin_prompt(seq)

    def prefilled_rows(self, seqs: list[Sequence]) -> None:
        self.source.prefilled_rows(seqs)

    def propose(self, seq: Sequence) -> Proposal:
        return self._pad(seq, self.source.propose(seq))

    def ahead_keep(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The drafts each row will keep, planned from the credit as `decide` takes it (rows in order)."""
        group = self.source._ahead_rows() if isinstance(self.source, InRankDrafting) else None
        if group is None:
            return None
        credit, plan = self.credit, []
        for _ in rows:
            credit += self.expected(drafts.shape[1])
            plan.append(min(drafts.shape[1], int(credit)))
            credit -= plan[-1]
        return to_device(plan, drafts.device)

    def look_ahead(self, rows: list[int], drafts: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, aux: list[torch.Tensor]) -> None:
        self.source.look_ahead(rows, drafts, targets, keep, aux)

    def drop_ahead(self) -> None:
        self.source.drop_ahead()

    def propose_rows(self, seqs: list[Sequence]) -> dict[int, Proposal]:
        got = self.source.propose_rows(seqs)
        return {s.row: p if (p := got[s.row]).device_tokens is not None else self._pad(s, p) for s in seqs}  # device rows: k drafts

    def propose_for_step(self, seq: Sequence) -> Proposal:
        p = self.source.propose_for_step(seq)
        return p if p.device_tokens is not None else self._pad(seq, p)  # a device chain is k drafts long

    def _pad(self, seq: Sequence, p: Proposal) -> Proposal:
        if p.parents is not None:  # a tree lists its k-chain first: the accepted drafts are that chain's
            return p
        pad = [p.tokens[-1] if p.tokens else seq.tokens[-1]] * (self.k - len(p.tokens))
        return Proposal(tokens=p.tokens + pad, probs=p.probs, draft_s=p.draft_s)

    def _accepted(self, proposal: Proposal) -> int:
        """Drafts accepted this step: tau - 1 on average, carried as credit between steps."""
        chain = len(proposal.tokens)
        if proposal.parents is not None:  # a tree: its leading chain (parents -1, 0, 1, ...)
            chain = next((i for i, p in enumerate(proposal.parents) if p != i - 1), chain)
        return self._take(chain)

    def _take(self, chain: int) -> int:
        """This step's share of the credit, at most the `chain` drafts it can keep."""
        self.credit += self.expected(chain)
        n = min(chain, int(self.credit))
        self.credit -= n
        return n

    def decide(self, seq: Sequence, proposal: Proposal, logits: torch.Tensor) -> tuple[int, list[int]]:
        n = self._accepted(proposal)
        return n, proposal.tokens[:n] + [int(logits[n].argmax())]

    def decide_greedy(self, seq: Sequence, proposal: Proposal, targets: list[int]) -> tuple[int, list[int]]:
        n = self._accepted(proposal)
        return n, proposal.tokens[:n] + [targets[n]]


def strategy_for(rank: Rank, drafter: Drafter | None, overlap: bool) -> StepStrategy:
    """The run's mode: plain at k = 0; else drafts from the in-rank drafter or over the link, accepted by
    the verification rules or, with `simulate_accept_len` or `simulate_accept_profile`, at the imposed rate."""
    w = rank.w
    if w.num_draft_tokens == 0:
        return PlainSteps(rank, overlap)
    source = InRankDrafting(rank, drafter, overlap) if drafter is not None else LinkedDrafting(rank)
    return SimulatedAcceptance(rank, source) if w.simulated else source
