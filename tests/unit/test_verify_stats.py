"""Rejection sampling keeps the verifier's distribution (chi-square over many draws on a small
vocabulary), and the same test catches a deliberately biased acceptance rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from workers.engine.verify import greedy_verify, rejection_verify

V = 6
N = 8000  # the biased rule's p-value is below 1e-100 at this size; the correct rule's ~0.1-0.3


def _setup(seed: int, k: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(k, V, generator=g) * 1.5, dim=-1)
    return logits, q


def _first_tokens(rule, logits, q, k, deterministic_draft: bool) -> np.ndarray:
    """Distribution of the first emitted token over N independent verify calls."""
    gen = torch.Generator().manual_seed(123)
    counts = np.zeros(V)
    for _ in range(N):
        if deterministic_draft:  # an n-gram style drafter always proposes the same tokens
            draft = list(range(1, k + 1))
            probs = None
        else:
            draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
            probs = q
        _, tokens = rule(draft, probs, logits, 1.0, gen)
        counts[tokens[0]] += 1
    return counts


def _p_value(counts: np.ndarray, logits: torch.Tensor) -> float:
    return float(chisquare(counts, _expected(logits[0], counts)).pvalue)


def _expected(row: torch.Tensor, counts: np.ndarray) -> np.ndarray:
    p = torch.softmax(row.double(), -1).numpy()
    return p / p.sum() * counts.sum()


def biased_rule(draft, probs, logits, temperature, gen):
    """Wrong on purpose: on rejection it resamples from p instead of the residual max(0, p - q)."""
    p = torch.softmax(logits / temperature, -1)
    for i, x in enumerate(draft):
        qx = 1.0 if probs is None else probs[i, x].item()
        if torch.rand(1, generator=gen).item() * qx < p[i, x].item():
            continue
        return i, draft[:i] + [int(torch.multinomial(p[i], 1, generator=gen))]
    return len(draft), draft + [int(torch.multinomial(p[len(draft)], 1, generator=gen))]


@pytest.mark.parametrize("k, deterministic", [(1, False), (3, False), (2, True)])
def test_rejection_sampling_keeps_target_distribution(k, deterministic):
    logits, q = _setup(seed=k, k=k)
    assert _p_value(_first_tokens(rejection_verify, logits, q, k, deterministic), logits) > 1e-3


@pytest.mark.parametrize("k, deterministic", [(1, False), (2, True)])
def test_the_statistical_test_catches_a_biased_rule(k, deterministic):
    logits, q = _setup(seed=k, k=k)
    assert _p_value(_first_tokens(biased_rule, logits, q, k, deterministic), logits) < 1e-6


def test_second_token_given_first_accepted():
    """Position 2 after an accepted position 1 is also distributed as p (conditional check)."""
    k = 2
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(k + 1, V, generator=g)
    q = torch.softmax(torch.randn(k, V, generator=g), -1)
    gen = torch.Generator().manual_seed(5)
    counts = np.zeros(V)
    draft0 = 2
    while counts.sum() < 8000:
        draft = [draft0, int(torch.multinomial(q[1], 1, generator=gen))]
        n, tokens = rejection_verify(draft, q, logits, 1.0, gen)
        if n >= 1:
            counts[tokens[1]] += 1
    assert chisquare(counts, _expected(logits[1], counts)).pvalue > 1e-3


def test_greedy_accepts_the_matching_prefix():
    logits = torch.full((4, V), -5.0)
    for row, tok in enumerate([3, 1, 4, 2]):
        logits[row, tok] = 5.0
    assert greedy_verify([3, 1, 4], logits) == (3, [3, 1, 4, 2])  # all accepted + bonus
    assert greedy_verify([3, 0, 4], logits) == (1, [3, 1])  # corrected at position 2
    assert greedy_verify([], logits[:1]) == (0, [3])  # plain decoding


def test_inverse_cdf_sampler_never_draws_a_zero_probability_token():
    """`sample` on an unnormalised row with zeros at both ends and in the middle, u = 0 included
    (side="right" of the cumulative sum): only positive tokens, in proportion."""
    from workers.engine.verify import sample

    p = torch.tensor([0.0, 0.0, 2.0, 0.0, 6.0, 0.0])
    gen = torch.Generator().manual_seed(5)
    counts = torch.bincount(torch.tensor([sample(p, gen) for _ in range(4000)]), minlength=6)
    assert counts[[0, 1, 3, 5]].sum() == 0
    assert abs(counts[4].item() / 4000 - 0.75) < 0.03
    c = torch.cumsum(p.double(), 0)  # the edge u = 0, which the generator rarely draws
    assert int(torch.searchsorted(c, torch.zeros(1, dtype=torch.float64) * c[-1], right=True)) == 2
