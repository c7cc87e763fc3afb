"""The isolated slots of a cluster (orchestrator/execution/slots.py): which Ray nodes share a host, how
many slots each isolation gives, who ran beside whom, a lost node, and what a trial sees of its slot. The driver's whole rule in
simulated time (500 trials on 32 slots) is tests/unit/test_proposals.py."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from orchestrator.execution.slots import GangNeed, NodeInfo, Slot, SlotBook, gangs_per_node, group_hosts, hosts_line, plan_slots

NODES = [NodeInfo(f"id{i:02d}" + "x" * 20, f"host{i}", cpus=16.0, gpus=8.0) for i in range(4)]
TP4 = GangNeed(cpus=1.0, gpus=4.0)


def test_node_isolation_gives_one_slot_per_node_that_fits():
    small = NodeInfo("small" + "x" * 20, "hostS", cpus=16.0, gpus=2.0)  # cannot hold a TP 4 gang
    slots = plan_slots([*NODES, small], TP4, "node", "auto")
    assert [s.node.host for s in slots] == ["host0", "host1", "host2", "host3"]
    assert len(plan_slots(NODES, TP4, "node", 2)) == 2
    assert len(plan_slots(NODES, TP4, "node", 9)) == 4  # at most one a node, whatever was asked


def test_gpu_isolation_packs_disjoint_gangs_and_spreads_over_nodes_first():
    assert gangs_per_node(NODES[0], TP4) == 2 and gangs_per_node(NODES[0], GangNeed(cpus=0.25)) == 64
    slots = plan_slots(NODES, TP4, "gpu", "auto")
    assert len(slots) == 8
    assert [s.node.host for s in slots[:4]] == ["host0", "host1", "host2", "host3"]  # a node each before a second on any
    assert [s.node.host for s in plan_slots(NODES, TP4, "gpu", 5)] == ["host0", "host1", "host2", "host3", "host0"]


def test_none_is_unpinned_and_one_at_a_time_runs_as_before():
    slots = plan_slots(NODES, TP4, "none", 3)
    assert len(slots) == 3 and all(s.node is None for s in slots)
    one = plan_slots(NODES, TP4, "node", 1)
    assert len(one) == 1 and one[0].node is None  # unpinned: Ray places it, as a sequential study did
    assert plan_slots([NodeInfo("tiny" + "x" * 20, "h", 0.1, 0)], TP4, "node", "auto") == []
    with pytest.raises(ValueError, match="isolation 'host'"):
        plan_slots(NODES, TP4, "host", 2)


def test_co_running_trials_are_recorded_both_ways_and_a_lost_node_leaves_the_book():
    a, b = NODES[0], NODES[1]
    book = SlotBook(plan_slots([a, b], GangNeed(cpus=1.0, gpus=4.0), "gpu", "auto"))  # a, b, a, b
    assert [book.acquire(n).node.id for n in (0, 1, 2)] == [a.id, b.id, a.id]
    assert book.co_running(0) == [2] and book.co_running(2) == [0] and book.co_running(1) == []
    assert book.release(0) == [2]
    assert book.acquire(3).node.id == a.id and book.co_running(2) == [0, 3]
    gone = book.lose_node(b.id)
    assert len(gone) == 2 and len(book) == 2
    assert book.release(1) == []  # its node is gone: the slot is not handed out again
    assert all(s.node.id == a.id for s in book.free) and len(book.free) == 0
    book.release(2)
    assert [s.node.id for s in book.free] == [a.id]


def test_unpinned_trials_meet_once_placed():
    book = SlotBook(plan_slots(NODES, TP4, "none", 2))
    book.acquire(0), book.acquire(1)
    assert book.co_running(0) == []
    book.placed(0, NODES[2].id), book.placed(1, NODES[2].id)
    assert book.co_running(0) == [1] and book.co_running(1) == [0]


def test_a_neighbour_still_launching_counts_as_beside_a_placed_trial():
    """Trial 0 measures on node 2 while trial 1's gang is still being placed (its host unknown): 0's record
    names 1 (its launch may load 0's host); once 1 lands on another host it no longer does."""
    book = SlotBook(plan_slots(NODES, TP4, "none", 2))
    book.acquire(0), book.acquire(1)
    book.placed(0, NODES[2].id)
    assert book.neighbours(0) == [1] and book.neighbours(1) == [] and book.co_running(0) == []  # 1 is not measuring yet
    assert book.site(0, threading.Lock()).neighbours() == [1]
    book.placed(1, NODES[3].id)
    assert book.neighbours(0) == [] and book.neighbours(1) == []
    book.release(1), book.acquire(2), book.placed(2, NODES[2].id)  # one that lands on 0's host: met, as before
    assert book.neighbours(0) == [2] == book.co_running(0)


def test_a_trial_site_reports_its_node_lost_only_when_the_node_is_gone():
    book = SlotBook(plan_slots(NODES, TP4, "node", 2))
    alive = {NODES[0].id, NODES[1].id}
    site = book.site(0, threading.Lock(), lambda node_id: node_id in alive)
    book.acquire(0)
    assert site.lost_node() is None
    alive.discard(NODES[0].id)
    assert site.lost_node() == (NODES[0].id, NODES[0].name)
    unpinned = SlotBook(plan_slots(NODES, TP4, "none", 2))
    s1 = unpinned.site(1, threading.Lock(), lambda node_id: False)
    unpinned.acquire(1)
    assert s1.lost_node() is None  # not placed yet: nothing to have lost
    unpinned.placed(1, NODES[3].id)
    assert s1.lost_node() == (NODES[3].id, NODES[3].id[:8])


def test_a_lost_node_is_named_by_host_and_id_whatever_ray_still_says_of_it():
    """The name a lost node's failure carries comes from the book, known before the node left: a pinned
    slot's node even where its gang, reused after the node left, is mapped by Ray to no node (its placement
    group waits to be placed again: an empty id); an unpinned trial's node by the host its gang reported
    at placement, or by the cluster's nodes the book was given (the label first). Never an empty name."""
    labelled = replace(NODES[1], host_label="rack-7")
    book = SlotBook(plan_slots([NODES[0], labelled], TP4, "node", 2))
    gone = lambda node_id: False  # noqa: E731 - every node has left
    book.acquire(0), book.acquire(1)
    site = book.site(1, threading.Lock(), gone)
    site.placed("", "")  # Ray maps the gang to no node any more: the slot's node stays the trial's
    assert book.running[1].node_id == labelled.id
    assert site.lost_node() == (labelled.id, f"rack-7/{labelled.id[:8]}") and book.node_name(labelled.id) == labelled.name
    # unpinned: named by what the gang reported at placement, kept after the trial's slot is given back
    unpinned = SlotBook(plan_slots(NODES, TP4, "none", 2))
    unpinned.acquire(0)
    s0 = unpinned.site(0, threading.Lock(), gone)
    s0.placed(NODES[3].id, "host3")
    assert s0.lost_node() == (NODES[3].id, f"host3/{NODES[3].id[:8]}")
    unpinned.release(0)
    assert unpinned.node_name(NODES[3].id) == f"host3/{NODES[3].id[:8]}"
    # the nodes the book was given name it as planned (a label over a hostname the gang may report)
    given = SlotBook(plan_slots(NODES, TP4, "none", 2), [*NODES[:3], labelled])
    given.acquire(0)
    given.site(0, threading.Lock(), gone).placed(labelled.id, "host1")
    assert given.site(0, threading.Lock(), gone).lost_node() == (labelled.id, labelled.name)
    assert given.node_name("unknown" + "x" * 20) == "unknownx"  # nothing known of it but its id (8 characters)


# three raylets of one machine (infra/services.sh's SPECTUNE_RAY_WORKERS=2, or ray.cluster_utils.Cluster):
# one address, one boot id, Ray's hostname for each
ONE_HOST = [NodeInfo(f"raylet{i}" + "x" * 20, "vm", cpus=2.0, gpus=0.0, address="127.0.0.1", boot_id="boot-a") for i in range(3)]
TP1 = GangNeed(cpus=0.1)


def test_ray_nodes_of_one_machine_are_one_host_and_isolation_node_runs_one_trial_there():
    """Nodes sharing an address, or a boot id (containers of one machine, each with an address of its
    own), directly or through another node, are one host; `node` isolation gives one slot per host."""
    assert len({n.host_key for n in group_hosts(ONE_HOST)}) == 1
    assert plan_slots(ONE_HOST, TP1, "node", 2) == [Slot(0)]  # one at a time, unpinned
    assert plan_slots(ONE_HOST, TP1, "node", "auto") == [Slot(0)]
    assert hosts_line(ONE_HOST) == "3 node(s) on 1 host(s)" and hosts_line(ONE_HOST[:1]) == "1 node(s)"
    pods = [NodeInfo(f"pod{i}" + "x" * 20, f"pod-{i}", 2.0, 0.0, address=f"10.0.0.{i}", boot_id="boot-k8s") for i in range(2)]
    other = NodeInfo("other" + "x" * 20, "box2", 2.0, 0.0, address="10.0.1.9", boot_id="boot-2")
    slots = plan_slots([*pods, other], TP1, "node", "auto")
    assert [s.node.id for s in slots] == [pods[0].id, other.id]  # the first node of each host
    # linked through a third node: a shares an address with b, b a boot id with c
    a = NodeInfo("a" * 24, "h", 1.0, 0.0, address="10.0.0.1", boot_id="b1")
    b = NodeInfo("b" * 24, "h", 1.0, 0.0, address="10.0.0.1", boot_id="b2")
    c = NodeInfo("c" * 24, "h", 1.0, 0.0, address="10.0.0.3", boot_id="b2")
    assert len({n.host_key for n in group_hosts([a, b, c])}) == 1
    # a boot id nobody could read links nothing
    unknown = [NodeInfo(f"u{i}" + "x" * 20, "h", 1.0, 0.0, address=f"10.0.2.{i}") for i in range(2)]
    assert len(plan_slots(unknown, TP1, "node", "auto")) == 2


def test_the_host_label_declares_distinct_hosts_whatever_the_address():
    """`spectune.io/host` (a Ray node label given when the node starts): the operator's word on which
    host a node stands for. How a test runs two isolated trials on the raylets of one machine."""
    labelled = [replace(n, host_label=f"test-host-{i}") for i, n in enumerate(ONE_HOST[:2])]
    slots = plan_slots(labelled, TP1, "node", 2)
    assert [s.node.id for s in slots] == [n.id for n in labelled] and slots[1].node.name.startswith("test-host-1/")
    # a labelled node and the unlabelled ones of its machine: two hosts; two nodes of one label: one
    assert len(plan_slots([labelled[0], *ONE_HOST[1:]], TP1, "node", "auto")) == 2
    same = [replace(n, host_label="rack-7") for n in ONE_HOST]
    assert plan_slots(same, TP1, "node", "auto") == [Slot(0)]


def test_trials_on_two_nodes_of_one_host_are_neighbours_and_a_re_measure_must_run_alone():
    """isolation gpu on two raylets of one machine: a slot on each, and trials on them ran beside each
    other (the old rule compared node ids: two nodes, no neighbours)."""
    book = SlotBook(plan_slots(ONE_HOST[:2], GangNeed(cpus=1.0), "gpu", 2), ONE_HOST)
    assert book.hosts_shared  # a race re-measure in this study runs alone
    assert [book.acquire(n).node.id for n in (0, 1)] == [ONE_HOST[0].id, ONE_HOST[1].id]
    assert book.co_running(0) == [1] and book.co_running(1) == [0]
    assert book.disturbed(0) and book.release(0) == [1]
    # isolation node on distinct hosts: nothing shared, nobody beside anybody
    apart = SlotBook(plan_slots(NODES, TP4, "node", 2), NODES)
    assert not apart.hosts_shared
    apart.acquire(0), apart.acquire(1)
    assert apart.co_running(0) == [] and not apart.disturbed(0)


def test_unpinned_trials_meet_by_host_and_one_still_being_placed_may_disturb():
    """isolation none: a trial lands where Ray puts it; two on raylets of one machine are neighbours; while
    another trial's gang is still being placed (and launched) it may be on this host: a prune must wait."""
    book = SlotBook(plan_slots(ONE_HOST, TP1, "none", 2), ONE_HOST)
    assert book.hosts_shared
    book.acquire(0), book.acquire(1)
    book.placed(0, ONE_HOST[0].id)
    assert book.co_running(0) == [] and book.disturbed(0)  # trial 1 not placed yet: maybe here
    book.placed(1, ONE_HOST[2].id)
    assert book.co_running(0) == [1] and book.co_running(1) == [0]
    site = book.site(0, threading.Lock())
    assert site.beside() == [1] and site.disturbed() and site.host_name(ONE_HOST[2].id) == "vm"
    # a node the book was not planned with (joined later): a host of its own
    book.release(1)
    book.acquire(2)
    book.placed(2, "newnode" + "x" * 20)
    assert book.co_running(2) == [] and book.co_running(0) == [1]
