"""Lazily mapped extend runs (``SWAKVPools``' pending runs) against pools that map every page at
once: driven by the same operations, both must hand out and take back the same pages in the
same order, count the same unmapped frees and show the same mapping to every reader."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from replay.memory.allocator import PagedAllocator
from replay.memory.swa_allocator import PENDING_RUN_PAGES, SWAKVPools


def _pools(num_pages: int, ps: int, run_pages: int) -> SWAKVPools:
    pools = SWAKVPools(PagedAllocator(num_pages * ps, ps), PagedAllocator(num_pages * ps, ps, name="swa"))
    pools.pending_run_pages = run_pages
    return pools


class PendingRunsMachine(RuleBasedStateMachine):
    """Requests grow (extend, decode), release SWA below a cursor (sometimes past pages already
    released: unmapped frees) and finish, on a lazy pair and an eager pair side by side."""

    @initialize(ps=st.sampled_from([1, 4]), num_pages=st.integers(8, 48), run_pages=st.integers(1, 6))
    def setup(self, ps, num_pages, run_pages):
        self.ps = ps
        self.lazy = _pools(num_pages, ps, run_pages)
        self.eager = _pools(num_pages, ps, 1 << 30)
        self.rows: list[list] = []  # [tokens, pages, swa cursor (pages)]

    def _both(self, fn):
        a, b = fn(self.lazy), fn(self.eager)
        assert a == b
        return a

    @rule(pages=st.lists(st.integers(1, 12), min_size=1, max_size=3))
    def extend(self, pages):
        ps = self.ps
        new_rows = [[0, [], 0] for _ in pages]
        got = self._both(lambda p: p.alloc_extend_pages([0] * len(pages), [n * ps for n in pages]))
        if got is not None:
            for row, n, new in zip(new_rows, pages, got):
                row[0], row[1] = n * ps, list(new)
            self.rows.extend(new_rows)

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1 << 16), n=st.integers(1, 10))
    def grow(self, i, n):
        row = self.rows[i % len(self.rows)]
        ps = self.ps
        full_pages = -(-row[0] // ps)
        got = self._both(lambda p: p.alloc_extend_pages([full_pages * ps], [(full_pages + n) * ps]))
        if got is not None:
            row[0] = (full_pages + n) * ps
            row[1].extend(got[0])

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1 << 16))
    def decode(self, i):
        row = self.rows[i % len(self.rows)]
        got = self._both(lambda p: p.alloc_decode_pages([row[0] + 1]))
        if got is not None:
            row[0] += 1
            if got[0] is not None:
                row[1].append(got[0])

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1 << 16), upto=st.integers(0, 64), back=st.integers(0, 3))
    def release_out_of_window(self, i, upto, back):
        row = self.rows[i % len(self.rows)]
        lo = max(0, row[2] - back)  # ``back`` > 0: pages already released (unmapped frees)
        hi = min(len(row[1]), lo + upto)
        self._both(lambda p: p.free_swa_chunks([row[1][lo:hi]]))
        row[2] = max(row[2], hi)

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1 << 16))
    def finish(self, i):
        row = self.rows.pop(i % len(self.rows))
        dead, live = row[1][:row[2]], row[1][row[2]:]

        def free(p):
            p.free_swa_chunks([live])
            p.free_full_chunks([dead, live])

        self._both(free)

    @precondition(lambda self: self.rows)
    @rule(i=st.integers(0, 1 << 16))
    def translate(self, i):
        row = self.rows[i % len(self.rows)]
        self._both(lambda p: p.translate(row[1]))

    @invariant()
    def same_pools(self):
        if not hasattr(self, "lazy"):
            return
        for a, b in ((self.lazy.full, self.eager.full), (self.lazy.swa, self.eager.swa)):
            assert a._rev == b._rev
        assert self.lazy.num_unmapped_swa_frees == self.eager.num_unmapped_swa_frees

    def teardown(self):
        if hasattr(self, "lazy"):
            assert self.lazy.mapping == self.eager.mapping
            self.lazy.check_integrity()
            self.eager.check_integrity()


PendingRunsMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow])
TestPendingRuns = PendingRunsMachine.TestCase


def test_a_chunk_takes_a_runs_leading_pages_by_slicing():
    """The chunked-prefill pattern: a run left pending, then its leading pages' SWA released
    behind the last window's mapped pages; the rest of the run stays pending, and the mapping
    reads as if written at once."""
    lazy, eager = _pools(64, 4, PENDING_RUN_PAGES), _pools(64, 4, 1 << 30)
    rows = []
    for p in (lazy, eager):
        first = p.alloc_extend_pages([0], [8 * 4])[0]  # short: mapped at once
        run = p.alloc_extend_pages([8 * 4], [(8 + 40) * 4])[0]
        rows.append(first + run)
    assert len(lazy._pending) == 1 and not eager._pending
    freed = [p.free_swa_chunks([row[4:44]]) for p, row in zip((lazy, eager), rows)]
    assert freed == [40, 40]
    assert lazy._pending and len(lazy._pending[0][0]) == 48 - 44  # the run's last pages
    assert lazy.swa._rev == eager.swa._rev
    assert lazy.num_unmapped_swa_frees == eager.num_unmapped_swa_frees == 0
    assert lazy.translate(rows[0]) == eager.translate(rows[1])
    assert not lazy._pending  # a reader wrote the rest


def test_a_chunk_inside_a_run_is_read_after_the_runs_are_written():
    """A chunk that starts inside a pending run (not at its head) finds 0 there, writes the
    runs and reads again: nothing counted unmapped."""
    pools = _pools(64, 1, 4)
    run = pools.alloc_extend_pages([0], [10])[0]
    assert pools._pending
    assert pools.free_swa_chunks([run[3:9]]) == 6
    assert pools.num_unmapped_swa_frees == 0 and not pools._pending
    assert [s for s in pools.translate(run)] [3:9] == [0] * 6
