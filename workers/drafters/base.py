"""What every drafter does: prefill on a new prompt, then propose up to k tokens per step.

`propose(committed, k)` receives the whole committed sequence (prompt + tokens the verifier has
accepted so far) and returns a `Proposal`; a drafter with a KV cache keeps it in step with the
committed sequence by itself (rolling back whatever drafts the verifier rejected).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from workers.engine.link import Proposal


class Drafter(ABC):
    kind = "base"
    reads_hidden = False  # True: `observe` wants the verifier's hidden states (EAGLE-3)

    def begin(self, temperature: float, seed: int) -> None:  # noqa: B027 - optional hook
        """Called at the start of each workload run (temperature and seed may change between runs)."""

    def warm(self, k: int) -> None:  # noqa: B027 - optional hook
        """Prepare for proposals of up to k tokens (e.g. capture CUDA graphs) before timing starts."""

    def prefill(self, prompt: list[int]) -> None:  # noqa: B027 - optional hook
        """Called once per prompt before the first proposal."""

    def observe(self, hidden) -> None:  # noqa: B027 - optional hook
        """reads_hidden only: the verifier's hidden states of the next committed positions, in order."""

    @abstractmethod
    def propose(self, committed: list[int], k: int) -> Proposal: ...
