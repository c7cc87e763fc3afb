"""Where concurrent trials may run: the isolated slots of a Ray cluster, and who shares a node.

A slot is a place one trial's gang runs at a time. `study.isolation` decides how many a node offers:

- `node` (default): one per node that can hold the study's largest gang. On a real cluster no two
  measurements then share a host's CPUs, memory bandwidth, PCIe root complex or NVLink switch.
  Several raylets started on one host are several Ray nodes that still share that host.
- `gpu`: as many per node as its GPUs (CPUs on a CPU cluster) hold disjoint gangs; trials on one node
  share its host, which the record and the report say.
- `none`: `max_concurrent_trials` slots on no node in particular (Ray places each gang where it fits).

Pure logic, no Ray: `SlotBook` hands out slots and keeps, per running trial, the trials that ran
beside it on its node (`co_running`), so it can be tested in simulated time.

    book = SlotBook(plan_slots(nodes, need, "node", 2))
    slot = book.acquire(trial_number)    # None when every slot is busy
    book.release(trial_number)           # -> the trials that shared its node while it ran
    site = book.site(trial_number, lock)  # handed to the trial: placed(node_id), beside()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ISOLATIONS = ("node", "gpu", "none")


@dataclass(frozen=True)
class NodeInfo:
    """A live Ray node as the scheduler sees it."""

    id: str
    host: str
    cpus: float
    gpus: float

    @property
    def name(self) -> str:
        return f"{self.host}/{self.id[:8]}"


@dataclass(frozen=True)
class GangNeed:
    """What the study's largest gang takes of one node."""

    cpus: float
    gpus: float = 0.0


@dataclass(frozen=True)
class Slot:
    """`node` None: unpinned (isolation none, or one trial at a time)."""

    index: int
    node: NodeInfo | None = None

    @property
    def name(self) -> str:
        return f"slot {self.index}" + (f" on {self.node.name}" if self.node else "")


def gangs_per_node(node: NodeInfo, need: GangNeed) -> int:
    """How many disjoint gangs of `need` the node holds (GPUs decide where the gang needs them)."""
    by_cpu = math.floor(node.cpus / need.cpus + 1e-9) if need.cpus > 0 else 1 << 20
    by_gpu = math.floor(node.gpus / need.gpus + 1e-9) if need.gpus > 0 else 1 << 20
    n = min(by_cpu, by_gpu)
    return 0 if n >= 1 << 20 else n  # a gang that needs nothing is not a thing this cluster holds


def plan_slots(nodes: list[NodeInfo], need: GangNeed, isolation: str, max_concurrent: int | str) -> list[Slot]:
    """The slots the study runs on: `max_concurrent` ("auto": every isolated slot there is) of them,
    at most as many as `isolation` allows. One trial at a time runs unpinned, as before this existed."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation {isolation!r}: expected one of {', '.join(ISOLATIONS)}")
    fits = [n for n in nodes if gangs_per_node(n, need) >= 1]
    if isolation == "node":
        places: list[NodeInfo | None] = list(fits)
    elif isolation == "gpu":
        places = [n for n in fits for _ in range(gangs_per_node(n, need))]
    else:
        total = sum(gangs_per_node(n, need) for n in fits)  # never more than the cluster holds at once
        places = [None] * (total if max_concurrent == "auto" else min(int(max_concurrent), total))
    want = len(places) if max_concurrent == "auto" else min(int(max_concurrent), len(places))
    if want <= 1:
        return [Slot(0)] if places else []
    if isolation == "gpu":  # spread over nodes first: node 0 slot, node 1 slot, ..., then second slots
        order: dict[str, int] = {}
        ranked = []
        for n in places:
            ranked.append((order.setdefault(n.id, 0), len(ranked), n))
            order[n.id] += 1
        places = [n for _, _, n in sorted(ranked, key=lambda x: (x[0], x[1]))]
    return [Slot(i, places[i]) for i in range(want)]


@dataclass
class _Running:
    slot: Slot
    node_key: str | None  # the node it runs on (known at acquire for pinned slots, later for others)
    beside: set[int] = field(default_factory=set)


class SlotBook:
    """Free and busy slots, and who ran beside whom on a node."""

    def __init__(self, slots: list[Slot]):
        self.slots = list(slots)
        self.free = list(slots)
        self.running: dict[int, _Running] = {}

    def __len__(self) -> int:
        return len(self.slots)

    def acquire(self, trial: int) -> Slot | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        self.running[trial] = _Running(slot, slot.node.id if slot.node else None)
        if slot.node is not None:
            self._meet(trial)
        return slot

    def placed(self, trial: int, node_id: str) -> None:
        """The node an unpinned trial's gang landed on (from the gang's actors)."""
        r = self.running.get(trial)
        if r is not None and r.node_key != node_id:
            r.node_key = node_id
            self._meet(trial)

    def _meet(self, trial: int) -> None:
        me = self.running[trial]
        for other, r in self.running.items():
            if other != trial and r.node_key is not None and r.node_key == me.node_key:
                me.beside.add(other)
                r.beside.add(trial)

    def release(self, trial: int) -> list[int]:
        """Free the trial's slot (if its node still counts) -> the trials that shared its node."""
        r = self.running.pop(trial)
        if r.slot in self.slots:
            self.free.append(r.slot)
            self.free.sort(key=lambda s: s.index)
        return sorted(r.beside)

    def co_running(self, trial: int) -> list[int]:
        r = self.running.get(trial)
        return sorted(r.beside) if r else []

    def site(self, trial: int, lock, node_alive=lambda node_id: True) -> TrialSite:
        """The running trial's view of the book, safe to use from its own thread. `node_alive(node_id)`
        tells whether a node is still in the cluster (Ray's view; the book itself never asks)."""
        return TrialSite(self, trial, lock, node_alive)

    def lose_node(self, node_id: str) -> list[Slot]:
        """A node died: its slots leave the book (a running trial's slot is not given back)."""
        gone = [s for s in self.slots if s.node is not None and s.node.id == node_id]
        self.slots = [s for s in self.slots if s not in gone]
        self.free = [s for s in self.free if s not in gone]
        return gone


class TrialSite:
    """What a running trial tells the book and asks of it (from the trial's own thread, under the
    book's lock): where its gang landed, who ran beside it on that node, and whether that node is gone."""

    def __init__(self, book: SlotBook, trial: int, lock, node_alive):
        self._book, self._trial, self._lock, self._alive = book, trial, lock, node_alive

    def lost_node(self) -> tuple[str, str] | None:
        """(id, name) of the trial's node if it left the cluster; None while it is there or unknown."""
        with self._lock:
            r = self._book.running.get(self._trial)
            node_id = r.node_key if r else None
            slot_node = r.slot.node if r else None
        if node_id is None or self._alive(node_id):
            return None
        named = slot_node is not None and slot_node.id == node_id and slot_node.name
        return node_id, slot_node.name if named else node_id[:8]  # a node Ray knows no name for: its id

    def placed(self, node_id: str) -> None:
        with self._lock:
            self._book.placed(self._trial, node_id)

    def beside(self) -> list[int]:
        with self._lock:
            return self._book.co_running(self._trial)
