"""The study's slots while its trials run: the `SlotBook` (orchestrator/execution/slots.py: free,
busy, lost, who ran beside whom) behind the one lock the trial threads share, and each slot's gang
pool. The trial loop (orchestrator/study/controller.py) takes a slot for each trial it starts and
gives it back when the trial's thread ends; a node that left the cluster takes its slots with it.
No Ray here: a pool is anything with `close()` and `interrupt()` (`Pool`), and whether a node is
alive is the caller's probe (`execution.cluster.node_alive` in a study).

    table = SlotTable(slots, slot_pools(slots, res, log), nodes, node_alive)
    slot = table.acquire(7)            # the first free slot (fresh=True: its pool's gang goes first)
    site = table.site(7)               # the trial's view of its slot, from its own thread
    table.release(7)                   # its thread ended
    gone = table.lose_node(node_id)    # the node's slots leave the study, their pools closed
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from orchestrator.execution.slots import NodeInfo, Slot, SlotBook, TrialSite

if TYPE_CHECKING:
    from orchestrator.execution.cluster import Resources
    from orchestrator.execution.pool import GangPool


class Pool(Protocol):
    """What the table asks of a slot's gang pool (`execution.pool.GangPool`; a test's fake)."""

    def close(self) -> None: ...

    def interrupt(self) -> None: ...


def slot_pools(slots: list[Slot], res: Resources, log: Callable[[str], None]) -> dict[int, GangPool]:
    """One gang pool per slot (gangs are reused within a slot), pinned to the slot's node if it has one.
    The caller owns them: it closes them and counts their launches, however the loop ends."""
    from orchestrator.execution.pool import GangPool

    return {s.index: GangPool(replace(res, node_id=s.node.id if s.node else None), log) for s in slots}


class SlotTable:
    """Which slot runs which trial, and each slot's pool. Every change of the book is made under
    `lock`, which the running trials' sites take too (`TrialSite`)."""

    def __init__(
        self,
        slots: list[Slot],
        pools: dict[int, Pool],
        nodes: Sequence[NodeInfo] = (),
        node_alive: Callable[[str], bool] = lambda node_id: True,
    ):
        self.book = SlotBook(slots, list(nodes))
        self.pools = pools
        self.node_alive = node_alive
        self.lock = threading.Lock()

    def __len__(self) -> int:
        """Slots still in the study (a lost node's are not)."""
        return len(self.book)

    @property
    def free(self) -> int:
        with self.lock:
            return len(self.book.free)

    @property
    def hosts_shared(self) -> bool:
        """Two slots may run on one host (`SlotBook.hosts_shared`): a re-measure then runs alone."""
        return self.book.hosts_shared

    def acquire(self, number: int, fresh: bool = False) -> Slot:
        """The first free slot, now trial `number`'s. `fresh`: the trial runs on a gang of its own (a
        re-measure), so the slot's pool lets its live gang go first."""
        with self.lock:
            slot = self.book.acquire(number)
        if slot is None:
            raise RuntimeError(f"no free slot for trial {number}")  # the loop asks only while a slot is free
        if fresh:
            self.pools[slot.index].close()
        return slot

    def pool(self, slot: Slot) -> Pool:
        return self.pools[slot.index]

    def site(self, number: int) -> TrialSite:
        """Trial `number`'s view of its slot, for its own thread: where its gang landed, who ran beside
        it, whether its node is gone (`node_alive`)."""
        return self.book.site(number, self.lock, self.node_alive)

    def release(self, number: int) -> list[int]:
        """Trial `number`'s thread ended: its slot is free again, unless its node left the study.
        Returns the trials that ran beside it on its host."""
        with self.lock:
            return self.book.release(number)

    def node_name(self, node_id: str) -> str:
        """A node in words ("<host>/<id8>"), also once it has left the cluster (`SlotBook.node_name`)."""
        with self.lock:
            return self.book.node_name(node_id)

    def lose_node(self, node_id: str) -> list[Slot]:
        """The node left the cluster: its slots leave the study (none is handed out again) and their
        pools are closed. Returns those slots."""
        with self.lock:
            gone = self.book.lose_node(node_id)
        for slot in gone:
            self.pools[slot.index].close()
        return gone

    def park(self) -> None:
        """No trial of this driver runs (the others' hold the last places): no gang is kept waiting."""
        for pool in self.pools.values():
            pool.close()

    def interrupt(self) -> None:
        """Ctrl-C / `ray job stop`: every pool's gang goes, under its running trial too; each such
        trial sees its pool interrupted and fails as interrupted (orchestrator/study/trial.py)."""
        for pool in self.pools.values():
            pool.interrupt()
