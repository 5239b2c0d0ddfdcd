"""HiCache details restated from sglang 0.5.23 (docs/fidelity.md, known divergences 1 and 2):
the host SWA reclaim demand, one SWA transfer per backup (all or nothing with its FULL copy),
and write-through backups pending until the next step's acknowledgement."""

from __future__ import annotations

import pytest

from .conftest import seq
from .test_model import run_prefill


def swa_hi(make_model, **kw):
    kw.setdefault("page_size", 2)
    kw.setdefault("full_pool_tokens", 64)
    kw.setdefault("sliding_window_tokens", 4)
    kw.setdefault("swa_pool_tokens", 64)
    kw.setdefault("host_pool_tokens", 64)
    return make_model(**kw)


def test_swa_host_reclaim_asks_for_the_whole_allocation(make_model):
    # HostPoolGroup.alloc hands the reclaim callback the whole request, not the shortfall
    model = swa_hi(make_model, swa_host_pool_tokens=6)
    for rid, tag in (("a", 1), ("a2", 4)):
        run_prefill(model, rid, seq(tag, 1), 2)
        model.release(rid)
    assert model.snapshot()["host_swa"].available == 2
    model.evict(full_tokens=4)  # both demoted: host leaves in the host SWA LRU
    run_prefill(model, "b", seq(2, 2), 4)
    model.release("b")  # one 4-token SWA transfer; 2 free: the reclaim asks for 4, both leaves go
    assert {n.key[0] for n in model.tree._walk()} == {seq(2, 2)[0]}
    snap = model.snapshot()
    assert (snap["host_swa"].evictable, snap["host_swa"].available) == (4, 2)


def test_backup_without_swa_host_room_backs_up_nothing(make_model):
    # the FULL host pages of a backup whose SWA transfer cannot be allocated go back
    model = swa_hi(make_model, swa_host_pool_tokens=2)
    run_prefill(model, "r", seq(1, 2), 4)
    model.release("r")
    snap = model.snapshot()
    assert (snap["host_full"].evictable, snap["host_full"].available) == (0, 64)
    assert all(n.full_host is None for n in model.tree._walk())


@pytest.mark.parametrize("ack", ["immediate", "next_step"])
def test_write_through_holds_its_node_until_acknowledged(make_model, ack):
    model = make_model(page_size=2, full_pool_tokens=64, host_pool_tokens=64, hicache_write_ack=ack)
    run_prefill(model, "r", seq(1, 4), 8)
    model.release("r")
    pending = ack == "next_step"
    snap = model.snapshot()["full"]
    assert (snap.protected, snap.evictable) == ((8, 0) if pending else (0, 8))
    assert model.evict(full_tokens=8).full_tokens == (0 if pending else 8)
    assert model.ack_write_through() == (1 if pending else 0)
    if pending:
        snap = model.snapshot()["full"]
        assert (snap.protected, snap.evictable) == (0, 8)
        assert model.evict(full_tokens=8).full_tokens == 8


def test_pending_write_through_locks_the_swa_window_and_survives_a_split(make_model):
    model = swa_hi(make_model, hicache_write_ack="next_step")
    a = seq(1, 2)
    run_prefill(model, "r1", a, 4)
    model.release("r1")  # one leaf of 4 tokens (the window), backed up and pending
    assert model.snapshot()["swa"].protected == 4
    run_prefill(model, "r2", a[:1] + seq(2, 1), 4)  # splits the pending leaf
    model.release("r2")
    split = [n for n in model.tree._walk() if n.key[0] == a[0]]
    assert len(split) == 1 and split[0].wt_pending is not None and split[0].children
    model.ack_write_through()
    assert all(n.wt_pending is None for n in model.tree._walk())
    snap = model.snapshot()
    assert (snap["full"].protected, snap["swa"].protected) == (0, 0)


def test_swa_window_walk_stops_at_a_pending_node(make_model):
    # SGLang ``_collect_unbacked_swa_nodes_in_window``: an ancestor whose write-through is still
    # in flight ends the walk
    model = swa_hi(make_model, sliding_window_tokens=8, hicache_write_policy="write_through_selective",
                   hicache_write_ack="next_step")
    run_prefill(model, "r1", seq(1, 2), 4)
    model.release("r1")  # first hit: not backed up
    node = next(iter(model.tree.root.children.values()))
    run_prefill(model, "r2", seq(1, 2) + seq(2, 1), 6)
    model.release("r2")  # second hit on the first node: backed up, pending
    child = next(iter(node.children.values()))
    assert node.wt_pending is not None and child.full_host is None
    tree = model.tree
    node.swa_host, saved = None, node.swa_host  # as if its SWA copy had not been made
    try:
        stops = tree._swa_window_unbacked(child)
        node.wt_pending, pending = None, node.wt_pending
        walks = tree._swa_window_unbacked(child)
        node.wt_pending = pending
    finally:
        node.swa_host = saved
    assert node not in stops and node in walks
    model.ack_write_through()
