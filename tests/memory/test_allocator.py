"""Device allocators: hand-computed free-list orders, paging and free groups."""

from __future__ import annotations

import pytest
import torch

from replay.memory.allocator import DeviceAllocator, PagedAllocator, TokenAllocator
from replay.memory.results import IntegrityError, MemoryModelError


def t(xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_token_allocator_reserves_slot_zero_and_allocates_from_head():
    a = TokenAllocator(8)
    assert a.available_tokens() == 8
    assert a.alloc(3).tolist() == [1, 2, 3]
    assert a.alloc(5).tolist() == [4, 5, 6, 7, 8]
    assert a.alloc(1) is None
    a.check_integrity()


def test_token_allocator_append_frees_to_tail():
    a = TokenAllocator(6)
    a.alloc(4)
    a.free(t([2, 1]))
    assert a.free_pages.tolist() == [5, 6, 2, 1]


def test_paged_allocator_prepend_reuses_freed_pages_first():
    a = PagedAllocator(16, 4)  # pages 1..4
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    a.free_page_ids(t([2]))
    assert a.free_pages.tolist() == [2, 3, 4]
    assert a.alloc_pages(1).tolist() == [2]


def test_paged_free_by_token_uses_unique_sorted_pages():
    a = PagedAllocator(16, 4)
    a.alloc_pages(4)
    a.free(t([13, 9, 14, 10]))  # pages 3 and 2
    assert a.free_pages.tolist() == [2, 3]


def test_alloc_result_is_a_clone_not_a_view():
    a = PagedAllocator(64, 4)
    out = a.alloc_pages(3)
    assert out.untyped_storage().data_ptr() != a.free_pages.untyped_storage().data_ptr()


def test_sorted_merge_stages_and_merges_only_when_short():
    a = DeviceAllocator(16, 4, "sorted_merge")
    a.alloc_pages(4)
    a.free_page_ids(t([3]))
    a.free_page_ids(t([1]))
    assert a.free_pages.tolist() == [] and a.num_staged_pages == 2
    assert a.available_tokens() == 8  # staged pages count as available
    assert a.num_merges == 0
    assert a.alloc_pages(1).tolist() == [1]  # merged and sorted
    assert a.num_merges == 1 and a.free_pages.tolist() == [3]


def test_alloc_extend_fills_partial_last_page_then_new_pages():
    a = PagedAllocator(32, 4)  # pages 1..8
    first = a.alloc_extend([0], [6], [-1])  # 2 new pages: 1, 2
    assert first.tolist() == [4, 5, 6, 7, 8, 9]
    # prefix 6 (last slot 9, page 2 has room for 2), extend to 13: 2 in place + pages 3, 4
    out = a.alloc_extend([6], [13], [9])
    assert out.tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert a.free_pages.tolist() == [5, 6, 7, 8]


def test_alloc_extend_batch_takes_pages_in_request_order():
    a = PagedAllocator(32, 4)
    pages = a.alloc_extend_pages([0, 3, 4], [5, 4, 9])
    assert pages == [[1, 2], [], [3, 4]]


def test_alloc_extend_sorted_merge_bound_triggers_merge_even_if_exact_fits():
    a = DeviceAllocator(32, 4, "sorted_merge")  # 8 pages
    a.alloc_pages(6)
    a.free_page_ids(t([2]))
    # free list [7, 8]; exact need 1 page, bound 4 // 4 + 1 + 1 = 3 > 2 -> merge first
    assert a.alloc_extend_pages([0], [4]) == [[2]]
    assert a.num_merges == 1


def test_alloc_decode_takes_a_page_only_at_page_boundaries():
    a = PagedAllocator(32, 4)
    a.alloc_pages(1)  # page 1
    # seq 5 -> (5-1) % 4 == 0 new page; seq 7 -> in place
    assert a.alloc_decode([5, 7], [7, 9]).tolist() == [8, 10]
    assert a.free_pages.tolist() == [3, 4, 5, 6, 7, 8]


def test_short_allocation_takes_nothing():
    a = PagedAllocator(8, 4)
    assert a.alloc_extend_pages([0], [12]) is None
    assert a.available_pages() == 2


def test_free_group_defers_until_end():
    a = PagedAllocator(16, 4)
    pages = a.alloc_pages(3)
    a.free_group_begin()
    a.free_page_ids(pages[:1])
    a.free(t([8, 9]))  # page 2 by token
    assert a.available_pages() == 1 and a.pending_group_pages() == 2
    a.free_group_end()
    assert a.free_pages.tolist() == [1, 2, 4]  # token frees first (prepended), then page ids
    with pytest.raises(MemoryModelError):
        a.free_group_end()


def test_free_groups_do_not_nest():
    a = PagedAllocator(16, 4)
    a.free_group_begin()
    with pytest.raises(MemoryModelError):
        a.free_group_begin()


def test_check_integrity_catches_double_free_and_reserved_page():
    a = PagedAllocator(16, 4)
    a.alloc_pages(2)
    a.free_page_ids(t([1]))
    a.free_page_ids(t([1]))
    with pytest.raises(IntegrityError, match="double free"):
        a.check_integrity()
    b = PagedAllocator(16, 4)
    b.free_page_ids(t([0]))
    with pytest.raises(IntegrityError):
        b.check_integrity()


def test_unaligned_alloc_is_rejected():
    with pytest.raises(MemoryModelError):
        PagedAllocator(16, 4).alloc(3)
