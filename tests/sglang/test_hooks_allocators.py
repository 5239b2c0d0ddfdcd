"""Device allocator hooks on the real sglang 0.5.23 classes: every free path, free groups,
merges, failures; the pool rows of each pool sum to its live capacity - available."""

from __future__ import annotations

import pytest

from tests.sglang.hooks_fixtures import extend, recording, runtime, used
from tests.sglang.hooks_util import ledger, ledger_mismatches, rows

import tracer.sglang as hooks  # noqa: E402

pytestmark = pytest.mark.sglang

SWA16 = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=1024, swa_pool_tokens=512,
             max_running_requests=4)


def _ops(path, pool):
    return [(r["op"], r["num_slots"]) for r in rows(path, "pool") if r["pool"] == pool]


def test_swa_paged_every_free_path_matches_live_occupancy(tmp_path):
    with recording(tmp_path / "t") as path, runtime(**SWA16) as rt:
        a = rt.allocator
        out = extend(a, [0, 0], [40, 20], [-1, -1])  # 3 + 2 pages on each side
        assert out is not None and used(a) == {"full": 80, "swa": 80}
        hooks.sample()
        r0, r1 = out[:40], out[40:]
        a.free_swa_segment(r0[:32], start_pos=0)  # window slide: SWA side only
        hooks.sample()
        a.free_full_segment(r0[:32], start_pos=0)  # the full side of the same range
        a.free_segments([(r0[32:], 32)])  # the rest of request 0, both sides (base-class path)
        hooks.sample()
        a.free_swa(r1)  # set-shaped SWA free (expands to pages, clears the mapping)
        a.full_attn_allocator.free_page_ids(r1[::16] // 16)  # the page-id path of the leaf
        hooks.sample()
        assert used(a) == {"full": 0, "swa": 0}
        final = used(a)
    assert ledger(path) == final
    assert _ops(path, "full") == [("alloc", 80), ("free", 32), ("free", 16), ("free", 32)]
    # every path above is a distinct sglang method: free_swa_segment, free_full_segment,
    # free_segments (base class), free_swa, free_page_ids
    assert _ops(path, "swa") == [("alloc", 80), ("free", 32), ("free", 16), ("free", 32)]
    n, bad = ledger_mismatches(path)
    assert n == 8 and not bad, bad


def test_free_group_release_is_recorded_at_group_end_with_markers(tmp_path):
    with recording(tmp_path / "t") as path, runtime(**SWA16) as rt:
        a = rt.allocator
        out = extend(a, [0], [64], [-1])
        a.free_group_begin()
        a.free_swa_segment(out[:32], start_pos=0)  # deferred by the composite
        a.free_segment(out[32:], start_pos=32)  # deferred on both sides
        hooks.sample()  # mid-group: nothing released yet
        mid = used(a)
        a.free_group_end()
        hooks.sample()
        a.free_group_begin()
        a.free_group_end()  # an empty group leaves no rows
        final = used(a)
    assert mid == {"full": 64, "swa": 64} and final == {"full": 32, "swa": 0}
    assert ledger(path) == final
    full = _ops(path, "full")
    swa = _ops(path, "swa")
    assert full == [("alloc", 64), ("free_group_begin", 0), ("free", 32), ("free_group_end", 0)]
    assert swa == [("alloc", 64), ("free_group_begin", 0), ("free", 64), ("free_group_end", 0)]
    n, bad = ledger_mismatches(path)
    assert n == 4 and not bad, bad


def test_token_allocator_free_swa_and_alloc_failure(tmp_path):
    with recording(tmp_path / "t") as path, runtime(page_size=1, sliding_window_tokens=8,
                                                      full_pool_tokens=256, swa_pool_tokens=64,
                                                      max_running_requests=4) as rt:
        a = rt.allocator
        x = a.alloc(40)
        assert a.alloc(100) is None  # the SWA side (64) is too short: fails before any leaf
        assert a.full_attn_allocator.alloc(1000) is None  # a leaf failure is an alloc_fail row
        a.free_swa(x[:20])
        hooks.sample()
        a.free(x[20:])
        hooks.sample()
        final = used(a)
    assert final == {"full": 20, "swa": 0} and ledger(path) == final
    assert ("alloc_fail", 1000) in _ops(path, "full")
    assert _ops(path, "swa") == [("alloc", 40), ("free", 20), ("free", 20)]
    assert not ledger_mismatches(path)[1]


def test_sorted_free_list_merge_is_a_marker_with_cost(tmp_path):
    sizes = dict(SWA16, swa_pool_tokens=1024)
    with recording(tmp_path / "t") as path, runtime(**sizes, device_free="sorted_merge") as rt:
        a = rt.allocator
        out = extend(a, [0], [1008], [-1])  # 63 of 64 pages
        a.free_segment(out, start_pos=0)  # staged, not merged: still available
        extend(a, [0], [512], [-1])  # the free list is short: merge + sort, then allocate
        final = used(a)
    merges = [r for r in rows(path, "pool") if r["op"] == "merge"]
    assert {r["pool"] for r in merges} == {"full", "swa"}
    assert all(r["num_slots"] == 1008 and r["dur_ns"] > 0 for r in merges)
    assert ledger(path) == final == {"full": 512, "swa": 512}


def test_req_to_token_rows_and_pages_detail(tmp_path):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    with recording(tmp_path / "t", detail="pages") as path, runtime(**SWA16) as rt:
        reqs = [Req(f"r{i}", "", [1, 2, 3], SamplingParams(max_new_tokens=4)) for i in range(2)]
        rt.req_to_token_pool.alloc(reqs)
        out = extend(rt.allocator, [0], [32], [-1])
        rt.allocator.free_segment(out, start_pos=0)
        rt.req_to_token_pool.free(reqs[0])
    ops = _ops(path, "req_to_token")
    assert ops == [("alloc", 2), ("free", 1)]
    full = [r for r in rows(path, "pool") if r["pool"] == "full"]
    assert [r["op"] for r in full] == ["alloc", "free"]
    assert sorted(full[0]["page_ids"]) == sorted(full[1]["page_ids"]) == [1, 2]
    assert hooks.failures == {}


@pytest.mark.parametrize("detail", ["counts", "pages"])
def test_decode_allocation_is_measured_around_prepare_for_decode(tmp_path, detail):
    """alloc_decode is not wrapped: the prepare_for_decode hook writes one alloc row per pool
    for what the rows written inside it (here a free, as an eviction would) do not explain."""
    import types

    from tests.sglang.hooks_fixtures import torch_ints
    from tracer.sglang.hooks.allocator_decode import measure_decode

    with recording(tmp_path / "t", detail=detail) as path, runtime(**SWA16) as rt:
        a = rt.allocator
        out = extend(a, [0] * 4, [16, 32, 20, 16], [-1] * 4)  # 1 + 2 + 2 + 1 pages each side
        batch = types.SimpleNamespace(token_to_kv_pool_allocator=a, out_cache_loc=None)
        last = torch_ints([int(out[15]), int(out[47]), int(out[67])])

        def prepare(b):  # a free inside (as an eviction would), then the decode step
            a.free_segment(out[68:], start_pos=0)  # request 3
            seq = torch_ints([17, 33, 21])  # 17 and 33 start a page, 21 does not
            b.out_cache_loc = a.alloc_decode(seq, seq, last)

        hooks.sample()
        measure_decode(batch, prepare)
        hooks.sample()
        final = used(a)
        loc = batch.out_cache_loc
        new_full = sorted(int(x) // 16 for x in loc if int(x) % 16 == 0)
        swa_loc = a.translate_loc_from_full_to_swa(loc)
        new_swa = sorted(int(x) // 16 for x in swa_loc if int(x) % 16 == 0)
    assert final == {"full": 96 - 16 + 32, "swa": 96 - 16 + 32}
    assert _ops(path, "full") == [("alloc", 96), ("free", 16), ("alloc", 32)]
    assert _ops(path, "swa") == [("alloc", 96), ("free", 16), ("alloc", 32)]
    n, bad = ledger_mismatches(path)
    assert n == 4 and not bad, bad
    if detail == "pages":
        for pool, want in (("full", new_full), ("swa", new_swa)):
            last_row = [r for r in rows(path, "pool") if r["pool"] == pool][-1]
            assert len(want) == 2 and sorted(last_row["page_ids"]) == want
    assert hooks.failures == {}
