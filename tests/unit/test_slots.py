"""The isolated slots of a cluster (orchestrator/execution/slots.py): how many each isolation gives,
who ran beside whom, a lost node, and what a trial sees of its slot. The driver's whole rule in
simulated time (500 trials on 32 slots) is tests/unit/test_proposals.py."""

from __future__ import annotations

import threading

import pytest

from orchestrator.execution.slots import GangNeed, NodeInfo, SlotBook, gangs_per_node, plan_slots

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
