"""SWA allocator pair: lockstep paging, mapping, SWA-before-full frees."""

from __future__ import annotations

import pytest

from replay.memory.allocator import PagedAllocator
from replay.memory.results import IntegrityError, MemoryModelError
from replay.memory.swa_allocator import SWAKVPools


def pools(full=32, swa=16, ps=4):
    return SWAKVPools(PagedAllocator(full, ps, name="full"), PagedAllocator(swa, ps, name="swa"))


def test_sizes_report_each_side_and_the_minimum():
    p = pools()
    assert (p.full_available_tokens(), p.swa_available_tokens(), p.available_tokens()) == (32, 16, 16)


def test_extend_allocates_both_sides_in_lockstep_and_maps():
    p = pools()
    full = p.alloc_extend_pages([0], [6])
    assert full == [[1, 2]]
    assert p.translate([1, 2]) == [1, 2]
    assert p.swa.free_pages.tolist() == [3, 4]
    # the partial last page continues on both sides: 2 in place + 1 new page each
    assert p.alloc_extend_pages([6], [10]) == [[3]]
    assert p.translate([3]) == [3]


def test_extend_fails_when_either_side_is_short_and_takes_nothing():
    p = pools(full=32, swa=8)
    assert p.alloc_extend_pages([0], [12]) is None
    assert p.full.available_pages() == 8 and p.swa.available_pages() == 2


def test_decode_pages_both_sides():
    p = pools()
    p.alloc_extend_pages([0], [4])
    assert p.alloc_decode_pages([5]) == [2]
    assert p.translate([2]) == [2]
    assert p.alloc_decode_pages([6]) == [None]


def test_swa_free_reads_and_clears_mapping_before_full_free():
    p = pools()
    p.alloc_extend_pages([0], [8])
    with pytest.raises(MemoryModelError, match="SWA peer"):
        p.free_full_only([1])
    assert p.free_swa_of([1]) == 1
    assert p.translate([1, 2]) == [0, 2]
    p.free_full_only([1])
    p.free_pages_both([2])
    assert p.full.available_pages() == 8 and p.swa.available_pages() == 4
    p.check_integrity()


def test_unmapped_swa_free_is_skipped_and_counted():
    p = pools()
    p.alloc_extend_pages([0], [4])
    p.free_swa_of([1])
    assert p.free_swa_of([1]) == 0
    assert p.num_unmapped_swa_frees == 1
    p.check_integrity()


def test_move_swa_repoints_peers():
    p = pools()
    p.alloc_extend_pages([0], [8])  # full 1,2 -> swa 1,2
    p.full.alloc_pages(2)  # full 3,4 without peers
    assert p.move_swa([1, 2], [3, 4]) == [1, 2]
    assert p.translate([1, 2, 3, 4]) == [0, 0, 1, 2]


def test_free_group_defers_both_sides():
    p = pools()
    p.alloc_extend_pages([0], [8])
    p.free_group_begin()
    p.free_pages_both([1, 2])
    assert p.translate([1, 2]) == [0, 0]  # resolved at enqueue
    assert p.full.available_pages() == 6 and p.swa.available_pages() == 2
    p.free_group_end()
    assert p.full.available_pages() == 8 and p.swa.available_pages() == 4


def test_integrity_catches_a_free_page_that_keeps_a_peer():
    p = pools()
    p.alloc_extend_pages([0], [4])
    p.full.free_page_ids([1])  # bypasses the SWA-first rule
    with pytest.raises(IntegrityError):
        p.check_integrity()
