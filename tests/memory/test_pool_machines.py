"""Hypothesis state machines for the device allocator and the host pool.

Every step ends with ``check_integrity()`` and a comparison with a trivially correct shadow
model (a set of held ids).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from replay.memory.allocator import DeviceAllocator
from replay.memory.host_pool import HostPool
from replay.memory.swa_allocator import SWAKVPools

SETTINGS = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class DeviceAllocatorMachine(RuleBasedStateMachine):
    """Random allocs (plain, extend, decode), frees and free groups on one allocator."""

    @initialize(
        ps=st.sampled_from([1, 2, 4]),
        num_pages=st.integers(1, 24),
        mode=st.sampled_from(["prepend", "append", "sorted_merge"]),
    )
    def setup(self, ps, num_pages, mode):
        self.a = DeviceAllocator(num_pages * ps, ps, mode)
        self.ps = ps
        self.held: list[list[int]] = []  # chunks of page ids
        self.rows: list[tuple[int, list[int]]] = []  # (tokens, pages) for extend/decode
        self.pending: set[int] = set()

    def _all_held(self):
        out = [p for c in self.held for p in c] + [p for _, ps in self.rows for p in ps]
        return out

    @rule(n=st.integers(0, 6))
    def alloc_pages(self, n):
        before = self.a.available_pages()
        out = self.a.alloc_pages(n)
        if out is None:
            assert n > before
        else:
            assert len(out) == n
            self.held.append(out.tolist())

    @rule(n=st.integers(1, 20))
    def new_row(self, n):
        pages = self.a.alloc_extend_pages([0], [n])
        if pages is not None:
            assert len(pages[0]) == -(-n // self.ps)
            self.rows.append((n, pages[0]))

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 100), n=st.integers(1, 9))
    def extend_row(self, i, n):
        tokens, pages = self.rows[i % len(self.rows)]
        new = self.a.alloc_extend_pages([tokens], [tokens + n])
        if new is not None:
            pages.extend(new[0])
            self.rows[i % len(self.rows)] = (tokens + n, pages)
            assert len(pages) == -(-(tokens + n) // self.ps)

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 100))
    def decode_row(self, i):
        tokens, pages = self.rows[i % len(self.rows)]
        new = self.a.alloc_decode_pages([tokens + 1])
        if new is not None:
            if new[0] is not None:
                pages.append(new[0])
            self.rows[i % len(self.rows)] = (tokens + 1, pages)
            assert len(pages) == -(-(tokens + 1) // self.ps)

    @precondition(lambda self: self.held or self.rows)
    @rule(i=st.integers(0, 100), by_token=st.booleans())
    def free_one(self, i, by_token):
        if self.held and (i % 2 or not self.rows):
            chunk = self.held.pop(i % len(self.held))
        else:
            chunk = self.rows.pop(i % len(self.rows))[1]
        ids = torch.tensor(chunk, dtype=torch.int64)
        if by_token:
            self.a.free(ids * self.ps)
        else:
            self.a.free_page_ids(ids)
        if self.a.in_free_group:
            self.pending.update(chunk)

    @precondition(lambda self: not self.a.in_free_group)
    @rule()
    def group_begin(self):
        self.a.free_group_begin()

    @precondition(lambda self: self.a.in_free_group)
    @rule()
    def group_end(self):
        self.a.free_group_end()
        self.pending.clear()

    @invariant()
    def consistent(self):
        if not hasattr(self, "a"):
            return
        self.a.check_integrity()
        held = self._all_held()
        assert len(set(held)) == len(held), "a page was handed out twice"
        free = set(self.a.all_free_page_ids().tolist())
        assert not free & set(held)
        assert set(self.a.pending_group_page_ids().tolist()) == self.pending
        assert len(free) + len(held) + len(self.pending) == self.a.num_pages
        assert 0 not in free and 0 not in held


class HostPoolMachine(RuleBasedStateMachine):
    """Random page-multiple allocs and frees; lazy mode never reuses before a merge."""

    @initialize(
        ps=st.sampled_from([1, 4]),
        num_pages=st.integers(1, 20),
        mode=st.sampled_from(["eager_cat", "lazy_merge"]),
    )
    def setup(self, ps, num_pages, mode):
        self.h = HostPool(num_pages * ps, ps, mode)
        self.ps = ps
        self.held: list[torch.Tensor] = []
        self.released: set[int] = set()  # lazily released, not yet merged

    @rule(n=st.integers(0, 6))
    def alloc(self, n):
        merges = self.h.num_merges
        out = self.h.alloc(n * self.ps)
        if out is None:
            assert n * self.ps > self.h.available_tokens()
            return
        if self.h.num_merges == merges:
            assert not set(out.tolist()) & self.released, "released slot reused before merge"
        else:
            self.released.clear()
        self.held.append(out)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        chunk = self.held.pop(i % len(self.held))
        self.h.free(chunk)
        if self.h.host_free == "lazy_merge":
            self.released.update(chunk.tolist())

    @invariant()
    def consistent(self):
        if not hasattr(self, "h"):
            return
        self.h.check_integrity()
        n_held = sum(len(c) for c in self.held)
        assert self.h.available_tokens() + n_held == self.h.capacity_tokens


class SWAPoolsMachine(RuleBasedStateMachine):
    """Lockstep rows; SWA released out of window, then rows freed (full-only below the cursor)."""

    @initialize(
        ps=st.sampled_from([1, 2, 4]),
        full_pages=st.integers(1, 24),
        swa_pages=st.integers(1, 16),
        mode=st.sampled_from(["prepend", "append", "sorted_merge"]),
    )
    def setup(self, ps, full_pages, swa_pages, mode):
        self.p = SWAKVPools(DeviceAllocator(full_pages * ps, ps, mode, "full"),
                            DeviceAllocator(swa_pages * ps, ps, mode, "swa"))
        self.ps = ps
        self.rows: list[list] = []  # [tokens, pages, swa_cursor_pages]
        self.pending_full: set[int] = set()
        self.pending_swa = 0

    @rule(n=st.integers(1, 16))
    def new_row(self, n):
        pages = self.p.alloc_extend_pages([0], [n])
        if pages is None:
            assert -(-n // self.ps) > min(self.p.full.available_pages(), self.p.swa.available_pages())
        else:
            self.rows.append([n, pages[0], 0])

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 99), n=st.integers(0, 9), decode=st.booleans())
    def grow(self, i, n, decode):
        row = self.rows[i % len(self.rows)]
        if decode:
            new = self.p.alloc_decode_pages([row[0] + 1])
            if new is not None:
                row[0] += 1
                if new[0] is not None:
                    row[1].append(new[0])
        else:
            new = self.p.alloc_extend_pages([row[0]], [row[0] + n])
            if new is not None:
                row[0] += n
                row[1].extend(new[0])

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 99), k=st.integers(1, 4))
    def release_window(self, i, k):
        row = self.rows[i % len(self.rows)]
        hi = min(row[2] + k, len(row[1]) - 1)
        if hi > row[2]:
            freed = self.p.free_swa_of(row[1][row[2]:hi])
            assert freed == hi - row[2]
            if self.p.swa.in_free_group:
                self.pending_swa += freed
            row[2] = hi

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 99))
    def free_row(self, i):
        _, pages, cursor = self.rows.pop(i % len(self.rows))
        self.p.free_full_only(pages[:cursor])
        self.p.free_pages_both(pages[cursor:])
        if self.p.full.in_free_group:
            self.pending_full.update(pages)
            self.pending_swa += len(pages) - cursor

    @precondition(lambda self: not self.p.full.in_free_group)
    @rule()
    def group_begin(self):
        self.p.free_group_begin()

    @precondition(lambda self: self.p.full.in_free_group)
    @rule()
    def group_end(self):
        self.p.free_group_end()
        self.pending_full.clear()
        self.pending_swa = 0

    @invariant()
    def consistent(self):
        if not hasattr(self, "p"):
            return
        self.p.check_integrity()
        held = [pg for r in self.rows for pg in r[1]]
        assert len(set(held)) == len(held)
        assert len(held) + len(self.pending_full) + self.p.full.available_pages() == self.p.full.num_pages
        live = [pg for r in self.rows for pg in r[1][r[2]:]]
        peers = self.p.translate(live)
        assert all(peers) and len(set(peers)) == len(peers)
        dead = [pg for r in self.rows for pg in r[1][:r[2]]]
        assert not any(self.p.translate(dead))
        assert len(live) + self.pending_swa + self.p.swa.available_pages() == self.p.swa.num_pages


TestDeviceAllocatorMachine = DeviceAllocatorMachine.TestCase
TestDeviceAllocatorMachine.settings = SETTINGS
TestHostPoolMachine = HostPoolMachine.TestCase
TestHostPoolMachine.settings = SETTINGS
TestSWAPoolsMachine = SWAPoolsMachine.TestCase
TestSWAPoolsMachine.settings = SETTINGS
