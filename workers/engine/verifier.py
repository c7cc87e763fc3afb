"""The SPMD decode loops that run inside the gang: verifier ranks (`Verifier.run`) and the drafter
process (`run_drafter`).

Per prompt: every process resets its state; the verifier prefills the prompt and rank 0 picks
the first token; then each step
    drafter:   propose up to k tokens from the committed sequence  -> broadcast Proposal
    verifiers: score [last, d_1..d_n] in one pass (TP allreduces inside), rank 0 verifies
               -> broadcast VerifyResult (accepted count + new tokens, done flag)
    everyone:  append the new tokens, roll the KV cache back to the accepted prefix.
The driver is not involved per step: one call runs a whole Workload. `Verifier.run` is one prompt
loop; what a step does in each mode (plain, in-rank drafter, linked drafter, simulated acceptance)
is a step strategy in workers/engine/strategies.py, which also says where a hidden-state drafter
and a batch dimension plug in.
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

    verifier = Verifier(model, allreduce, link, rank, drafter=NgramDrafter())   # one per TP rank
    result = verifier.run(workload)             # rank 0: RunResult; other ranks: None
    run_drafter(drafter, link, workload)        # the drafter process, alongside
"""

from __future__ import annotations

import time

import torch

from workers.comm import AllReduce
from workers.engine.batched import BatchSteps, decode_batches, run_drafter_batched, why_not_batched
from workers.engine.drafter import Drafter
from workers.engine.experts import count_experts
from workers.engine.link import DraftLink
from workers.engine.rank import HiddenStates, ProgressHook, Rank, Sequence
from workers.engine.steps import StepRunner
from workers.engine.strategies import strategy_for
from workers.model.transformer import Transformer
from workers.spec import PromptResult, RunResult, Workload, tree_size
from workers.spec.engine_config import EngineConfig
from workers.spec.run_stats import RunStats, relative_margins


def decides_locally(w: Workload, has_drafter: bool) -> bool:
    """Every verifier rank can verify by itself: nothing it needs lives on rank 0 alone."""
    return not has_drafter or w.temperature <= 0 or w.simulated


class Verifier:
    def __init__(
        self,
        model: Transformer,
        allreduce: AllReduce,
        link: DraftLink,
        rank: int,
        engine: EngineConfig | None = None,
        drafter: Drafter | None = None,
        tree_width: int = 0,
    ):
        self.model, self.allreduce, self.link, self.rank = model, allreduce, link, rank
        # drafter.tree_width (at most the head's draft vocabulary): >= 2, the drafter proposes trees (their width is warmed)
        self.tree_width = tree_width
        self.drafter = drafter  # a drafter run inside this rank (n-gram), else proposals come over the link
        self.device = model.embed_tokens.weight.device
        self.cache = model.new_cache(1)
        self.steps = StepRunner(model, self.cache, link.k + 1, engine=engine, allreduce=allreduce)
        self._batch_steps: BatchSteps | None = None  # Workload.batch_size > 1 (workers/engine/batched.py)
        self.on_progress: ProgressHook | None = None  # set per run by the worker (rank 0), see ProgressHook

    def comm_split(self, width: int, iters: int, tree: bool = False) -> dict[str, float]:
        """Step time of `width` tokens (tree: a tree step) with the allreduce and with it replaced by a no-op:
        medians of `iters` steps each, the two kinds alternating step by step, so that whatever else the
        machine runs meanwhile slows both alike (two blocks in a row once read the comm as 0 on a loaded CPU)."""
        times: dict[bool, list[float]] = {True: [], False: []}
        try:
            for i in range(iters + 2):  # the first two rounds warm both (untimed)
                for enabled in (True, False):
                    self.allreduce.enabled = enabled
                    took = self.steps.step_times(width, 1, tree, warm=0)
                    if i >= 2:
                        times[enabled] += took
        finally:
            self.allreduce.enabled = True
        with_comm, without = (sorted(t)[len(t) // 2] for t in (times[True], times[False]))
        return {
            "ablation_step_ms": with_comm * 1e3,
            "compute_ms_per_step": without * 1e3,
            "comm_ms_per_step": max(0.0, with_comm - without) * 1e3,
        }

    def _tree_nodes(self, w: Workload) -> int:
        """The drafts of a tree step (workers/spec.py `tree_size`); 0 where this
        run drafts chains (a tree with no room for a sibling is a chain)."""
        k = w.num_draft_tokens
        if self.tree_width < 2 or not k:
            return 0
        n = tree_size(k, self.tree_width)
        return 0 if n == k else n

    def _hidden_states(self, w: Workload) -> HiddenStates | None:
        """Where a drafter reads the verifier's hidden states (EAGLE-3) and this run drafts: who gets them."""
        if not self.model.aux_layers or w.num_draft_tokens <= 0:
            return None
        reader = self.drafter if self.drafter is not None and self.drafter.reads_hidden else None
        return HiddenStates(self.model, to_link=self.link.drafter_rank is not None, drafter=reader)

    def _check_agreement(self, tokens: list[int]) -> None:
        """Ranks that decided for themselves must have produced the same tokens (an emulated rank,
        with no process group, has no peers to agree with)."""
        if self.allreduce.world_size == 1 or self.allreduce.group is None:
            return
        import torch.distributed as dist

        mine = sum((i + 1) * t for i, t in enumerate(tokens)) % (1 << 31)
        total = torch.tensor([mine, len(tokens)], dtype=torch.int64, device=self.device)
        dist.all_reduce(total, group=self.allreduce.group)
        world = self.allreduce.world_size
        if int(total[0]) != world * mine or int(total[1]) != world * len(tokens):
            raise RuntimeError(
                f"verifier rank {self.rank}: the TP ranks decided different tokens for a prompt "
                "(their logits differ, so the allreduce did not hand every rank the same sums)"
            )

    @torch.inference_mode()
    def run(self, w: Workload) -> RunResult | None:
        rank = Rank(
            steps=self.steps,
            cache=self.cache,
            link=self.link,
            counters=self.allreduce.counters,
            w=w,
            index=self.rank,
            local=decides_locally(w, self.link.drafter_rank is not None),
            on_progress=self.on_progress,
            hidden=self._hidden_states(w),
            tree_nodes=self._tree_nodes(w),
        )
        strategy = strategy_for(rank, self.drafter, overlap=self.steps.engine.overlap)  # fixed for the run: every rank picks it alike
        if w.batch_size != 1:
            return self._run_batched(w, rank, strategy)
        strategy.begin_run()
        self.link.wait_for_drafter()  # its warm-up stays out of the timed prompts
        stats, prompts = RunStats(), []
        for prompt in w.prompts:
            t_prompt = time.perf_counter()
            self.cache.reset()
            seq = Sequence.of(prompt)
            strategy.begin_prompt(seq)
            logits = self.steps.prefill(list(prompt))
            seq.commit(rank.publish(rank.first_token(logits) if rank.decides else None, rows=len(prompt)))
            prefill_s = time.perf_counter() - t_prompt
            strategy.prefilled(seq, logits)
            strategy.decode(seq, stats)
            seconds = time.perf_counter() - t_prompt
            out = seq.generated
            if rank.local:
                self._check_agreement(out)
            stats.tokens += len(out)
            stats.seconds += seconds
            prompts.append(
                PromptResult(
                    tokens=out,
                    seconds=seconds,
                    steps=seq.steps,
                    accepted=seq.accepted,
                    prefill_s=prefill_s,
                    margins=relative_margins(seq.top2 or []),
                )
            )
        return self._finish(w, prompts, stats)

    def _run_batched(self, w: Workload, rank: Rank, strategy) -> RunResult | None:
        """B sequences per pass (workers/engine/batched.py) on a B-row cache of this run's own."""
        over_link = rank.hidden is not None and rank.hidden.to_link
        if why := why_not_batched(w, self.link.drafter_rank is not None, over_link, tree=self.tree_width >= 2):
            raise ValueError(why)
        passes = self._batch_steps
        if passes is None or len(passes.full.lengths) < w.batch_size:  # one cache (and its graphs) for every batch size
            cache = self.model.new_cache(w.batch_size, self.cache.max_seq)
            passes = self._batch_steps = BatchSteps(self.model, cache, self.steps.use_graphs, self.allreduce, self.steps.fast)
        rank.cache = passes.full
        strategy.begin_run(capture=False)
        self.link.wait_for_drafter()
        check = self._check_agreement if rank.local else None
        prompts, stats = decode_batches(rank, strategy, self.model, w, passes, check)
        return self._finish(w, prompts, stats)

    def _finish(self, w: Workload, prompts: list[PromptResult], stats: RunStats) -> RunResult | None:
        k = w.num_draft_tokens
        # the comm/compute split times the batch-1 step: a batched run leaves it out rather than mislabel it
        ablate = w.comm_ablation_iters and self.allreduce.world_size > 1 and w.batch_size == 1
        tree = self._tree_nodes(w)  # a tree trial's step is the tree's width, through the tree step
        split = self.comm_split(1 + (tree or k), w.comm_ablation_iters, tree=bool(tree)) if ablate else {}
        profile = {}
        if w.profile_widths and w.profile_iters > 0 and w.batch_size == 1:  # every rank times the same passes
            profile = {W: 1e3 * self.steps.time_step(W, w.profile_iters) for W in w.profile_widths}
        if (check := getattr(self.allreduce, "raise_if_timed_out", None)) is not None:
            check()
        experts = {}
        # every rank runs the census forward (its allreduces are collective), rank 0 keeps the counts; an emulated
        # rank exchanges no partial sums, so its routing is not the model's: no census there
        if w.count_experts and w.batch_size == 1 and self.allreduce.name != "emulated":
            sequences = [list(p) + r.tokens for p, r in zip(w.prompts, prompts)]
            experts = count_experts(
                self.model, sequences, [len(p) for p in w.prompts], self.cache
            )  # a rank that fell behind during the timed steps left wrong sums: this rank raises, the trial fails
        if self.rank != 0:
            return None
        return RunResult(prompts=prompts, stats=stats, num_draft_tokens=k, ablation=split, width_ms=profile, experts=experts)


def run_drafter(drafter: Drafter, link: DraftLink, w: Workload) -> None:
    """The drafter's side of `Verifier.run` (same prompts, same message order)."""
    if w.batch_size > 1:
        # the verifier ranks refuse the run alike, with the reason (an eagle3 head here reads states over the link)
        if why_not_batched(w, True, drafter.reads_hidden and w.num_draft_tokens > 0):
            return
        return run_drafter_batched(drafter, link, w)
    drafter.begin(w.temperature, w.seed + 1)
    drafter.warm(w.num_draft_tokens)
    link.drafter_ready()
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
