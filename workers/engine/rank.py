"""The state a verifier rank's decode loop carries: one prompt's `Sequence`, the run's `Rank` (its
step runner, cache, link and how it decides), the `HiddenStates` an EAGLE-3 drafter reads, and
`finish` (EOS and max_new_tokens). The step strategies that use them: workers/engine/strategies.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workers.comm.base import CommCounters
from workers.engine.drafter import Drafter
from workers.engine.link import DraftLink, Proposal, VerifyResult
from workers.engine.steps import StepRunner
from workers.engine.verify import probs, sample, tree_path
from workers.model.transformer import KVCache, Transformer, aux_rows
from workers.spec import Workload


def finish(tokens: list[int], have: int, w: Workload) -> tuple[list[int], bool]:
    """Cut new `tokens` at the first EOS or at max_new_tokens (given `have` already generated)."""
    room = w.max_new_tokens - have
    tokens = tokens[:room]
    for i, t in enumerate(tokens):
        if t in w.eos_ids:
            return tokens[: i + 1], True
    return tokens, have + len(tokens) >= w.max_new_tokens


# Progress hook: (tokens generated so far for the current prompt, seconds since that prompt began),
# called on the rank it is attached to after every decode step; it must be cheap (throttle inside).
ProgressHook = Callable[[int, float], None]


@dataclass
class Sequence:
    """One prompt's decoding state on a verifier rank (with a batch: one per KV cache row)."""

    tokens: list[int]  # prompt + generated: what an in-rank drafter reads
    prompt_len: int
    row: int = 0  # its row of the KV cache
    done: bool = False
    steps: int = 0  # decode steps after the prefill
    accepted: int = 0  # drafts kept over all steps (after EOS / max_new_tokens cuts)
    top2: list[torch.Tensor] | None = None  # per token top-1 / top-2 logits, where margins are recorded
    started: float = field(default_factory=time.perf_counter)
    drafter: Drafter | None = None  # a batch: this row's copy of an in-rank drafter (else the strategy's)

    @classmethod
    def of(cls, prompt, row: int = 0) -> Sequence:
        return cls(tokens=list(prompt), prompt_len=len(prompt), row=row)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def commit(self, result: VerifyResult) -> None:
        self.tokens.extend(result.tokens)
        self.done = result.done


@dataclass
class HiddenStates:
    """EAGLE-3: the verifier's captured aux-layer states (identical on every rank after the allreduce)
    for the committed positions of the last pass, to the drafter process over the link (rank 0 sends
    them with its result) or to a drafter inside this rank."""

    model: Transformer
    to_link: bool  # a drafter process receives them with each result
    drafter: Drafter | None  # an in-rank drafter that reads them

    def rows(self, n: int, row: int = 0, index: list[int] | None = None) -> torch.Tensor:
        """The last pass's first `n` positions of sequence `row` (a batch's row), [n, n_aux x dim];
        index: those positions instead (a tree's root and accepted path)."""
        if index is not None:
            at = torch.tensor(index, device=self.model.aux[0].device)
            return torch.cat([a[row].index_select(0, at) for a in self.model.aux], dim=-1)
        return aux_rows(self.model.aux, row, n)


@dataclass
class Rank:
    """What the strategies use of one verifier rank during one run."""

    steps: StepRunner
    cache: KVCache
    link: DraftLink
    counters: CommCounters
    w: Workload
    index: int  # the TP rank
    local: bool  # decides_locally: every rank verifies for itself
    on_progress: ProgressHook | None = None
    hidden: HiddenStates | None = None
    tree_nodes: int = 0  # a tree drafter's drafts a step (drafter.tree_width): their width is captured too
    gen: torch.Generator = field(init=False)

    def __post_init__(self):
        self.gen = torch.Generator().manual_seed(self.w.seed)  # alike on every rank: local decisions agree

    def progress(self, seq: Sequence) -> None:
        if self.on_progress is not None:
            self.on_progress(seq.n_generated, time.perf_counter() - seq.started)

    @property
    def decides(self) -> bool:
        return self.index == 0 or self.local

    def score(self, seq: Sequence, tokens: list[int], tail: torch.Tensor | None = None, tree: list[int] | None = None) -> torch.Tensor:
        """Logits [len(tokens) (+ len(tail)), vocab] of `tokens` (then the device tokens `tail`) fed
        after the sequence's cached positions. tree: `tokens` is [last, drafts] and tree[i] the
        parent of draft i (`Proposal.parents`)."""
        return self.steps.step(tokens, tail, None if tree is None else [-1] + [p + 1 for p in tree])

    def first_token(self, logits: torch.Tensor) -> VerifyResult:
        w = self.w
        tok = int(logits.argmax()) if w.temperature <= 0 else sample(probs(logits, w.temperature), self.gen)
        tokens, done = finish([tok], 0, w)
        return VerifyResult(accepted=0, tokens=tokens, done=done)

    def publish(self, result: VerifyResult | None, rows: int | None = None, tree: Proposal | None = None) -> VerifyResult:
        """Deciding locally, rank 0 sends its result to the drafter process alone (if any); else rank 0
        broadcasts it to every rank and the drafter, and the other ranks return what they receive.
        Hidden states of the pass's first `rows` positions (default: the kept ones, 1 + accepted; a
        tree's: the root and the accepted path) go along to a drafter that reads them. A tree's
        result comes back with its `path`."""
        h = self.hidden

        def kept(res: VerifyResult) -> torch.Tensor:
            if tree is not None:
                return h.rows(0, index=[0] + [1 + i for i in with_path(res).path])
            return h.rows(rows if rows is not None else 1 + res.accepted)

        def with_path(res: VerifyResult) -> VerifyResult:  # a tree's kept path, found once per result
            if tree is not None and res.path is None:
                res.path = tree_path(tree.tokens, tree.parents, res.tokens[: res.accepted])
            return res

        if h is not None and h.to_link and self.index == 0 and result is not None:
            result.hidden = kept(result)
        res = self._send(result)
        if h is not None and h.drafter is not None:
            h.drafter.observe(kept(res))
        return with_path(res)

    def _send(self, result: VerifyResult | None) -> VerifyResult:
        if self.local:
            if self.index == 0 and self.link.drafter_rank is not None:
                self.link.send_result_to_drafter(result)
            return result
        if self.index == 0:
            self.link.send_result(result)
            return result
        return self.link.recv_result()
