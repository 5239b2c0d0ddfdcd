"""The DeepSeek-V4 layout a replay needs, read from the fork's live objects and written into
this rank's entry (``ranks/rank=<r>.json``, key ``dsv4``) when the SWA allocator is built and
again at a scheduler's first boundary, with the tree's window (not a hook: called by
``fork/swa_memory_pool.py`` and ``fork/scheduler.py``).

``facts(tree, alloc)`` returns (None when the pools are not DSV4's ``DeepSeekV4TokenToKVPool``):

==========================  =======================================================================
key                         value
==========================  =======================================================================
``page_size``               the allocator's page size (DSV4 forces 256)
``sliding_window_tokens``   the tree's sliding window (``swa_window_size`` of the KV pool if none)
``compress_ratios``         per layer (``compression_ratios``: 0 none, 4 = c4, 128 = c128)
``swa_page_size``           the SWA KV pool's page size
``pool_tokens``             {full, swa, c4, c128, c4_state, c128_state}: sizes of the sub-pools
``swa_mode``                ``paged`` (an SWA leaf allocator of its own, paged in lockstep),
                            ``ring`` (HIP ``unified_kv``: SWA slots per request slot) or
                            ``request_window`` (V4.1 per-request window)
``pools``                   per pool: ``{"accounted": bool, "reason": str}``
==========================  =======================================================================

Coverage (``pools``): ``full`` and, in ``paged`` mode, ``swa`` are accounted by the allocator
hooks. In ``ring`` / ``request_window`` mode the SWA pool is **not** (no rows are written for it:
``tag_swa`` leaves a ring's SWA leaf untagged and the sampler skips it), reason given. The
compressed c4/c128 KV and state pools take their slots from the full pool's indices (no
allocator of their own in the fork at both shared commits), so they are covered by ``full``;
sub-allocators for them (``c4``/``c128`` attributes holding an allocator, as on NPU builds) are
left out and named with that reason.
"""

from __future__ import annotations

from tracer.sglang.runtime import state

_done: set = set()  # id() of the schedulers already described


def _swa_mode(alloc, kv) -> tuple[str, str]:
    if getattr(alloc, "_swa_req_ring", False) or getattr(kv, "unified_kv", False):
        return "ring", ("SWA ring (unified_kv): SWA slots belong to request slots, not to a "
                        "paged free list; SWA occupancy not accounted, no swa rows")
    names = set(vars(alloc)) | set(vars(kv))
    if any("request_window" in n or "req_window" in n for n in names):
        return "request_window", ("V4.1 per-request SWA window: occupancy follows the request "
                                  "window, not an allocator; SWA not accounted, no swa rows")
    return "paged", ""


def facts(tree, alloc) -> dict | None:
    """The DSV4 facts of these pools (see the module), or None for other pools."""
    if alloc is None:
        return None
    kv = alloc.get_kvcache() if hasattr(alloc, "get_kvcache") else None
    if kv is None or type(kv).__name__ != "DeepSeekV4TokenToKVPool":
        return None
    mode, why = _swa_mode(alloc, kv)
    window = getattr(tree, "sliding_window_size", None) if tree is not None else None
    if window is None:
        window = getattr(kv, "swa_window_size", None)
    out = {
        "page_size": int(alloc.page_size),
        "sliding_window_tokens": None if window is None else int(window),
        "compress_ratios": [int(r) for r in getattr(kv, "compression_ratios", ())],
        "swa_page_size": int(getattr(kv, "swa_page_size", 0) or 0),
        "pool_tokens": {k: int(v) for k, v in (
            ("full", getattr(alloc, "size_full", 0)), ("swa", getattr(alloc, "size_swa", 0)),
            ("c4", getattr(kv, "c4_size", 0)), ("c128", getattr(kv, "c128_size", 0)),
            ("c4_state", getattr(kv, "c4_state_pool_size", 0)),
            ("c128_state", getattr(kv, "c128_state_pool_size", 0)))},
        "swa_mode": mode,
        "pools": {"full": {"accounted": True, "reason": ""},
                  "swa": {"accounted": mode == "paged", "reason": why}},
    }
    for name in sorted(vars(alloc)):
        if ("c4" in name or "c128" in name) and "allocator" in name:
            out["pools"][name] = {"accounted": False, "reason": (
                "DSV4 compressed sub-allocator: counted as full by the fork, not recorded")}
    return out


def note(sched) -> None:
    """Describe the scheduler's DSV4 pools in this rank's entry (once per scheduler)."""
    if id(sched) in _done:
        return
    _done.add(id(sched))
    try:
        f = facts(getattr(sched, "tree_cache", None), getattr(sched, "token_to_kv_pool_allocator",
                                                              None))
        rec = state.recorder()
        if f is None or rec is None:
            return
        rec.info["dsv4"] = f
        from tracer.schema import manifest

        manifest.update_rank_info(rec.dir, rec.rank, rec.info)
    except Exception as e:
        state.note_failure("fork.dsv4", e)
