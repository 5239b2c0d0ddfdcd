"""The listed patches of replay.backends.sglang.patches: each changes one decision, then undoes."""

from __future__ import annotations

import dataclasses
import os
from array import array

import pytest

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

from replay.backends.sglang import SglangBackend, SglangSettings  # noqa: E402
from replay.backends.sglang.patches import PATCHES  # noqa: E402
from tests.sglang.backend_util import blocks, req, workload  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture(autouse=True)
def _sglang():
    """Make ``import sglang`` work on CPU (fails, never skips, without sglang)."""
    from replay.backends.sglang.env import bootstrap

    bootstrap()

BASE = SglangSettings(page_size=16, sliding_window_tokens=32, full_pool_tokens=4096, swa_pool_tokens=1024,
                      chunked_prefill_size=1024, max_running_requests=8)


def test_patch_table_lists_every_policy_setting():
    assert {(p.setting, p.value) for p in PATCHES} == {
        ("swa_lru_refresh", "full_ancestry"), ("host_free", "eager_cat"),
        ("swa_admission", "all_or_nothing"), ("swa_admission", "shrink_always"),
        ("swa_release_boundary", "window_plus_page_cut_to_window")}


# ---------------------------------------------------------------- release boundary (#29860)
class _WindowLag:
    """Tokens of live SWA kept below the decode position of request 0, per decode step."""

    def __init__(self):
        self.lags = []

    def on_arrival(self, *a):
        pass

    def on_finish(self, *a):
        pass

    def on_step(self, step, backend):
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        for r in backend.running.reqs:
            cursor = r.kv.get_evicted_seqlen(ComponentType.SWA)
            if r.rid == "0" and not r.finished() and cursor > r.kv.cache_protected_len:
                # the step freed at pre_len = seqlen - 1 before its token was appended
                self.lags.append(r.seqlen - 2 - cursor)


@pytest.mark.parametrize("boundary,lo,hi", [("max_window_page", 16, 31),
                                            ("window_plus_page_cut_to_window", 8, 23)])
def test_release_boundary(tmp_path, boundary, lo, hi):
    """Page 16 > window 8: the fix keeps ceil_page(max(W, ps)) = 16 tokens, the old rule only W."""
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.unified_cache.components import swa

    before = (common.free_swa_out_of_window_slots, swa.free_swa_out_of_window_slots)
    rows = [req(0, 0, blocks("b", 16), out=200, max_new=200),
            req(1, 3000, blocks("b", 16) + blocks("c", 24), out=8)]
    s = dataclasses.replace(BASE, sliding_window_tokens=8, swa_eviction_interval_tokens=1,
                            swa_release_boundary=boundary)
    lag = _WindowLag()
    with SglangBackend(workload(tmp_path, rows), s, observer=lag, check_integrity_every=1) as be:
        patched = common.free_swa_out_of_window_slots is not before[0]
        assert patched == (boundary != "max_window_page")
        result = be.run()
    assert (common.free_swa_out_of_window_slots, swa.free_swa_out_of_window_slots) == before
    assert result.num_finished == 2
    assert lag.lags and lo <= min(lag.lags) and max(lag.lags) <= hi
    assert min(lag.lags) == lo  # the boundary is reached


# ---------------------------------------------------------------- host free (#30658)
@pytest.mark.parametrize("host_free", ["lazy_merge", "eager_cat"])
def test_host_free(tmp_path, host_free):
    s = dataclasses.replace(BASE, host_pool_tokens=8192, host_free=host_free)
    rows = [req(0, 0, blocks("p", 32))] + [req(i, i * 400, blocks(("x", i), 32)) for i in range(1, 6)]
    rows.append(req(9, 4000, blocks("p", 32) + blocks("q", 8)))
    with SglangBackend(workload(tmp_path, rows), s, check_integrity_every=1) as be:
        pools = be.rt.host_pools
        assert set(pools) == {"full", "swa"}
        pool = pools["full"]
        avail = pool.available_size()
        idx = pool.alloc(64)
        pool.free(idx)
        assert pool.available_size() == avail
        # lazy: the freed chunk waits in the release list; eager: merged into the free list now
        assert pool.num_release_slots == (64 if host_free == "lazy_merge" else 0)
        assert ("free" in pool.__dict__) == (host_free == "eager_cat")
        result = be.run()
    assert "free" not in pool.__dict__
    assert result.num_finished == 7 and result.cached_tokens == 512  # the host hit still works


# ---------------------------------------------------------------- SWA LRU refresh (#26615)
def _swa_mru_order(tree):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    lru = tree.tree_core.lru_lists[ComponentType.SWA]
    out, node = [], lru.head.lru_next[lru._pt]
    while node is not lru.tail:
        if node.key is not None:
            out.append((node.key.token_ids[0], len(node.key)))
        node = node.lru_next[lru._pt]
    return out


@pytest.mark.parametrize("refresh", ["window_aware", "full_ancestry"])
def test_swa_lru_refresh(tmp_path, refresh):
    """A match deep in a long branch refreshes its ancestors (full) or only the window (aware)."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    # page 1: the tests insert with SWATokenToKVPoolAllocator.alloc, which is page-1 only
    s = dataclasses.replace(BASE, page_size=1, tree_core="python", swa_lru_refresh=refresh)
    a = list(range(1000, 1256))
    b = a[:128] + list(range(5000, 5128))
    c = list(range(9000, 9256))
    with SglangBackend(workload(tmp_path, [req(0, 0, blocks("z", 1))]), s) as be:
        tree, alloc = be.rt.tree, be.rt.allocator
        for toks in (a, b, c):
            key = RadixKey(array("q", toks))
            tree.insert(InsertParams(key=key, value=alloc.alloc(len(toks))))
        # each insert keeps its last window in its own leaf: (first token, tokens) per node
        order = _swa_mru_order(tree)
        assert sorted(order) == [(1000, 128), (1128, 96), (1224, 32), (5000, 96), (5096, 32),
                                 (9000, 224), (9224, 32)]
        assert order[0] == (9224, 32) and order.index((9224, 32)) < order.index((1000, 128))
        tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", a))))
        order = _swa_mru_order(tree)
        assert order[:2] == [(1224, 32), (1128, 96)]  # the matched window moves to MRU either way
        # the shared node lies 128 tokens above the match end, beyond W + ps = 33
        parent_before_c = order.index((1000, 128)) < order.index((9224, 32))
        assert parent_before_c == (refresh == "full_ancestry")
        patched = "refresh_lru" in vars(tree.components[_swa_type()])
        assert patched == (refresh == "full_ancestry")
    assert "refresh_lru" not in vars(tree.components[_swa_type()])


def _swa_type():
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    return ComponentType.SWA


def test_full_ancestry_needs_python_core():
    assert dataclasses.replace(BASE, swa_lru_refresh="full_ancestry").resolved_tree_core == "python"
    with pytest.raises(ValueError, match="tree_core=python"):
        dataclasses.replace(BASE, swa_lru_refresh="full_ancestry", tree_core="rust")
