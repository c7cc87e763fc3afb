"""N-gram prompt lookup (model-free drafting).

Find the most recent earlier occurrence of the sequence's last n tokens (n from `max_ngram`
down to `min_ngram`) and propose the k tokens that followed it. Summaries and rewrites copy
long spans of their input, which is where this drafter shines. Deterministic, so its q is
one-hot (see workers/engine/verify.py).
"""

from __future__ import annotations

import time

from workers.engine.drafter import Drafter
from workers.engine.link import Proposal


def lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        suffix = tokens[n_tok - n :]
        # scan right to left so the most recent match wins; a match must leave a continuation
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramIndex:
    """Where each n-gram (n = min..max) last started, kept up to date as the sequence grows, so a
    proposal costs O(max_ngram) instead of a scan. Same answers as `lookup` (tested)."""

    TAIL = 16  # tokens of the indexed sequence's end kept to recognise a continuation

    def __init__(self, max_ngram: int, min_ngram: int):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    def reset(self) -> None:
        self.last: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # the length of the sequence indexed so far
        self.tail: list[int] = []  # its last TAIL tokens

    def _extend(self, seq: list[int]) -> None:
        # Within a prompt the sequence only grows, so a continuation is recognised by its length and
        # the indexed tail, not by comparing (and copying) the whole prefix: a step costs O(new
        # tokens). A shorter sequence or another tail starts over.
        n = self.indexed
        if len(seq) < n or seq[n - len(self.tail) : n] != self.tail:
            self.reset()
        # an n-gram is indexed once a token follows it (a match must leave a continuation)
        for end in range(max(self.indexed, 1), len(seq)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self.last[tuple(seq[end - n : end])] = end - n
        self.indexed = len(seq)
        self.tail = seq[max(0, len(seq) - self.TAIL) :]

    def propose(self, seq: list[int], k: int) -> list[int]:
        found = self.continuations(seq, k, 1)
        return found[0] if found else []

    def continuations(self, seq: list[int], k: int, most: int) -> list[list[int]]:
        """Up to `most` different continuations, longest match first: the most recent occurrence of
        the last n tokens for each n from max_ngram down to min_ngram (`propose` is the first)."""
        self._extend(seq)
        n_tok, found = len(seq), []
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            start = self.last.get(tuple(seq[n_tok - n :]))
            if start is not None and start + n < n_tok and (cont := seq[start + n : start + n + k]) not in found:
                found.append(cont)
                if len(found) == most:
                    break
        return found


class NgramDrafter(Drafter):
    kind = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index = NgramIndex(max_ngram, min_ngram)

    def prefill(self, prompt: list[int]) -> None:
        self.index.reset()

    def propose(self, committed: list[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        tokens = self.index.propose(committed, k)
        return Proposal(tokens=tokens, draft_s=time.perf_counter() - t0)
