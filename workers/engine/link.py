"""The draft link: typed per-step messages between the drafter and the verifier ranks.

Every process of a gang is in one process group (the "link group": verifier ranks 0..tp-1 and,
when there is one, the drafter as rank tp). Only model drafters are processes of their own: the
n-gram drafter runs inside every verifier rank (`DrafterSpec.in_verifier`), so its gangs send no
link messages at all. Per step the drafter broadcasts a `Proposal` and
verifier rank 0 broadcasts a `VerifyResult`; both travel as fixed-size int64 headers, so no one
needs to know a message's size in advance (k + a few integers). The drafter's probabilities, which
stochastic verification needs ([n, vocab] float32: 2 MB for 4 drafts of a 128K vocabulary), go
point to point to rank 0 alone, the one rank that verifies when a drafter is in the gang.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Proposal:
    tokens: list[int]  # the drafted tokens, at most k (an n-gram miss proposes none)
    probs: torch.Tensor | None = None  # [len(tokens), vocab] drafter distribution, stochastic only
    draft_s: float = 0.0  # time the drafter spent proposing
    # an in-rank greedy chain under engine.overlap: the k drafts still on the device (`tokens` is
    # filled when the step reads them together with the verify pass's argmaxes), and CUDA events
    # around the chain on the GPU, whose elapsed time is then the draft time
    device_tokens: torch.Tensor | None = None
    gpu_span: tuple | None = None
    # a tree (drafter.tree_width): parents[i] is draft i's parent, -1 for the last committed token;
    # None: a chain. Trees list the chain (top-1 at each depth) first, so tokens[:k] are its chain.
    parents: list[int] | None = None


@dataclass
class VerifyResult:
    """What the verifier decided this step; drafters read it to roll back and continue.

    `hidden` [n, width]: the verifier's hidden states of the n newest committed positions for a
    drafter that reads them (EAGLE-3: the aux layers' states, concatenated); only the drafter
    process receives them, point to point from rank 0 (every verifier rank holds the same).
    """

    accepted: int  # drafts accepted
    tokens: list[int]  # tokens appended to the sequence: accepted drafts + correction/bonus
    done: bool
    hidden: torch.Tensor | None = None
    # a tree step's kept path (draft indices), found once per rank from the tokens (`Rank.publish`);
    # never sent: every process derives it from the proposal it holds
    path: list[int] | None = None


class DraftLink:
    """Broadcasts over the link group. `drafter_rank` is None when the gang has no drafter."""

    def __init__(
        self,
        group,
        rank: int,
        drafter_rank: int | None,
        k: int,
        vocab: int,
        device="cpu",
        hidden_width: int = 0,
        hidden_dtype: torch.dtype = torch.float32,
    ):
        self.group, self.rank, self.drafter_rank = group, rank, drafter_rank
        self.k, self.vocab, self.device = k, vocab, device
        self.hidden_width, self.hidden_dtype = hidden_width, hidden_dtype  # 0: no hidden states travel

    def _bcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        dist.broadcast(t, src=src, group=self.group)
        return t

    # before a run's first prompt: the drafter process warms (captures its graphs for this k) while the
    # verifier ranks warm; rank 0 starts its clock only once the drafter says it is ready
    def drafter_ready(self) -> None:
        dist.send(torch.ones(1, dtype=torch.int64), dst=0, group=self.group)

    def wait_for_drafter(self) -> None:
        if self.rank == 0 and self.drafter_rank is not None:
            dist.recv(torch.zeros(1, dtype=torch.int64), src=self.drafter_rank, group=self.group)

    # header layout: [n_tokens, has_probs, draft_us, is_tree, tokens(k), parents(k)]
    def send_proposal(self, p: Proposal) -> None:
        self._exchange_proposal(p)

    def recv_proposal(self) -> Proposal:
        return self._exchange_proposal(None)

    def _exchange_proposal(self, p: Proposal | None) -> Proposal:
        k = self.k
        header = torch.zeros(4 + 2 * k, dtype=torch.int64)
        if p is not None:
            n = len(p.tokens)
            header[0], header[1], header[2] = n, int(p.probs is not None), int(p.draft_s * 1e6)
            header[4 : 4 + n] = torch.tensor(p.tokens, dtype=torch.int64)
            if p.parents is not None:
                header[3] = 1
                header[4 + k : 4 + k + n] = torch.tensor(p.parents, dtype=torch.int64)
        self._bcast(header, self.drafter_rank)
        n, has_probs, draft_us, is_tree = header[:4].tolist()
        parents = header[4 + k : 4 + k + n].tolist() if is_tree else None
        q = None
        if has_probs and p is not None:
            q = p.probs.float().contiguous()
            dist.send(q, dst=0, group=self.group)
        elif has_probs and self.rank == 0:
            q = torch.empty(n, self.vocab)
            dist.recv(q, src=self.drafter_rank, group=self.group)
        return Proposal(tokens=header[4 : 4 + n].tolist(), probs=q, draft_s=draft_us / 1e6, parents=parents)

    # header layout: [accepted, n_tokens, done, n_hidden, tokens(k + 1)]; then, when n_hidden > 0,
    # rank 0 sends the hidden states [n_hidden, hidden_width] to the drafter alone
    def send_result(self, r: VerifyResult) -> None:
        self._bcast(self._result_header(r), 0)
        self._send_hidden(r)

    def recv_result(self) -> VerifyResult:
        return self._recv_hidden(self._parse_result(self._bcast(self._result_header(None), 0)))

    def _send_hidden(self, r: VerifyResult) -> None:
        if r.hidden is not None and self.drafter_rank is not None:
            dist.send(r.hidden.to("cpu", self.hidden_dtype).contiguous(), dst=self.drafter_rank, group=self.group)

    def _recv_hidden(self, r: VerifyResult) -> VerifyResult:
        if r.hidden is not None and self.rank == self.drafter_rank:
            dist.recv(r.hidden, src=0, group=self.group)
            return r
        r.hidden = None
        return r

    # when every verifier rank decides for itself (deterministic verification), only the drafter
    # needs rank 0's result: one point-to-point message instead of a broadcast to the whole gang
    def send_result_to_drafter(self, r: VerifyResult) -> None:
        dist.send(self._result_header(r), dst=self.drafter_rank, group=self.group)
        self._send_hidden(r)

    def recv_result_from_verifier(self) -> VerifyResult:
        header = self._result_header(None)
        dist.recv(header, src=0, group=self.group)
        return self._recv_hidden(self._parse_result(header))

    def _result_header(self, r: VerifyResult | None) -> torch.Tensor:
        header = torch.zeros(4 + self.k + 1, dtype=torch.int64)
        if r is not None:
            n = len(r.tokens)
            n_hidden = r.hidden.shape[0] if r.hidden is not None and self.drafter_rank is not None else 0
            header[0], header[1], header[2], header[3] = r.accepted, n, int(r.done), n_hidden
            header[4 : 4 + n] = torch.tensor(r.tokens, dtype=torch.int64)
        return header

    def _parse_result(self, header: torch.Tensor) -> VerifyResult:
        accepted, n, done, n_hidden = header[:4].tolist()
        hidden = torch.empty(n_hidden, self.hidden_width, dtype=self.hidden_dtype) if n_hidden else None
        return VerifyResult(accepted=accepted, tokens=header[4 : 4 + n].tolist(), done=bool(done), hidden=hidden)
