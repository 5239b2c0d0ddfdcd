"""Host pool: eager_cat vs lazy_merge, double alloc/free."""

from __future__ import annotations

import threading

import pytest
import torch

from replay.memory.host_pool import HostPool
from replay.memory.results import MemoryModelError


def test_lazy_released_slots_count_but_are_not_reused_before_merge():
    h = HostPool(16, 4, "lazy_merge")
    a = h.alloc(8)
    assert a.tolist() == list(range(8))
    h.free(a[:4])
    assert h.available_tokens() == 12
    assert h.free_slots.tolist() == list(range(8, 16))  # release list untouched
    assert h.alloc(4).tolist() == [8, 9, 10, 11]  # still from the free list
    assert h.num_merges == 0
    assert h.alloc(8).tolist() == [12, 13, 14, 15, 0, 1, 2, 3]  # merged once (no sort)
    assert h.num_merges == 1
    h.check_integrity()


def test_eager_cat_concatenates_on_every_free():
    h = HostPool(16, 4, "eager_cat")
    a = h.alloc(8)
    h.free(a[4:])
    h.free(a[:4])
    assert h.free_slots.tolist() == list(range(8, 16)) + [4, 5, 6, 7, 0, 1, 2, 3]
    assert h.num_cat_elems == 12 + 16
    h.check_integrity()


def test_alloc_returns_none_when_short_and_requires_page_multiples():
    h = HostPool(8, 4, "lazy_merge")
    assert h.alloc(12) is None
    with pytest.raises(MemoryModelError):
        h.alloc(3)


def test_double_free_and_double_alloc_are_errors():
    h = HostPool(8, 4, "lazy_merge")
    a = h.alloc(4)
    h.free(a)
    with pytest.raises(MemoryModelError, match="double free"):
        h.free(a)
    h.slot_used[4] = True  # corrupt: slot 4 is still on the free list
    with pytest.raises(MemoryModelError, match="double alloc"):
        h.alloc(4)


def test_page_helpers_round_trip():
    h = HostPool(16, 4, "lazy_merge")
    pages = h.alloc_pages(2)
    assert pages == [0, 1]
    assert h.free_pages(pages) == 8
    assert h.available_tokens() == 16


def test_one_reentrant_lock_guards_alloc_and_free():
    h = HostPool(4096, 4, "lazy_merge")
    assert isinstance(h.lock, type(threading.RLock()))
    errors = []

    def worker():
        try:
            for _ in range(100):
                s = h.alloc(8)
                if s is not None:
                    h.free(s)
        except Exception as e:  # pragma: no cover - would be a bug
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    h.check_integrity()
    assert h.available_tokens() == 4096


def test_free_accepts_any_tensor_of_allocated_slots():
    h = HostPool(8, 4, "eager_cat")
    h.alloc(8)
    assert h.free(torch.tensor([4, 5, 6, 7])) == 4
