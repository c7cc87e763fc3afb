"""The driver's running trials: each admitted trial measures in a thread of its own (on its slot's
gang pool), and the driver thread collects their outcomes one at a time, in the order they end.
The role Ray Tune's actor manager plays for its controller; the trial loop is
orchestrator/study/controller.py.

Rules: a trial thread never raises (whatever it raises is its outcome, which the driver thread
raises when it collects it); a trial stays in `running` until the driver collects it, so its slot
is busy until then; on an interrupt the driver waits for every thread up to a deadline and is told
which did not stop.

    threads = TrialThreads()
    threads.start(7, slot, lambda: run_trial(...))
    got = threads.next(timeout_s=5.0)   # (7, TrialOutcome or the exception it raised), or None
    slot = threads.pop(7)               # joined; its slot to give back
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.execution.slots import Slot
    from orchestrator.study.trial import TrialOutcome


@dataclass
class Running:
    thread: threading.Thread
    slot: Slot


class TrialThreads:
    def __init__(self) -> None:
        self.running: dict[int, Running] = {}  # by trial number, until the driver collects the trial
        self._finished: queue.Queue[tuple[int, TrialOutcome | BaseException]] = queue.Queue()

    def __len__(self) -> int:
        return len(self.running)

    def __contains__(self, number: object) -> bool:
        return number in self.running

    def numbers(self) -> set[int]:
        return set(self.running)

    def start(self, number: int, slot: Slot, measure: Callable[[], TrialOutcome]) -> None:
        """Trial `number` measures on `slot` in a thread named trial-<number>."""

        def work() -> None:
            try:
                out: TrialOutcome | BaseException = measure()
            except BaseException as e:  # noqa: BLE001 - handed to the driver thread, which raises it
                out = e
            self._finished.put((number, out))

        thread = threading.Thread(target=work, name=f"trial-{number}", daemon=True)
        self.running[number] = Running(thread, slot)
        thread.start()

    def next(self, timeout_s: float) -> tuple[int, TrialOutcome | BaseException] | None:
        """The next trial that ended and its outcome (or what it raised); None if none ended within `timeout_s`."""
        try:
            return self._finished.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def pop(self, number: int) -> Slot:
        """Trial `number` is collected: its thread joined, its slot returned (for the caller to give back)."""
        running = self.running.pop(number)
        running.thread.join()
        return running.slot

    def stop(self, deadline_s: float) -> list[int]:
        """Wait up to `deadline_s` in all for every running trial's thread (their gangs were interrupted);
        the trials whose threads are still alive then. They stay in `running`."""
        deadline = time.monotonic() + deadline_s
        for running in list(self.running.values()):
            running.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return [number for number, running in self.running.items() if running.thread.is_alive()]
