"""Golden script: a fixed sequence of operations with hand-derived occupancy after each step.

Config: ps=4, full 128 tokens, W=8, SWA 64 tokens, radix, window-aware LRU, fixed release
boundary, LRU eviction. A = 8 pages; B shares A's first 4 pages. Each tuple is
(full available, evictable, protected, held), (swa available, evictable, protected, held).
The derivation of every step is in the comments.
"""

from __future__ import annotations

from replay.memory import KVCacheModel, MemoryConfig

from .conftest import seq

A = seq(1, 8)
B = A[:4] + seq(2, 4)

STEPS = [
    # 1. admit r1 on an empty tree
    ("admit r1", lambda m: m.admit("r1", A, m.match(A, max_tokens=31)),
     (128, 0, 0, 0), (64, 0, 0, 0)),
    # 2. 18 tokens -> 5 pages on both sides
    ("extend r1 18", lambda m: m.alloc_extend("r1", 18),
     (108, 0, 0, 20), (44, 0, 0, 20)),
    # 3. checkpoint: pre_len 17, keep ceil(max(8,4)) = 8 -> SWA of pages 0-1 freed; insert 4
    #    pages: tombstone T(2) + live F(2); lock F: FULL 16 protected, SWA 8 protected
    ("checkpoint r1", lambda m: m.checkpoint("r1"),
     (108, 0, 16, 4), (52, 0, 8, 4)),
    # 4. 14 more tokens: 18 -> 32 needs 3 pages
    ("extend r1 14", lambda m: m.alloc_extend("r1", 14),
     (96, 0, 16, 16), (40, 0, 8, 16)),
    # 5. finished insert of 8 pages: new leaf of 4 pages capped into P2(2) + L(2), all live;
    #    nothing private is left to free
    ("release r1", lambda m: m.release("r1"),
     (96, 32, 0, 0), (40, 24, 0, 0)),
    # 6. B matches T(tombstone) + F(live 8 >= W): 16 tokens; lock F
    ("admit r2", lambda m: m.admit("r2", B, m.match(B, max_tokens=31)),
     (96, 16, 16, 0), (40, 16, 8, 0)),
    # 7. 16 -> 31 tokens: 4 pages
    ("extend r2 15", lambda m: m.alloc_extend("r2", 15),
     (80, 16, 16, 16), (24, 16, 8, 16)),
    # 8. SWA shortfall 20: LRU tail P2 (internal) tombstoned (8), then leaf L deleted with its
    #    full KV (8 + 8); F is locked: stop with 16 freed
    ("evict swa 20", lambda m: m.evict(swa_tokens=20),
     (88, 8, 16, 16), (40, 0, 8, 16)),
    # 9. finished insert of 7 pages: new leaf (3 pages) -> Q(1) + R(2); the partial last page
    #    (4 tokens) is freed on both sides
    ("release r2", lambda m: m.release("r2"),
     (92, 36, 0, 0), (44, 20, 0, 0)),
    # 10. evict everything: P2, R, Q, F, T (parents join the heap as they become leaves)
    ("evict full 40", lambda m: m.evict(full_tokens=40),
     (128, 0, 0, 0), (64, 0, 0, 0)),
]


def _tuple(s):
    return (s.available, s.evictable, s.protected, s.held)


def test_golden_script():
    model = KVCacheModel(MemoryConfig(
        page_size=4, full_pool_tokens=128, sliding_window_tokens=8, swa_pool_tokens=64,
        swa_lru_refresh="window_aware", swa_release_boundary="max_window_page",
        eviction_policy="lru", debug_check_every_op=True,
    ))
    results = {}
    for name, op, full, swa in STEPS:
        results[name] = op(model)
        snap = model.check_integrity()
        assert (_tuple(snap["full"]), _tuple(snap["swa"])) == (full, swa), name
    assert results["admit r2"].device_hit_tokens == 16
    ev = results["evict swa 20"]
    assert (ev.swa_tokens, ev.full_tokens, ev.num_tombstoned_nodes, ev.num_deleted_nodes) == (16, 8, 1, 1)
    ev = results["evict full 40"]
    assert (ev.full_tokens, ev.swa_tokens, ev.num_deleted_nodes) == (36, 20, 5)
    assert model.tree.num_nodes == 0
