"""Planted bug reproductions for incident traces (``record_workload(..., incident=NAME)``).

Each incident is a context manager that wraps one method of a real sglang 0.5.23 class so that
the real code loses or pins memory the way an upstream bug did; everything else is the real code.
They are applied after the tracer hooks are installed and delegate to whatever is installed
(hooks included), so the trace records exactly what the buggy server would have recorded:
nothing for a free that never reached the allocator.

| name | wraps | reproduces |
|---|---|---|
| ``lost_free`` | ``SWATokenToKVPoolAllocator._free_swa_pages`` | a planted lost free: every ``every``-th SWA segment free outside a free group drops its last page (the SWA peer stays allocated, nobody references it) |
| ``swa_mapping_race`` | ``SWATokenToKVPoolAllocator._free_swa_pages`` | sgl-project/sglang#36135: inside a free group the SWA peer was resolved at ``free_group_end``; a cache action earlier in the group had cleared the mapping of the segment's first page, so its SWA page is never freed (one page at a time). The race's trigger is emulated by clearing that mapping entry on every ``every``-th grouped free |
| ``lost_unlock`` | ``UnifiedRadixCache.unlock`` | a protected prefix pinned: every ``every``-th unlock of a lock receipt is skipped, so its path stays locked (protected) with no request behind it |
| ``all_tombstone_leaf_insert`` | ``SWAComponent._clip_to_window`` (Python tree core) | the insert half of sgl-project/sglang#29860 / #22470: a span whose SWA decode has already freed entirely (frontier at ``page_floor(seq_len)``) is published as live SWA instead of a tombstone. Record it with ``swa_release_boundary=window_plus_page_cut_to_window`` and ``page_size`` > window, which is what makes the frontier reach the insert boundary |

The 0.5.23 fixes that already have a setting are recorded with settings instead (see
``replay.diagnosis.make_incidents``): ``swa_release_boundary=window_plus_page_cut_to_window``
(pre-#29860), ``swa_free_out_of_window_at_insert=false`` (pre-#27402),
``swa_lru_refresh=full_ancestry`` (pre-#26615).

Why the all-tombstone leaf needs two reversions on 0.5.23: the pre-#29860 boundary alone
(``free_swa_out_of_window_slots`` cutting at ``pre_len - W``) does move the SWA frontier
(``evicted_seqlen``) onto ``page_floor(seq_len)`` when ``seq_len % ps > W`` (page 64, window 32:
8 finished inserts of ``make_incidents``' ``varied_answers`` workload), but 0.5.23's
``SWAComponent._populate_range`` asks ``_clip_to_window``, which returns None for a span lying
wholly below the frontier, so the leaf is inserted as a plain FULL-only tombstone: no SWA value,
no SWA ledger change, nothing to leak. That early return is the defensive half of #22470 ("case 3:
free value, don't create node"); the old insert fell through to a live node. Only with both the
boundary and that insert case reverted does the leaf claim SWA slots decode already freed.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

INCIDENTS = ("lost_free", "swa_mapping_race", "lost_unlock", "all_tombstone_leaf_insert")


@contextlib.contextmanager
def _swap(cls, name: str, make) -> Iterator[dict]:
    """Replace ``cls.name`` by ``make(current)``; restore on exit. Yields a counter dict."""
    current = cls.__dict__[name]
    counter = {"calls": 0, "planted": 0}
    setattr(cls, name, make(current, counter))
    try:
        yield counter
    finally:
        setattr(cls, name, current)


def _lost_free(every: int):
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    def make(orig, counter):
        def _free_swa_pages(self, free_index, start_pos):
            ps = self.page_size
            if self.free_group is None and free_index.numel() > ps:
                counter["calls"] += 1
                if counter["calls"] % every == 0:
                    counter["planted"] += 1
                    return orig(self, free_index[:-ps], start_pos)  # the last page is lost
            return orig(self, free_index, start_pos)

        return _free_swa_pages

    return _swap(SWATokenToKVPoolAllocator, "_free_swa_pages", make)


def _mapping_race(every: int):
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

    def make(orig, counter):
        def _free_swa_pages(self, free_index, start_pos):
            ps = self.page_size
            if self.free_group is not None and free_index.numel() >= ps:
                counter["calls"] += 1
                if counter["calls"] % every == 0:
                    counter["planted"] += 1
                    first = free_index[:1]
                    # Deferred resolution (pre-#36135): the entry reads 0 at group end, so the
                    # SWA page behind it is filtered as padding and never released.
                    self.clear_full_to_swa_mapping(first)
                    return orig(self, free_index[ps:], start_pos + ps) if free_index.numel() > ps else None
            return orig(self, free_index, start_pos)

        return _free_swa_pages

    return _swap(SWATokenToKVPoolAllocator, "_free_swa_pages", make)


def _lost_unlock(every: int):
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    def make(orig, counter):
        def unlock(self, lock):
            if lock is not None:
                counter["calls"] += 1
                if counter["calls"] % every == 0:
                    counter["planted"] += 1
                    return None  # the receipt is dropped: its path stays locked
            return orig(self, lock)

        return unlock

    return _swap(UnifiedRadixCache, "unlock", make)


def _all_tombstone_leaf_insert(every: int):
    """Pre-#22470 insert of a fully out-of-window span (case 3): 0.5.23's
    ``SWAComponent._clip_to_window`` returns None when the request's SWA frontier
    (``evicted_seqlen``) has reached the end of the span, so the span is inserted as a plain
    tombstone. The old insert had no such case and published the span as live SWA
    (``_add_new_node(swa_tombstone=False)``): here ``_clip_to_window`` returns the span start
    instead, so ``SWARebuild`` translates full ids whose SWA peers decode already freed
    (mapping 0). The tree then counts SWA slots the allocator holds as free (evictable
    inflated, the identity broken by the span's length) until the leaf is evicted, and a match
    may hand the padding sink out as window KV. Python tree core only (the Rust core inserts
    in Rust)."""
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

    def make(orig, counter):
        def _clip_to_window(self, *, node, start, end, window_start, cache_actions):
            live = orig(self, node=node, start=start, end=end, window_start=window_start,
                        cache_actions=cache_actions)
            if live is None and node.component_data[self.component_type].value is None and window_start >= end > start:
                counter["calls"] += 1
                if counter["calls"] % every == 0:
                    counter["planted"] += 1
                    return start  # the all-tombstone span is published as live SWA
            return live

        return _clip_to_window

    return _swap(SWAComponent, "_clip_to_window", make)


_MAKERS = {"lost_free": _lost_free, "swa_mapping_race": _mapping_race, "lost_unlock": _lost_unlock,
           "all_tombstone_leaf_insert": _all_tombstone_leaf_insert}


#: incident -> (setting, value) it needs: the Python SWA component runs only on the Python core
REQUIRES = {"all_tombstone_leaf_insert": ("tree_core", "python")}


def check_incident(name: str, every: int, overrides=()) -> str | None:
    """Why incident ``name`` cannot be planted with ``--set`` ``overrides`` (None: it can)."""
    if name not in _MAKERS:
        return f"unknown incident; known: {', '.join(INCIDENTS)}"
    if every < 1:
        return f"--incident-every {every}: expected >= 1"
    need = REQUIRES.get(name)
    if need and f"{need[0]}={need[1]}" not in overrides:
        return f"needs --set {need[0]}={need[1]} (the Rust tree core inserts in Rust, past the patched method)"
    return None


@contextlib.contextmanager
def apply_incident(name: str, every: int = 7) -> Iterator[dict]:
    """Plant incident ``name`` (one of :data:`INCIDENTS`; ``""`` plants nothing) for the block.

    Args:
        name: incident name.
        every: the bug fires on every ``every``-th eligible call (deterministic).
    Yields:
        a counter dict: ``calls`` (eligible calls) and ``planted`` (times the bug fired).
    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if not name:
        yield {"calls": 0, "planted": 0}
        return
    if name not in _MAKERS:
        raise ValueError(f"unknown incident {name!r}; known: {', '.join(INCIDENTS)}")
    if every < 1:
        raise ValueError(f"incident every={every}: expected >= 1")
    with _MAKERS[name](every) as counter:
        yield counter


__all__ = ["INCIDENTS", "REQUIRES", "apply_incident", "check_incident"]
