"""Context-length buckets (`workload.context_lengths`): the workload's prompts drawn to exactly L tokens,
so that a trial measures its decode where the KV cache already holds L tokens, as a server's long
prompts do (attention reads grow with the context, so the best k moves with it).

    from orchestrator.prompts.context import draw_to_length
    ids_at_4k = draw_to_length(token_ids, filler, 4096, bos=1)

The rule: prompt i keeps its own tokens at the end (the chat template's generation prompt included, so
the model answers it), a leading BOS stays first, and the tokens between are the text of the workload's
other prompts (never prompt i's own; `workload.split: heldout` keeps them out of anything a drafter was
trained on), starting after prompt i and cycling, encoded without special tokens. A prompt longer than L
keeps its last L tokens (and its BOS). Every prompt of a bucket is exactly L tokens long. Where the other
prompts hold fewer tokens than L, their text repeats: a context of repeated text is one n-gram and
EAGLE drafters find more to copy from than a real one (`context_repeats` says how often).
"""

from __future__ import annotations


def filler_tokens(texts: list[str], encode_text) -> list[list[int]]:
    """Each prompt's text as plain tokens (no BOS, no template): what other prompts' contexts are drawn from."""
    return [list(encode_text(t)) for t in texts]


def draw_to_length(
    token_ids: tuple[tuple[int, ...], ...], filler: list[list[int]], length: int, bos: int | None
) -> tuple[tuple[int, ...], ...]:
    """Every prompt at exactly `length` tokens (the module's rule). ValueError where the workload's
    texts hold no token to draw from."""
    pool = [f for f in filler if f]
    out = []
    for i, ids in enumerate(token_ids):
        head = ids[:1] if bos is not None and ids[:1] == (bos,) else ()
        room = length - len(head)
        body = ids[len(head) :][-room:] if room > 0 else ()
        need = room - len(body)
        middle: list[int] = []
        if need > 0:
            if not pool:
                raise ValueError("the workload's prompts hold no text to draw a longer context from")
            others = [f for j, f in enumerate(filler) if f and j != i] or pool  # never the prompt's own text, unless alone
            j = i
            while len(middle) < need:
                middle += others[j % len(others)]
                j += 1
            middle = middle[len(middle) - need :]  # the tokens nearest the prompt: a cut mid-text lands far from it
        out.append(tuple(head) + tuple(middle) + tuple(body))
    return tuple(out)


def context_repeats(filler: list[list[int]], length: int) -> float:
    """How many times a bucket of `length` tokens repeats the other prompts' text (the smallest such pool)."""
    sizes = [sum(len(f) for j, f in enumerate(filler) if j != i) for i in range(len(filler))]
    smallest = min((n for n in sizes if n), default=0)
    return length / smallest if smallest else float("inf")
