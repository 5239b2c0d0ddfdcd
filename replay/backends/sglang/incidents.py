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

The 0.5.23 fixes that already have a setting are recorded with settings instead (see
``replay.diagnosis.make_incidents``): ``swa_release_boundary=window_plus_page_cut_to_window``
(pre-#29860), ``swa_free_out_of_window_at_insert=false`` (pre-#27402),
``swa_lru_refresh=full_ancestry`` (pre-#26615).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

INCIDENTS = ("lost_free", "swa_mapping_race", "lost_unlock")


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


_MAKERS = {"lost_free": _lost_free, "swa_mapping_race": _mapping_race, "lost_unlock": _lost_unlock}


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


__all__ = ["INCIDENTS", "apply_incident"]
