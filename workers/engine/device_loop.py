"""Speculative steps that stay on the device: verify, greedy acceptance and the next draft chain
enqueued back to back, with the host reading each step's result while the chain runs.

The host path of a step (workers/engine/strategies.py `StepStrategy.step`) reads the verify pass's
argmaxes, decides on the host, hands the kept rows' hidden states to the drafter and stages its
next feed: the GPU idles for that round trip (docs/eagle3.md, "GPU check"). Here,
for an in-rank greedy chain drafter (EAGLE-3, `Eagle3Drafter.draft_fed`) under engine.overlap:

    verify + accept   one graph (`AcceptOnDevice`): the pass over [last, d_1..d_k] at the positions
                      in the step's static input, the argmaxes a_0..a_k, n = the leading drafts equal
                      to them (d_i == a_{i-1}), or under simulated acceptance the step's planned n;
                      it writes the chain's feed and the next pass's last token a_n and positions
    result            [n, d_1..d_k, a_0..a_k] to pinned memory behind an event
    chain             the drafter's graph: fc over the pass's static aux rows, the k + 1 entries fed
                      at their positions (x_{j+1} = d_{j+1} for j < n, a_n at j = n), k drafts from
                      entry n, written into the next pass's input
    host              waits for the event only: commits d_1..d_n, a_n, checks EOS and the token
                      budget, records the step, and enqueues the next verify pass behind the chain

The feed is always k + 1 wide: the entries past n hold rejected tokens, at positions the chain's
drafts overwrite before any query reads them (a query reads only slots up to its position), so no
shape depends on n. The first step of a prompt drafts through the host-staged chain (the prompt's
states); the loop runs the prompt to its end. On CPU the same bodies run eagerly (the tests).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.autograd.profiler as autograd_profiler
from torch.profiler import record_function

from workers.engine.link import VerifyResult
from workers.engine.rank import Sequence, finish
from workers.engine.steps import AcceptGraph, StepRunner
from workers.spec.run_stats import RunStats, StepRecord


@dataclass
class DeviceFeed:
    """What a step's acceptance leaves on the device for the drafter's chain (static buffers)."""

    tokens: torch.Tensor  # [T] x_{j+1} of the pass's entries: kept drafts, then a_n at j = n (junk after)
    positions: torch.Tensor  # [1, T] the pass's positions
    at: torch.Tensor  # [1] n: the last entry the verifier kept
    drafts: torch.Tensor  # [T - 1] where the chain writes its drafts: the next pass's input
    aux: list[torch.Tensor] = field(default_factory=list)  # the pass's aux states, [1, T, dim] each


class AcceptOnDevice:
    """Verify + greedy acceptance as one graph on a StepRunner's static input (width k + 1). Its
    graphs (and the chain's) are bound to its buffers: one per runner and k (`for_steps`)."""

    @classmethod
    def for_steps(cls, steps: StepRunner, k: int) -> AcceptOnDevice:
        if k not in steps.device_loops:
            steps.device_loops[k] = cls(steps, k, steps.cache.max_seq)  # a step commits >= 1 token: at most max_seq steps
        return steps.device_loops[k]

    def __init__(self, steps: StepRunner, k: int, max_steps: int):
        self.steps, self.k, self.T = steps, k, k + 1
        dev = steps.device
        T = self.T
        self.feed = DeviceFeed(
            tokens=torch.zeros(T, dtype=torch.long, device=dev),
            positions=torch.zeros(1, T, dtype=torch.long, device=dev),
            at=torch.zeros(1, dtype=torch.long, device=dev),
            drafts=steps._inputs[0, 1:T],
        )
        # simulated acceptance: each step's n, planned on the host per prompt, and the step counter
        self.plan = torch.zeros(max_steps, dtype=torch.long, device=dev)
        self.step_no = torch.zeros(1, dtype=torch.long, device=dev)
        pin = dev.type == "cuda"
        self._result = torch.zeros(2 * T, dtype=torch.long)
        self._result = self._result.pin_memory() if pin else self._result
        self._done = torch.cuda.Event() if pin else None
        # CUDA events around each chain, two pairs in turn: a chain's pair is read the step after
        self.spans = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(2)] if pin else []

    def _body(self, simulated: bool) -> torch.Tensor:
        """Device ops only (graph-safe)."""
        inputs, T = self.steps._inputs, self.T
        logits = self.steps._run_static(T)[0]
        am = logits.argmax(-1)  # the same tie-break as the host's decide
        drafts, pos = inputs[0, 1:T], inputs[1, :T]
        if simulated:
            n = self.plan.index_select(0, self.step_no)
            self.step_no.add_(1)
        else:  # greedy verification: keep d_i while d_i == a_{i-1}
            n = (drafts == am[:-1]).long().cumprod(0).sum().view(1)
        j = torch.arange(T, device=am.device)
        # x_{j+1} of entry j: d_{j+1} for a kept draft, a_n after the last kept one (a_j past it: junk)
        self.feed.tokens.copy_(torch.where(j < n, torch.cat([drafts, am[-1:]]), am))
        self.feed.positions.copy_(pos[None])
        self.feed.at.copy_(n)
        result = torch.cat([n, drafts, am])
        inputs[0, :1].copy_(am.index_select(0, n))  # the next pass: [a_n, the chain's drafts] after the kept ones
        inputs[1, :T].add_(n + 1)
        return result

    def stage(self, last: int, drafts: torch.Tensor, start: int) -> None:
        """The first step of a prompt: [last] and the host-staged chain's device drafts at start.."""
        self.steps._stage([last], start, self.T)
        self.steps._inputs[0, 1 : self.T].copy_(drafts)

    def launch(self, simulated: bool) -> None:
        """Enqueue verify + accept (advances the step's input on the device) and the result's copy."""
        steps = self.steps
        start = steps.cache.lengths[0]
        if start + self.T > steps.cache.max_seq:
            raise ValueError(f"sequence length {start + self.T} exceeds the cache ({steps.cache.max_seq})")
        key = AcceptGraph(id(self), steps._comm_on(), simulated)  # bound to this loop's buffers
        out = steps.replay(key, lambda: self._body(simulated), restore=(self.step_no,))
        steps.cache.lengths[0] = start + self.T  # as a step leaves it: the caller rolls back to the kept entries
        self.feed.aux = steps.model.aux  # the graph's static aux rows (CPU: this pass's)
        self._result.copy_(out, non_blocking=self._done is not None)
        if self._done is not None:
            self._done.record()

    def read(self) -> tuple[int, list[int], list[int]]:
        """(n, drafts, argmaxes) of the last launch; waits for its copy only."""
        if self._done is not None:
            self._done.synchronize()
        r = self._result.tolist()
        return r[0], r[1 : self.T], r[self.T :]


def phase(name: str):
    """A step's labelled range in a profiler's trace (scripts/trace_decode.py); else nothing."""
    return record_function(name) if autograd_profiler._is_profiler_enabled else nullcontext()


def takes_device_loop(r, drafter, k: int) -> bool:
    """The one rule for whether a greedy run on overlapping CUDA graphs takes the device loop: the
    drafter says it can be fed on the device for this k where the verify pass is captured (or not),
    it drafts in this rank for this rank alone (no draft link), and no step is a tree."""
    return drafter.fed_ready(k, r.steps.use_graphs) and r.local and r.link.drafter_rank is None and not r.tree_nodes


def fits(steps: StepRunner, drafter, seq: Sequence, k: int, max_new: int) -> bool:
    """Whether the prompt's every step fits both caches (the loop never leaves mid-prompt)."""
    end = len(seq.tokens) + max_new + 2 * k + 2
    return end <= steps.cache.max_seq and end <= drafter.cache.max_seq


def warm(loop: AcceptOnDevice, drafter, simulated: bool) -> None:
    """Capture the loop's graphs (verify + accept, then the chain bound to its aux rows) outside any
    timing; every TP rank together. Writes scratch entries from position 0: both caches are reset
    before the next prompt."""
    steps = loop.steps
    steps.cache.lengths[0] = 0
    loop.stage(1, torch.zeros(loop.k, dtype=torch.long, device=steps.device), 0)
    loop.launch(simulated)
    drafter.draft_fed(loop.feed, loop.k)
    loop.read()
    steps.cache.lengths[0] = 0
    drafter.prefill([])


def decode_on_device(r, drafter, loop: AcceptOnDevice, seq: Sequence, stats: RunStats, plan: list[int] | None = None) -> int:
    """Run `seq` to its end through the device loop (module docstring) on rank `r`; plan: simulated
    acceptance, the n of each step in order. Returns the steps run."""
    w, k, steps = r.w, r.w.num_draft_tokens, r.steps
    if plan is not None:
        loop.plan[: len(plan)].copy_(torch.tensor(plan[: loop.plan.shape[0]]))
        loop.step_no.zero_()
    t_prev = time.perf_counter()
    first = drafter.propose_on_device(seq.tokens, k)
    if first.device_tokens is None:
        raise RuntimeError("EAGLE-3 device loop: the prompt's first chain did not run on the device")
    loop.stage(seq.tokens[-1], first.device_tokens, steps.cache.lengths[0])
    spans, span, ran = loop.spans, first.gpu_span, 0  # span: around the chain whose drafts this step verifies
    while True:
        calls0, comm0 = r.counters.calls, r.counters.seconds
        base = steps.cache.lengths[0]
        with phase("spectune.verify"):
            loop.launch(simulated=plan is not None)
        nxt = spans[ran % 2] if spans else None
        with phase("spectune.propose"):
            drafter.draft_fed(loop.feed, k, nxt)  # the next step's drafts, behind the acceptance
        with phase("spectune.decide"):
            n, drafts, am = loop.read()  # the chain runs meanwhile
        ran += 1
        new, done = finish(drafts[:n] + [am[n]], seq.n_generated, w)
        r.cache.rollback(0, base + 1 + n)  # [last, d_1..d_n] kept; a_n is the next pass's first entry
        seq.commit(VerifyResult(accepted=n, tokens=new, done=done))
        seq.steps += 1
        seq.accepted += len(new) - 1
        now = time.perf_counter()
        step_s = now - t_prev
        draft_s = span[0].elapsed_time(span[1]) / 1e3 if span is not None else 0.0  # it ran before this pass
        stats.steps.append(
            StepRecord(
                drafted=k,
                accepted=n,
                emitted=len(new),
                step_s=step_s,
                verify_s=max(0.0, step_s - draft_s),
                draft_s=draft_s,
                comm_calls=r.counters.calls - calls0,
                comm_s=r.counters.seconds - comm0,
            )
        )
        t_prev, span = now, nxt
        r.progress(seq)
        if done:
            return ran
