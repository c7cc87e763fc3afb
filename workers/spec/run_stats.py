"""Per-step statistics of a decoding run and the metrics they reduce to (names from DESIGN.md).

One `StepRecord` per verifier decode step (the prefill is not a step). Acceptance length is
tokens emitted per step = accepted drafts + 1 (less where EOS or max_new_tokens cut the step),
so plain decoding scores exactly 1.0.
`accept_rate_pos_<i>` is, among steps that drafted a token at position i (1-based), the share
in which it was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def relative_margins(top2: list) -> list[float]:
    """Per token (top-1 - top-2 logit) / max(|top-1|, 1): how far each greedy choice was from a tie.
    `top2` are the steps' `topk(2).values` (torch tensors), left on the device until now (one host
    sync per prompt)."""
    if not top2:
        return []
    import torch

    return [(a - b) / max(abs(a), 1.0) for a, b in torch.stack(top2).tolist()]


@dataclass
class StepRecord:
    drafted: int
    accepted: int  # drafts the verifier accepted (drafter quality)
    emitted: int  # tokens this step added: accepted + 1, fewer where EOS / max_new_tokens cut it
    step_s: float  # proposal received -> result sent, on verifier rank 0
    verify_s: float  # forward pass + verification
    draft_s: float  # as reported by the drafter
    comm_calls: int
    comm_s: float
    # a batched step (Workload.batch_size > 1): drafted / accepted / emitted above are sums over the
    # `rows` sequences still decoding, and row_drafts holds each one's (drafted, accepted)
    rows: int = 1
    row_drafts: tuple[tuple[int, int], ...] = ()

    def per_row(self) -> tuple[tuple[int, int], ...]:
        return self.row_drafts or ((self.drafted, self.accepted),)


@dataclass
class RunStats:
    steps: list[StepRecord] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def metrics(self, k: int) -> dict[str, float]:
        m: dict[str, float] = {
            "throughput_tok_s": self.tokens / self.seconds if self.seconds > 0 else 0.0,
            "tokens_generated": float(self.tokens),
            "decode_s": self.seconds,
            "num_steps": float(len(self.steps)),
        }
        if not self.steps:
            return m
        step_ms = np.array([s.step_s for s in self.steps]) * 1e3
        verify_ms = np.array([s.verify_s for s in self.steps]) * 1e3
        draft_ms = np.array([s.draft_s for s in self.steps]) * 1e3
        comm_s = sum(s.comm_s for s in self.steps)
        m.update(
            # steady-state decode speed: tokens emitted by decode steps over the time of those steps
            # (throughput_tok_s also charges each prompt's prefill)
            decode_tok_s=sum(s.emitted for s in self.steps) / max(1e-12, sum(s.step_s for s in self.steps)),
            # per sequence and step: a batched step counts once per sequence it advanced
            accept_len_mean=sum(s.emitted for s in self.steps) / sum(s.rows for s in self.steps),
            drafted_mean=sum(s.drafted for s in self.steps) / sum(s.rows for s in self.steps),
            step_ms_p50=float(np.percentile(step_ms, 50)),
            step_ms_p90=float(np.percentile(step_ms, 90)),
            verify_ms_p50=float(np.percentile(verify_ms, 50)),
            draft_ms_p50=float(np.percentile(draft_ms, 50)),
            allreduce_per_step=float(np.mean([s.comm_calls for s in self.steps])),
            comm_ms_per_step=comm_s * 1e3 / len(self.steps),
            comm_fraction=comm_s / max(1e-12, float(step_ms.sum()) / 1e3),
        )
        rows = [r for s in self.steps for r in s.per_row()]
        for i in range(1, k + 1):
            drafted = [accepted for n, accepted in rows if n >= i]
            if drafted:
                m[f"accept_rate_pos_{i}"] = sum(a >= i for a in drafted) / len(drafted)
        return m
