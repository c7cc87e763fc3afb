"""The SPMD decode loops that run inside the gang: verifier ranks and the drafter.

Per prompt: every process resets its state; the verifier prefills the prompt and rank 0 picks
the first token; then each step
    drafter:   propose up to k tokens from the committed sequence  -> broadcast Proposal
    verifiers: score [last, d_1..d_n] in one pass (TP allreduces inside), rank 0 verifies
               -> broadcast VerifyResult (accepted count + new tokens, done flag)
    everyone:  append the new tokens, roll the KV cache back to the accepted prefix.
The driver is not involved per step: one call runs a whole Workload.
With k = 0 the verifier decodes plainly (the baseline) and a drafter in the gang only listens.
The n-gram drafter is no process of its own: every verifier rank runs a copy on the committed
tokens it already holds (`Verifier.drafter`), so those steps exchange no link messages.
Hidden states (EAGLE-3): where the model captures aux layers (`model.aux_layers`) and k > 0, the
states of every newly committed position (the prompt's after the prefill, [last, d_1..d_a] after
a step) go with the VerifyResult to the drafter process (rank 0 sends them once), or straight to
the drafter inside this rank (`Drafter.observe`).

Every verifier rank holds the same full logits (the allreduce hands every rank the same sums, the
head is replicated or gathered) and the same seeded generator. So where verification needs nothing
only rank 0 has (greedy, simulated acceptance, or no drafter at all; stochastic verification needs
the drafter's probabilities, which go to rank 0 alone), every rank verifies for itself: the
per-step result broadcast (a gloo round trip on the CPU link) becomes one message from rank 0 to
the drafter, or nothing without a drafter. `decides_locally` is the rule both sides apply. A
checksum of each prompt's tokens across the TP group turns any disagreement into a clear error
instead of a hang.
"""
from __future__ import annotations

import time

import torch

from workers.comm import AllReduce
from workers.drafters import Drafter
from workers.engine.link import DraftLink, Proposal, VerifyResult
from workers.model.transformer import Transformer
from workers.engine.steps import StepRunner
from workers.spec import PromptResult, RunResult, Workload
from workers.engine.stats import RunStats, StepRecord
from workers.engine.verify import probs, sample, verify


def relative_margins(top2: list[torch.Tensor]) -> list[float]:
    """Per token (top-1 - top-2 logit) / max(|top-1|, 1): how far each greedy choice was from a tie.
    `top2` are the steps' `topk(2).values`, left on the device until now (one host sync per prompt)."""
    if not top2:
        return []
    return [(a - b) / max(abs(a), 1.0) for a, b in torch.stack(top2).tolist()]


def decides_locally(w: Workload, has_drafter: bool) -> bool:
    """Every verifier rank can verify by itself: nothing it needs lives on rank 0 alone."""
    return not has_drafter or w.temperature <= 0 or w.simulate_accept_len is not None


def _finish(tokens: list[int], have: int, w: Workload) -> tuple[list[int], bool]:
    """Cut new `tokens` at the first EOS or at max_new_tokens (given `have` already generated)."""
    room = w.max_new_tokens - have
    tokens = tokens[:room]
    for i, t in enumerate(tokens):
        if t in w.eos_ids:
            return tokens[: i + 1], True
    return tokens, have + len(tokens) >= w.max_new_tokens


class Verifier:
    def __init__(self, model: Transformer, allreduce: AllReduce, link: DraftLink, rank: int, graphs: bool = True, fused: bool = False,
                 attention: str = "auto", drafter: Drafter | None = None):
        self.model, self.allreduce, self.link, self.rank = model, allreduce, link, rank
        self.drafter = drafter  # a drafter run inside this rank (n-gram), else proposals come over the link
        self.device = model.embed_tokens.weight.device
        self.cache = model.new_cache(1)
        self.steps = StepRunner(model, self.cache, link.k + 1, graphs=graphs, allreduce=allreduce, fused=fused, attention=attention)
        self.local = False  # set per run: decides_locally (every rank verifies itself)
        self.hidden_on = False  # set per run: hidden states go to the drafter (see _hidden)

    def _simulated(self, drafted: list[int], w: Workload, logits: torch.Tensor, credit: float) -> tuple[int, list[int], float]:
        """Accept tau - 1 drafts per step on average (error diffusion keeps the running mean exact)."""
        credit += w.simulate_accept_len - 1
        n = min(len(drafted), int(credit))
        credit -= n
        return n, drafted[:n] + [int(logits[n].argmax())], credit

    def comm_split(self, width: int, iters: int) -> dict[str, float]:
        """Step time of `width` tokens with the allreduce and with it replaced by a no-op."""
        with_comm = self.steps.time_step(width, iters)
        self.allreduce.enabled = False
        try:
            without = self.steps.time_step(width, iters)
        finally:
            self.allreduce.enabled = True
        return {"ablation_step_ms": with_comm * 1e3, "compute_ms_per_step": without * 1e3,
                "comm_ms_per_step": max(0.0, with_comm - without) * 1e3}

    def _overlapped(self, w: Workload) -> bool:
        """Plain greedy decoding that every rank decides for itself, on CUDA graphs: step n + 1 is
        enqueued before step n's token is read (StepRunner.greedy_launch)."""
        return (w.overlap_steps and w.num_draft_tokens == 0 and w.temperature <= 0 and self.local
                and self.steps.use_graphs)

    def _greedy_overlapped(self, out: list[int], w: Workload, stats: RunStats, top2: list | None) -> int:
        """Decode greedily after `out` (the first token) until EOS or max_new_tokens, keeping one
        step in flight; appends to `out`, `stats` and `top2`; returns the steps. Whether to launch
        the next step depends only on the tokens so far, which every rank holds alike, so all
        ranks replay the same steps (their collectives line up), the one past an EOS included."""
        counters = self.allreduce.counters
        if top2:
            top2[0] = top2[0].cpu()  # the prefill's, on the device; the steps' arrive on the host
        steps, t_prev = 0, time.perf_counter()
        calls0, comm0 = counters.calls, counters.seconds
        margins = top2 is not None
        slot = self.steps.greedy_launch(out[-1], margins)
        per_step = counters.calls - calls0  # one replay's allreduces (counted at launch, a step ahead)
        while True:
            # this step's token is the last one max_new_tokens allows: nothing more to launch
            nxt = self.steps.greedy_launch(None, margins) if len(out) + 1 < w.max_new_tokens else None
            token, first, second = self.steps.greedy_result(slot)
            new, done = _finish([token], len(out), w)
            self._broadcast(VerifyResult(accepted=0, tokens=new, done=done))  # to the drafter process, if any
            if top2 is not None:
                top2.append(torch.tensor([first, second]))
            out.extend(new)
            steps += 1
            now = time.perf_counter()
            stats.steps.append(StepRecord(drafted=0, accepted=0, emitted=len(new), step_s=now - t_prev, verify_s=now - t_prev,
                                          draft_s=0.0, comm_calls=per_step, comm_s=counters.seconds - comm0))
            t_prev, comm0 = now, counters.seconds
            if done:
                if nxt is not None:
                    self.steps.greedy_result(nxt)  # the step past the EOS: finished, thrown away
                return steps
            slot = nxt

    # ---- hidden states for drafters that read them (EAGLE-3): one separable piece
    def _wants_hidden(self, w: Workload) -> bool:
        return bool(self.model.aux_layers) and w.num_draft_tokens > 0

    def _hidden(self, rows: int) -> torch.Tensor:
        """The captured aux states of the last pass's first `rows` positions, [rows, n_aux x dim]."""
        return torch.cat(self.model.aux, dim=-1)[0, :rows]

    def _attach_hidden(self, result: VerifyResult | None, rows: int) -> None:
        """Before the result goes out: the drafter process gets the states with it."""
        if self.hidden_on and result is not None and self.link.drafter_rank is not None:
            result.hidden = self._hidden(rows)

    def _observe_hidden(self, rows: int) -> None:
        """After the result is known: a drafter inside this rank reads the states directly."""
        if self.hidden_on and self.drafter is not None and self.drafter.reads_hidden:
            self.drafter.observe(self._hidden(rows))

    def _first_token(self, logits: torch.Tensor, w: Workload, gen) -> VerifyResult:
        tok = int(logits.argmax()) if w.temperature <= 0 else sample(probs(logits, w.temperature), gen)
        tokens, done = _finish([tok], 0, w)
        return VerifyResult(accepted=0, tokens=tokens, done=done)

    def _decides(self) -> bool:
        return self.rank == 0 or self.local

    def _broadcast(self, result: VerifyResult | None) -> VerifyResult:
        if self.local:
            if self.rank == 0 and self.link.drafter_rank is not None:
                self.link.send_result_to_drafter(result)
            return result
        if self.rank == 0:
            self.link.send_result(result)
            return result
        return self.link.recv_result()

    def _check_agreement(self, tokens: list[int]) -> None:
        """Ranks that decided for themselves must have produced the same tokens."""
        if self.allreduce.world_size == 1:
            return
        import torch.distributed as dist

        mine = sum((i + 1) * t for i, t in enumerate(tokens)) % (1 << 31)
        total = torch.tensor([mine, len(tokens)], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, group=self.allreduce.group)
        world = self.allreduce.world_size
        if int(total[0]) != world * mine or int(total[1]) != world * len(tokens):
            raise RuntimeError(f"verifier rank {self.rank}: the TP ranks decided different tokens for a prompt "
                               "(their logits differ, so the allreduce did not hand every rank the same sums)")

    @torch.inference_mode()
    def run(self, w: Workload) -> RunResult | None:
        gen = torch.Generator().manual_seed(w.seed)
        stats, prompts = RunStats(), []
        counters = self.allreduce.counters
        credit = 0.0
        self.local = decides_locally(w, self.link.drafter_rank is not None)
        overlapped = self._overlapped(w)  # fixed for the run: every rank decides it alike
        self.hidden_on = self._wants_hidden(w)
        margins = w.record_margins and w.num_draft_tokens == 0 and w.temperature <= 0
        # every width this run can use, before timing
        self.steps.warm(range(1, w.num_draft_tokens + 2), greedy=overlapped, margins=margins)
        if self.drafter is not None:
            self.drafter.begin(w.temperature, w.seed + 1)
            self.drafter.warm(w.num_draft_tokens)
        for prompt in w.prompts:
            t_prompt = time.perf_counter()
            self.cache.reset()
            if self.drafter is not None:
                self.drafter.prefill(list(prompt))
            logits = self.steps.prefill(list(prompt))
            first = self._first_token(logits, w, gen) if self._decides() else None
            self._attach_hidden(first, len(prompt))
            res = self._broadcast(first)
            self._observe_hidden(len(prompt))
            prefill_s = time.perf_counter() - t_prompt
            record = margins and self._decides()
            top2 = [logits.float().topk(2).values] if record else []
            out, steps, accepted = list(res.tokens), 0, 0
            committed = list(prompt) + out  # what the in-rank drafter sees (the drafter process keeps its own)
            if overlapped and not res.done:
                steps = self._greedy_overlapped(out, w, stats, top2 if record else None)
            while not res.done and not overlapped:
                t0 = time.perf_counter()
                if w.num_draft_tokens == 0:
                    proposal = Proposal(tokens=[])
                elif self.drafter is not None:
                    proposal = self.drafter.propose(committed, w.num_draft_tokens)
                else:
                    proposal = self.link.recv_proposal()
                drafted = proposal.tokens
                if w.simulate_accept_len is not None:  # fixed step width: pad a short proposal
                    drafted = drafted + [drafted[-1] if drafted else out[-1]] * (w.num_draft_tokens - len(drafted))
                t1 = time.perf_counter()
                calls0, comm0 = counters.calls, counters.seconds
                base = self.cache.lengths[0]
                logits = self.steps.step([out[-1], *drafted])
                mine = None
                if self._decides():
                    if w.simulate_accept_len is not None:
                        n, new, credit = self._simulated(drafted, w, logits, credit)
                    else:
                        n, new = verify(drafted, proposal.probs, logits, w.temperature, gen)
                    new, done = _finish(new, len(out), w)
                    mine = VerifyResult(accepted=n, tokens=new, done=done)
                    if record:  # k = 0: one token per step, from row 0 (no sync: read at the prompt's end)
                        top2.append(logits[0].float().topk(2).values)
                self._attach_hidden(mine, 1 + mine.accepted if mine is not None else 0)
                t2 = time.perf_counter()
                res = self._broadcast(mine)
                self._observe_hidden(1 + res.accepted)
                # keep [last, d_1..d_accepted]; the correction/bonus token is fed next step
                self.cache.rollback(0, base + 1 + res.accepted)
                out.extend(res.tokens)
                committed.extend(res.tokens)
                steps += 1
                accepted += len(res.tokens) - 1
                stats.steps.append(
                    StepRecord(
                        drafted=len(drafted), accepted=res.accepted, emitted=len(res.tokens), step_s=time.perf_counter() - t0,
                        verify_s=t2 - t1, draft_s=proposal.draft_s,
                        comm_calls=counters.calls - calls0, comm_s=counters.seconds - comm0,
                    )
                )
            seconds = time.perf_counter() - t_prompt
            if self.local:
                self._check_agreement(out)
            stats.tokens += len(out)
            stats.seconds += seconds
            prompts.append(PromptResult(tokens=out, seconds=seconds, steps=steps, accepted=accepted, prefill_s=prefill_s,
                                        margins=relative_margins(top2)))
        split = self.comm_split(w.num_draft_tokens + 1, w.comm_ablation_iters) if w.comm_ablation_iters and self.allreduce.world_size > 1 else {}
        if self.rank != 0:
            return None
        return RunResult(prompts=prompts, stats=stats, num_draft_tokens=w.num_draft_tokens, ablation=split)


def run_drafter(drafter: Drafter, link: DraftLink, w: Workload) -> None:
    """The drafter's side of `Verifier.run` (same prompts, same message order)."""
    drafter.begin(w.temperature, w.seed + 1)
    drafter.warm(w.num_draft_tokens)
    recv_result = link.recv_result_from_verifier if decides_locally(w, True) else link.recv_result
    with torch.inference_mode():
        for prompt in w.prompts:
            drafter.prefill(list(prompt))
            committed = list(prompt)
            res = recv_result()
            committed.extend(res.tokens)
            while not res.done:
                if res.hidden is not None:
                    drafter.observe(res.hidden)
                if w.num_draft_tokens > 0:
                    link.send_proposal(drafter.propose(committed, w.num_draft_tokens))
                res = recv_result()
                committed.extend(res.tokens)
