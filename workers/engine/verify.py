"""Verification rules of speculative decoding: which drafted tokens the verifier keeps.

The verifier scores `[last, d_1 .. d_k]` in one pass; row i of its logits is the distribution of
the token after position i, so row i-1 judges draft d_i and row k gives the bonus token.

Greedy: keep d_i while d_i == argmax(row i-1); the first mismatch is replaced by that argmax
(the "correction"), and if all k survive the argmax of row k is the bonus token. The output is
token-for-token the greedy baseline's.

Stochastic (Leviathan et al. / Chen et al. rejection sampling): with p = verifier and q = drafter
distributions at the same temperature, keep d_i with probability min(1, p(d_i) / q(d_i)); on the
first rejection sample from the residual norm(max(0, p - q)) and stop; if all survive, sample the
bonus from p. Every emitted token is then distributed exactly as p. A deterministic drafter
(n-gram lookup) has q = one-hot(d_i): keep with probability p(d_i), residual = p with d_i removed.

Each call returns (number of drafts accepted, the new tokens: accepted drafts + one more).

Trees (`tree_verify`): drafts with parents, scored in one pass under a tree mask (row 0: after
the last committed token, row i + 1: after draft i). From the root, the walk takes a child the
target agrees with and goes on from it, until no child fits: then the row it stands on gives the
one more token. Greedy: the child equal to the row's argmax. Sampling: the children are
deterministic drafts (the drafter's top-w), tried in order with the one-hot rule above: keep
child c with probability r(c) / sum(r), where r starts as p and loses each rejected child's mass;
if none is kept, sample from r. That is sampling from p and asking "is it c_1, else c_2, ...",
so every emitted token is distributed exactly as p.
"""

from __future__ import annotations

import torch


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from `p` (unnormalised is fine) wherever it lives, by inverse CDF: a uniform u from
    the CPU generator, then the first index whose cumulative sum exceeds u x total. Only that index
    crosses to the host (a GPU row of 128K probabilities stays put). The cumsum is float64, and
    side="right" never lands on a zero-probability token, u = 0 included."""
    u = torch.rand(1, generator=generator, dtype=torch.float64)
    c = torch.cumsum(p.double(), dim=0)
    idx = torch.searchsorted(c, u.to(c.device) * c[-1], right=True)
    return int(idx.clamp_max(p.numel() - 1).item())


def greedy_verify(draft: list[int], logits: torch.Tensor) -> tuple[int, list[int]]:
    target = logits.argmax(dim=-1).tolist()  # [k + 1]
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return n, draft[:n] + [target[n]]


def rejection_verify(
    draft: list[int],
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[int, list[int]]:
    """`draft_probs` [k, V] is q for each draft position, or None for a deterministic (one-hot) drafter."""
    p = probs(logits, temperature)  # [k + 1, V]
    uniforms = torch.rand(len(draft), generator=generator).tolist()
    k = len(draft)
    rows, cols = torch.arange(k), torch.tensor(draft, dtype=torch.long)
    p_drafts = p[rows.to(p.device), cols.to(p.device)].tolist()  # one host sync for all k, not one each
    q_drafts = [1.0] * k if draft_probs is None else draft_probs[rows.to(draft_probs.device), cols.to(draft_probs.device)].tolist()
    for i, x in enumerate(draft):
        px, qx = p_drafts[i], q_drafts[i]
        # accept with probability min(1, px / qx); written without the division so qx = 0 is safe
        if uniforms[i] * qx < px:
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - draft_probs[i].to(p.device)).clamp_min(0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[i]
        return i, draft[:i] + [sample(residual, generator)]
    return len(draft), draft + [sample(p[len(draft)], generator)]


def verify(draft, draft_probs, logits, temperature, generator) -> tuple[int, list[int]]:
    if temperature <= 0:
        return greedy_verify(draft, logits)
    return rejection_verify(draft, draft_probs, logits, temperature, generator)


def _children(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    return kids


def tree_verify(
    draft: list[int], parents: list[int], logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[list[int], list[int]]:
    """(the accepted path: draft indices root to leaf, the new tokens: the path's tokens + one more).
    parents[i]: draft i's parent, -1 for the root (the last committed token); logits [1 + n, V]."""
    kids, path, node = _children(parents), [], -1
    if temperature <= 0:
        targets = logits.argmax(dim=-1).tolist()
        while True:
            nxt = next((c for c in kids.get(node, []) if draft[c] == targets[node + 1]), None)
            if nxt is None:
                return path, [draft[i] for i in path] + [targets[node + 1]]
            path.append(nxt)
            node = nxt
    p_rows = probs(logits, temperature)
    while True:
        row, children = p_rows[node + 1], kids.get(node, [])
        ids = torch.tensor([draft[c] for c in children], dtype=torch.long, device=row.device)
        # the children's probabilities and the row's total in one transfer; the walk runs on the host
        *p_kids, total = torch.cat([row.index_select(0, ids), row.sum().view(1)]).tolist()
        rejected: set[int] = set()
        for c, pc in zip(children, p_kids):
            if draft[c] in rejected:  # a repeated token: its mass is gone already
                continue
            u = float(torch.rand(1, generator=generator))
            if u * total < pc:  # keep c with probability r(c) / sum(r)
                path.append(c)
                node = c
                break
            rejected.add(draft[c])
            total -= pc
        else:
            r = row.clone()
            if rejected:
                r.index_fill_(0, torch.tensor(sorted(rejected), device=r.device), 0.0)
            return path, [draft[i] for i in path] + [sample(r, generator)]


def tree_path(draft: list[int], parents: list[int], accepted: list[int]) -> list[int]:
    """The draft indices of the path whose tokens are `accepted` (what `tree_verify` kept): how a
    rank that did not decide, or the drafter, finds it from the result's tokens. A token that two
    siblings share resolves to the first, as `tree_verify` keeps the first (sampling gives the
    second no mass once the first is rejected)."""
    kids, path, node = _children(parents), [], -1
    for t in accepted:
        node = next(c for c in kids.get(node, []) if draft[c] == t)
        path.append(node)
    return path
