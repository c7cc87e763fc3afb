"""Where concurrent trials may run: the isolated slots of a Ray cluster, which Ray nodes share a host,
and which trials ran beside each other on one.

A host is a machine: its CPUs, memory bandwidth, PCIe root complex and NVLink switch are shared by
every Ray node started on it. Ray nodes are on one host when (`group_hosts`):

- they report the same address (several raylets of one machine: `infra/services.sh`'s
  `SPECTUNE_RAY_WORKERS`, `ray.cluster_utils.Cluster`);
- or the same boot identity (the kernel's `/proc/sys/kernel/random/boot_id`, read on each node by
  `cluster.cluster_nodes`: containers of one machine with addresses of their own share it);
- or both through other nodes (one shares its address with a second, whose boot id a third has);
- except that a node started with the Ray label `spectune.io/host=<name>` (`ray start --labels`,
  `Cluster.add_node(labels=...)`) is on host <name>, whatever its address or boot id: the cluster
  operator's word, which is how a test makes the raylets of one machine stand for distinct hosts.
  Nothing else (no environment variable) changes which nodes share a host.

A slot is a place one trial's gang runs at a time. `study.isolation` decides how many a cluster offers:

- `node` (default): one per host, on a node of it that can hold the study's largest gang. No two
  measurements then share a host; a cluster whose nodes all share one host runs one trial at a time.
- `gpu`: as many per node as its GPUs (CPUs on a CPU cluster) hold disjoint gangs, spread over hosts
  first, then over a host's nodes; trials on one host share it, which the record and the report say.
- `none`: `max_concurrent_trials` slots on no node in particular (Ray places each gang where it fits).

Pure logic, no Ray: `SlotBook` hands out slots and keeps, per running trial, the trials that ran
beside it on its host (`co_running`), so it can be tested in simulated time.

    nodes = group_hosts(nodes)           # NodeInfo.host_key set: one key per host
    book = SlotBook(plan_slots(nodes, need, "node", 2), nodes)
    slot = book.acquire(trial_number)    # None when every slot is busy
    book.release(trial_number)           # -> the trials that shared its host while it ran
    site = book.site(trial_number, lock)  # handed to the trial: placed(node_id, host), lost_node(), beside(), disturbed()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

ISOLATIONS = ("node", "gpu", "none")
HOST_LABEL = "spectune.io/host"  # a Ray node label: the host the node stands for (see the module's rules)


@dataclass(frozen=True)
class NodeInfo:
    """A live Ray node as the scheduler sees it. `host`: its hostname as Ray reports it; `address`: its
    IP address; `boot_id`: its kernel's boot identity (None: not read); `host_label`: its
    `spectune.io/host` label (None: none); `host_key`: the host it shares with other nodes, set by
    `group_hosts` ("" until then)."""

    id: str
    host: str
    cpus: float
    gpus: float
    address: str = ""
    boot_id: str | None = None
    host_label: str | None = None
    host_key: str = ""

    @property
    def name(self) -> str:
        return f"{self.host_name}/{self.id[:8]}"

    @property
    def host_name(self) -> str:
        """The host in words: its label where it has one, else its hostname."""
        return self.host_label or self.host


def group_hosts(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """The nodes with `host_key` set: nodes on one host share one key. A labelled node's host is its
    label; the other nodes are on one host when they are linked by a shared address or a shared boot
    id, directly or through other nodes (a node sharing its address with one and its boot id with
    another puts all three on one host)."""
    parent = {n.id: n.id for n in nodes}

    def root(i: str) -> str:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], str] = {}  # ("address" | "boot", value) -> the first node that has it
    for n in nodes:
        if n.host_label:
            continue
        for key in (("address", n.address), ("boot", n.boot_id or "")):
            if not key[1]:
                continue
            other = first.setdefault(key, n.id)
            parent[root(n.id)] = root(other)
    members: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        if not n.host_label:
            members.setdefault(root(n.id), []).append(n)
    key_of = {r: "host:" + min(m.address or m.id for m in group) for r, group in members.items()}
    return [replace(n, host_key=f"label:{n.host_label}" if n.host_label else key_of[root(n.id)]) for n in nodes]


def hosts_line(nodes: list[NodeInfo]) -> str:
    """The cluster in words: "3 node(s) on 1 host(s)" where nodes share hosts, else "2 node(s)"."""
    hosts = {n.host_key for n in group_hosts(nodes)}
    return f"{len(nodes)} node(s) on {len(hosts)} host(s)" if len(hosts) < len(nodes) else f"{len(nodes)} node(s)"


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
    at most as many as `isolation` allows. One trial at a time runs unpinned, as before this existed.
    Slot nodes carry their `host_key`."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation {isolation!r}: expected one of {', '.join(ISOLATIONS)}")
    fits = [n for n in group_hosts(nodes) if gangs_per_node(n, need) >= 1]
    if isolation == "node":  # one slot per host, on the first of its nodes that holds the gang
        places: list[NodeInfo | None] = []
        for n in fits:
            if all(p.host_key != n.host_key for p in places):
                places.append(n)
    elif isolation == "gpu":
        places = _spread([n for n in fits for _ in range(gangs_per_node(n, need))])
    else:
        total = sum(gangs_per_node(n, need) for n in fits)  # never more than the cluster holds at once
        places = [None] * (total if max_concurrent == "auto" else min(int(max_concurrent), total))
    want = len(places) if max_concurrent == "auto" else min(int(max_concurrent), len(places))
    if want <= 1:
        return [Slot(0)] if places else []
    return [Slot(i, places[i]) for i in range(want)]


def _spread(places: list[NodeInfo]) -> list[NodeInfo]:
    """isolation gpu's order of slots: a slot on each host before a second on any, and within a host a
    slot on each of its nodes before a second on any (fewer trials share each host, and each node)."""
    nodes: dict[str, dict[str, list[NodeInfo]]] = {}  # host -> node -> its slots, in the order given
    for n in places:
        nodes.setdefault(n.host_key, {}).setdefault(n.id, []).append(n)
    ranked = []
    for h, per_node in enumerate(nodes.values()):
        lists = list(per_node.values())
        round_robin = [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]
        ranked += [(rank, h, n) for rank, n in enumerate(round_robin)]
    return [n for _, _, n in sorted(ranked, key=lambda x: (x[0], x[1]))]


@dataclass
class _Running:
    slot: Slot
    node_id: str | None  # the node it runs on (known at acquire for pinned slots, once placed for others)
    host: str | None  # that node's host key
    beside: set[int] = field(default_factory=set)


class SlotBook:
    """Free and busy slots, and who ran beside whom on a host. `nodes`: the cluster's nodes (where an
    unpinned trial may land); a node it does not know is a host of its own."""

    def __init__(self, slots: list[Slot], nodes: list[NodeInfo] = ()):
        self.slots = list(slots)
        self.free = list(slots)
        self.running: dict[int, _Running] = {}
        pinned = [s.node for s in slots if s.node is not None]
        # slot nodes come from plan_slots with their host keys; `nodes` are grouped here (the same rule)
        self._host = {n.id: n.host_key for n in pinned if n.host_key} | {n.id: n.host_key for n in group_hosts(list(nodes))}
        self._host_name = {n.id: n.host_name for n in [*pinned, *nodes]}

    def __len__(self) -> int:
        return len(self.slots)

    def host_of(self, node_id: str) -> str:
        return self._host.get(node_id, node_id)

    def node_name(self, node_id: str) -> str:
        """A node in words, "<host>/<id8>" as `NodeInfo.name` (its host as planned, else as its trial's gang
        reported it at placement), whether or not it is still in the cluster; its id alone where no host is known."""
        host = self._host_name.get(node_id)
        return f"{host}/{node_id[:8]}" if host else node_id[:8]

    @property
    def hosts_shared(self) -> bool:
        """Two of the slots may run on one host: unpinned slots (isolation none) or two pinned slots on
        one host (isolation gpu). A measurement there is alone only if nothing else runs beside it."""
        pinned = [self.host_of(s.node.id) for s in self.slots if s.node is not None]
        return len(self.slots) > 1 and (len(pinned) < len(self.slots) or len(set(pinned)) < len(pinned))

    def acquire(self, trial: int) -> Slot | None:
        if not self.free:
            return None
        slot = self.free.pop(0)
        node_id = slot.node.id if slot.node else None
        self.running[trial] = _Running(slot, node_id, self.host_of(node_id) if node_id else None)
        if node_id is not None:
            self._meet(trial)
        return slot

    def placed(self, trial: int, node_id: str, host: str | None = None) -> None:
        """The node a trial's gang landed on (from the gang's actors; a pinned slot's, confirmed); `host`: its host in words
        (`NodeInfo.host_name`), kept for naming a node the book was not given (`node_name`)."""
        if host and node_id not in self._host_name:
            self._host_name[node_id] = host
        r = self.running.get(trial)
        if r is not None and r.node_id != node_id:
            r.node_id, r.host = node_id, self.host_of(node_id)
            self._meet(trial)

    def _meet(self, trial: int) -> None:
        # trials on one host disturb each other's timings (CPUs, memory bandwidth, PCIe, NVLink): each
        # is recorded beside the other, whichever Ray node of the host each runs on
        me = self.running[trial]
        for other, r in self.running.items():
            if other != trial and r.host is not None and r.host == me.host:
                me.beside.add(other)
                r.beside.add(trial)

    def release(self, trial: int) -> list[int]:
        """Free the trial's slot (if its node still counts) -> the trials that shared its host."""
        r = self.running.pop(trial)
        if r.slot in self.slots:
            self.free.append(r.slot)
            self.free.sort(key=lambda s: s.index)
        return sorted(r.beside)

    def co_running(self, trial: int) -> list[int]:
        """The trials that met this one on its host (both placed there)."""
        r = self.running.get(trial)
        return sorted(r.beside) if r else []

    def neighbours(self, trial: int) -> list[int]:
        """What a trial's record names as run beside it: those it met on its host and, once it is placed,
        those running whose host is not known yet: a gang still being placed and launched (actors starting,
        weights loading: CPU-heavy) may be on this host, and may land there only after this trial ends."""
        r = self.running.get(trial)
        if r is None:
            return []
        return sorted(r.beside | (self._unplaced(trial) if r.host is not None else set()))

    def _unplaced(self, trial: int) -> set[int]:
        """The other running trials whose gang is still being placed (host unknown: maybe this one's)."""
        return {n for n, o in self.running.items() if n != trial and o.host is None}

    def disturbed(self, trial: int) -> bool:
        """Whether the trial's measurement so far may include another trial's load: one ran beside it on
        its host, or one is running whose host is not known yet (an unpinned gang still being placed
        and launched, which may be on this host)."""
        r = self.running.get(trial)
        if r is None:
            return False
        return bool(r.beside or self._unplaced(trial))

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
    book's lock): where its gang landed, who ran beside it on that host, whether its measurement may be
    disturbed, and whether its node is gone."""

    def __init__(self, book: SlotBook, trial: int, lock, node_alive):
        self._book, self._trial, self._lock, self._alive = book, trial, lock, node_alive

    def lost_node(self) -> tuple[str, str] | None:
        """(id, name) of the trial's node if it left the cluster; None while it is there or unknown. The
        name is the book's (`SlotBook.node_name`): known before the node left, so never empty after."""
        with self._lock:
            r = self._book.running.get(self._trial)
            node_id = r.node_id if r else None
        if not node_id or self._alive(node_id):
            return None
        with self._lock:
            return node_id, self._book.node_name(node_id)

    def placed(self, node_id: str, host: str | None = None) -> None:
        """Where the trial's gang is (`SlotBook.placed`); an empty id (Ray mapped the gang to no node) changes nothing."""
        if not node_id:
            return
        with self._lock:
            self._book.placed(self._trial, node_id, host)

    def host_name(self, node_id: str) -> str | None:
        """The host of a node in words (its label, else its hostname); None for a node the book does not know."""
        with self._lock:
            return self._book._host_name.get(node_id)

    def beside(self) -> list[int]:
        with self._lock:
            return self._book.co_running(self._trial)

    def neighbours(self) -> list[int]:
        """The trials its record names as run beside it (SlotBook.neighbours)."""
        with self._lock:
            return self._book.neighbours(self._trial)

    def disturbed(self) -> bool:
        with self._lock:
            return self._book.disturbed(self._trial)
