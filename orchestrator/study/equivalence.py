"""Is a greedy speculative run's output the baseline's? Exactly, or up to numerical near ties.

Greedy speculative decoding is lossless in exact arithmetic. In bf16 on a GPU the verify pass
scores k + 1 tokens at once, so its matrix products run other kernels (other tile shapes and
split-K orders) than the baseline's one-token steps, and logits differ in their last bits. Where
the baseline's top two logits are that close, the argmax may flip and the texts part ways, with
nothing wrong in the engine. So the baseline records, per token, its relative margin
(top-1 - top-2) / max(|top-1|, 1), and a prompt whose first difference falls where that margin is
within the dtype's tolerance counts as equivalent ("near tie"); a difference anywhere else is a
wrong output and makes the trial invalid. float32 keeps a tolerance of 1e-5, so CPU runs are held
to exact equality in practice.
"""

from __future__ import annotations

# relative logit margin below which a flip is numerical noise: a few units in the last place of
# the logits' precision (bf16 keeps 8 significant bits, fp16 11, fp32 24)
TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-5, "float16": 2.0**-8}


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(base: list[int], margins: list[float], tokens: list[int], tol: float) -> tuple[str, int | None]:
    """('same' | 'near_tie' | 'differs', index of the first differing token or None)."""
    j = first_difference(base, tokens)
    if j is None:
        return "same", None
    if j < len(margins) and margins[j] <= tol:
        return "near_tie", j
    return "differs", j


def outputs_verdict(base_tokens: list[list[int]], base_margins: list[list[float]], tokens: list[list[int]], dtype: str) -> dict[str, float]:
    """Metrics of a run against its baseline: outputs_match_baseline (1 when every prompt is the
    same or parts only at a near tie), prompts_matching_baseline (exactly), prompts_near_tie."""
    tol = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
    verdicts = [compare(b, m, t, tol)[0] for b, m, t in zip(base_tokens, base_margins, tokens)]
    return {
        "outputs_match_baseline": int(len(verdicts) == len(tokens) and "differs" not in verdicts),
        "prompts_matching_baseline": sum(v == "same" for v in verdicts),
        "prompts_near_tie": sum(v == "near_tie" for v in verdicts),
    }
