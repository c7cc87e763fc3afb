"""The n-gram prompt-lookup drafter."""

from workers.drafters.ngram import NgramDrafter, lookup


def test_longest_most_recent_match_wins():
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix (5, 2, 3)? no earlier match; (2, 3) last occurred at index 6 -> continues 7, 8, 5
    assert lookup(seq, 3, max_ngram=3) == [7, 8, 5]


def test_no_match_and_limits():
    assert lookup([1, 2, 3, 4], 4) == []
    assert lookup([5], 2) == []
    assert lookup([4, 5, 4], 5) == [5, 4]  # continuation runs up to the end of the sequence
    assert lookup([1, 2, 1, 2, 1, 2], 8, max_ngram=2) == [1, 2]


def test_drafter_proposes_without_probs():
    p = NgramDrafter(max_ngram=2).propose([1, 2, 3, 1, 2], 2)
    assert p.tokens == [3, 1] and p.probs is None


def test_index_agrees_with_scan_as_the_sequence_grows():
    import random

    from workers.drafters.ngram import NgramIndex

    rng = random.Random(0)
    for trial in range(30):
        index = NgramIndex(max_ngram=3, min_ngram=1)
        seq = [rng.randrange(6) for _ in range(3)]
        for _ in range(60):
            assert index.propose(seq, 4) == lookup(seq, 4, 3, 1), (trial, seq)
            seq = seq + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        # a sequence that is not a continuation (another last token, or shorter) starts the index over
        other = seq[:-1] + [seq[-1] + 1, 2]
        assert index.propose(other, 4) == lookup(other, 4, 3, 1)
        assert index.propose([9, 1, 9], 2) == lookup([9, 1, 9], 2, 3, 1)


def test_continuations_are_each_match_lengths_distinct_answer_longest_first():
    from workers.drafters.ngram import NgramIndex

    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    index = NgramIndex(max_ngram=3, min_ngram=1)
    # (2, 3) last occurred at 6 -> 7, 8; (3,) also at 7 -> the same, skipped; (5, 2, 3) never
    assert index.continuations(seq, 2, 3) == [[7, 8]]
    seq = [4, 5, 6, 1, 5, 6, 2, 8, 6]
    # (2, 8, 6) and (8, 6) never occurred before; (6,) last at 5 -> 2, 8
    assert index.continuations(seq, 2, 3) == [[2, 8]]
    seq = [7, 1, 2, 9, 3, 2, 5, 1, 2]
    # (1, 2) at 1 -> 9, 3; (2,) last at 5 -> 5, 1
    assert index.continuations(seq, 2, 3) == [[9, 3], [5, 1]]
    assert index.continuations(seq, 2, 1) == [[9, 3]] == [index.propose(seq, 2)]
