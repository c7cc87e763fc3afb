"""What every drafter does: prefill on a new prompt, then propose up to k tokens per step.

`propose(committed, k)` receives the whole committed sequence (prompt + tokens the verifier has
accepted so far) and returns a `Proposal`; a drafter with a KV cache keeps it in step with the
committed sequence by itself (rolling back whatever drafts the verifier rejected).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

from workers.engine.link import Proposal
from workers.model.transformer import aux_rows


class Drafter(ABC):
    """Capabilities are declared here, fixed by the class (and, for `fed_ready`, the run's settings),
    never probed with getattr / hasattr: the engine asks these and nothing else.

    - reads_hidden: `observe` wants the verifier's hidden states (EAGLE-3)
    - proposes_on_device: `propose_on_device` may leave a greedy chain's drafts on the device
    - fed_ready(k, graphed): the verifier may feed it on the device (the device loop's drafter side)
    """

    kind = "base"
    reads_hidden = False
    proposes_on_device = False

    def fed_ready(self, k: int, graphed: bool) -> bool:
        """Whether this run's proposals can be fed on the device (workers/engine/device_loop.py)."""
        return False

    def propose_on_device(self, committed: list[int], k: int) -> Proposal:
        """`propose`, where drafts may stay on the device; by default the host's proposal."""
        return self.propose(committed, k)

    def begin(self, temperature: float, seed: int) -> None:  # noqa: B027 - optional hook
        """Called at the start of each workload run (temperature and seed may change between runs)."""

    def warm(self, k: int) -> None:  # noqa: B027 - optional hook
        """Prepare for proposals of up to k tokens (e.g. capture CUDA graphs) before timing starts."""

    def prefill(self, prompt: list[int]) -> None:  # noqa: B027 - optional hook
        """Called once per prompt before the first proposal."""

    def observe(self, hidden) -> None:  # noqa: B027 - optional hook
        """reads_hidden only: the verifier's hidden states of the next committed positions, in order."""

    def observe_rows(self, aux: list, row: int, n: int) -> None:
        """reads_hidden only, a batch's row: `observe` of the first n positions of row `row` of the
        last batched pass (`aux`: its aux layers' outputs [rows, W, dim], valid until the next pass).
        A drafter of every row at once may keep the reference and gather all rows in one copy."""
        self.observe(aux_rows(aux, row, n))

    @abstractmethod
    def propose(self, committed: list[int], k: int) -> Proposal: ...

    def batch_rows(self, n: int, k: int):
        """A drafter for the n rows of a batch inside the verifier rank that drafts them all in one
        pass (its `.rows[i]` are the rows' drafters, `.propose({row: committed}, k)` drafts them,
        `.begin(n)` starts a batch, `.warm(k, sizes)` prepares), or None: one `fork` per row."""
        return None

    def fork(self) -> Drafter:
        """A drafter for another sequence of a batch: its own per-sequence state; weights may be shared."""
        return copy.deepcopy(self)

    # batch > 1 in a drafter process (workers/engine/batched.py `run_drafter_batched`): one proposal per
    # live sequence per step. The default keeps a copy of this drafter per sequence; a model drafter
    # overrides both to draft every sequence in one pass.
    def begin_rows(self, n: int) -> None:
        """A new batch of n sequences (after `begin`)."""
        self._row_copies: list[Drafter] = []  # not copied into the copies
        self._row_copies = [self.fork() for _ in range(n)]
        for row in self._row_copies:
            row.prefill([])

    def prefill_rows(self, prompts: list[list[int]]) -> None:  # noqa: B027 - optional hook
        """A new batch's prompts, before their first tokens are known (after `begin_rows`): a drafter
        with a cache may take them now (a drafter process: while the verifier prefills)."""

    def warm_rows(self, k: int, sizes) -> None:  # noqa: B027 - optional hook
        """Prepare batched proposals of up to k tokens for batches of `sizes` rows (e.g. capture CUDA
        graphs) before timing starts."""

    def propose_rows(self, committed: list[list[int]], live: list[int], k: int) -> dict[int, Proposal]:
        """Proposals for the sequences `live` (indices into `committed`, every sequence of the batch)."""
        return {i: self._row_copies[i].propose(committed[i], k) for i in live}
