"""Model-wide ``check_integrity``: pools, tree, requests and the occupancy identity.

For every device pool, each page id 1..N must be in exactly one place: the free list (or the
staged list), an open free group, the tree, or one request's private row. ``held`` in the
snapshot (capacity - available - evictable - protected) must equal what requests privately
hold plus what open free groups still hold (DESIGN.md §4.5).
"""

from __future__ import annotations

import torch

from replay.memory.results import IntegrityError

_I64 = torch.int64


def _census(name: str, parts: list, num_pages: int) -> None:
    tensors = [p if isinstance(p, torch.Tensor) else torch.tensor(p, dtype=_I64) for p in parts]
    ids = torch.cat(tensors) if tensors else torch.empty((0,), dtype=_I64)
    if len(ids) and (int(ids.min()) < 1 or int(ids.max()) > num_pages):
        raise IntegrityError(f"{name}: page id out of 1..{num_pages} (reserved page 0 handed out?)")
    if len(torch.unique(ids)) != len(ids):
        raise IntegrityError(f"{name}: a page is in two places (double owner or double free)")
    if len(ids) != num_pages:
        raise IntegrityError(f"{name}: {num_pages - len(ids)} page(s) unaccounted for (leak)")


def _check_requests(model) -> tuple[list[int], list[int], list[int]]:
    """Per-request shape checks; returns (private full, live private SWA, dead private)."""
    ps = model.config.page_size
    full, live, dead = [], [], []
    for req in model.requests:
        if len(req.pages) != -(-req.seq_tokens // ps):
            raise IntegrityError(f"request {req.rid!r}: row has {len(req.pages)} pages for "
                                 f"{req.seq_tokens} tokens")
        if req.protected_tokens % ps or req.swa_evicted_tokens % ps:
            raise IntegrityError(f"request {req.rid!r}: unaligned protected/SWA cursor")
        if req.protected_tokens > req.seq_tokens:
            raise IntegrityError(f"request {req.rid!r}: protected beyond its KV")
        try:
            model.cache.check_request(req)
        except AssertionError as e:
            raise IntegrityError(str(e)) from e
        except Exception as e:  # MemoryModelError from the cache's own checks
            raise IntegrityError(str(e)) from e
        lo = req.protected_tokens // ps
        hi = max(req.swa_evicted_tokens // ps, lo)
        full.extend(req.pages[lo:])
        dead.extend(req.pages[lo:hi])
        live.extend(req.pages[hi:])
    return full, live, dead


def check_model(model):
    """See the module docstring. Returns the snapshot. Raises IntegrityError."""
    ps = model.config.page_size
    pools = model.pools
    pools.check_integrity()
    for host in (model.host_full, model.host_swa):
        if host is not None:
            host.check_integrity()
    census = model.cache.census()
    snap = model.snapshot()
    priv_full, live, dead = _check_requests(model)

    full = pools.full
    pending_full = full.pending_group_page_ids()
    _census("full", [census.full, priv_full, pending_full, full.all_free_page_ids()], full.num_pages)
    held = (len(priv_full) + len(pending_full)) * ps
    if snap["full"].held != held:
        raise IntegrityError(f"full: identity broken, held {snap['full'].held} != private {held}")

    if pools.has_swa:
        swa = pools.swa
        live_swa = pools.translate(live)
        if any(s == 0 for s in live_swa):
            raise IntegrityError("a request page inside its SWA window has no SWA peer")
        if any(s != 0 for s in pools.translate(dead)):
            raise IntegrityError("a request page below its SWA cursor still has an SWA peer")
        pinned = model.cache.pinned_swa_pages() if hasattr(model.cache, "pinned_swa_pages") else []
        pending_swa = swa.pending_group_page_ids()
        _census("swa", [census.swa, live_swa, pinned, pending_swa, swa.all_free_page_ids()],
                swa.num_pages)
        held = (len(live_swa) + len(pinned) + len(pending_swa)) * ps
        if snap["swa"].held != held:
            raise IntegrityError(f"swa: identity broken, held {snap['swa'].held} != {held}")

    for name, pool, pages in (("host_full", model.host_full, census.host_full),
                              ("host_swa", model.host_swa, census.host_swa)):
        if pool is None:
            continue
        if pool.used_tokens() != len(pages) * ps or snap[name].held != 0:
            raise IntegrityError(f"{name}: host slots used {pool.used_tokens()} != tree-owned "
                                 f"{len(pages) * ps}")
        if pages:
            used = torch.nonzero(pool.slot_used).flatten()[::ps] // ps
            if sorted(pages) != used.tolist():
                raise IntegrityError(f"{name}: tree host pages differ from the used slots")
    for name, s in snap.items():
        if min(s.available, s.evictable, s.protected, s.held) < 0:
            raise IntegrityError(f"{name}: negative occupancy term {s}")
    return snap
