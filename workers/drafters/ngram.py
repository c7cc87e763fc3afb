"""N-gram prompt lookup (model-free drafting).

Find the most recent earlier occurrence of the sequence's last n tokens (n from `max_ngram`
down to `min_ngram`) and propose the k tokens that followed it. Summaries and rewrites copy
long spans of their input, which is where this drafter shines. Deterministic, so its q is
one-hot (see workers/verify.py).
"""
from __future__ import annotations

from workers.drafters.base import Drafter
from workers.link import Proposal


def lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = tokens[n_tok - n :]
        # scan right to left so the most recent match wins; a match must leave a continuation
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter(Drafter):
    kind = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, committed: list[int], k: int) -> Proposal:
        return Proposal(tokens=lookup(committed, k, self.max_ngram, self.min_ngram))
