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

Bytes (``pool_bytes``, registered with ``tracer.sglang.runtime.kv_bytes``): the rank entry's
``kv_bytes`` gets the full pool's bytes per full token (c4/c128 compressed KV rows, the c4
indexer, the c128 compress state) and the SWA pool's per SWA token (SWA KV of every layer, the c4
compress and indexer state), each with what its tensors hold (docs/capacity.md).
"""

from __future__ import annotations

from tracer.sglang.runtime import kv_bytes, state

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
        kv_bytes.note(getattr(sched, "tree_cache", None), getattr(sched, "token_to_kv_pool_allocator", None))
    except Exception as e:
        state.note_failure("fork.dsv4", e)


# ------------------------------------------------------------------ bytes per token (kv_bytes)
def _row(t) -> int:
    """Bytes of one row of a 2-D buffer."""
    return int(t.shape[1]) * int(t.element_size()) if len(t.shape) > 1 else int(t.element_size())


def _state_tensor(pool):
    buf = getattr(pool, "kv_score_buffer", None)
    return getattr(buf, "kv_score", None)


def pool_bytes(kv, alloc) -> dict:
    """``{"full": POOL, "swa": POOL}`` of a ``DeepSeekV4TokenToKVPool`` (``runtime.kv_bytes``).

    ``bytes_per_token`` is the fork's own sizing (``DSV4PoolConfigurator._get_bytes_per_full_token``
    split by pool, terms read from the live objects rather than recomputed from the env):

    - full, per full token: the c4 KV slot (``get_bytes_per_token()``, 584 B) × c4 slots per full
      token (``c4_size / size_full`` = 1/4) per c4 layer, the same for c128 (1/128), the c4
      indexer row (``index_head_dim + index_head_dim // quant_block_size * 4``) × 1/4 per c4
      layer, and each c128 compress-state row (its ``kv_score`` row bytes) ×
      ``c128_state_pool_size / size_full`` (1 offline, 1/128 online) per c128 layer;
    - swa, per SWA token: the SWA KV slot × every layer of the stage, plus each c4 layer's
      compress-state and indexer-state rows × ``c4_state_pool_size / size_swa`` (ring / window).

    So the fork's coefficient is ``full + swa_full_tokens_ratio × swa``. ``allocated_bytes``
    sums the sub-pools' tensors (page padding to 576 B, the padding page and the rings' extra
    rows included); ``allocated_bytes_per_token`` is that over the pool's tokens.
    """
    from tracer.sglang.runtime.kv_bytes import nbytes, tensors

    full_tokens = int(getattr(alloc, "size_full", 0) or 0) if alloc is not None else 0
    swa_tokens = int(getattr(alloc, "size_swa", 0) or 0) if alloc is not None else 0
    swa_tokens = swa_tokens or int(getattr(kv, "swa_size", 0) or 0)
    ratios = list(getattr(kv, "compression_ratios", ()))
    lo, hi = getattr(kv, "_stage_start", 0), getattr(kv, "_stage_end", len(ratios))
    stage = ratios[lo:hi]
    n4, n128 = stage.count(4), stage.count(128)
    swa_pool, c4, c128 = kv.swa_kv_pool, kv.c4_kv_pool, kv.c128_kv_pool
    idx = kv.c4_indexer_kv_pool
    states = [p for p in getattr(kv, "compress_state_pools", ()) if p is not None]
    istates = [p for p in getattr(kv, "indexer_compress_state_pools", ()) if p is not None]
    c4_states = [p for p in states if getattr(p, "ratio", 0) == 4]
    c128_states = [p for p in states if getattr(p, "ratio", 0) == 128]

    def per_full(n: int) -> float:
        return n / full_tokens if full_tokens else 0.0

    idx_row = int(idx.index_head_dim) + int(idx.index_head_dim) // int(idx.quant_block_size) * 4
    c4_slot, c128_slot = int(c4.get_bytes_per_token()), int(c128.get_bytes_per_token())
    c128_rows = per_full(int(getattr(kv, "c128_state_pool_size", 0)))
    full_parts = {
        "c4_kv": n4 * c4_slot * per_full(int(kv.c4_size)),
        "c128_kv": n128 * c128_slot * per_full(int(kv.c128_size)),
        "c4_indexer": n4 * idx_row * per_full(int(getattr(kv, "c4_logical_size", kv.c4_size))),
        "c128_state": sum(_row(_state_tensor(p)) for p in c128_states) * c128_rows,
    }
    c4_rows = int(getattr(kv, "c4_state_pool_size", 0)) / swa_tokens if swa_tokens else 0.0
    swa_parts = {
        "swa_kv": int(swa_pool.get_bytes_per_token()) * len(stage),
        "c4_state": sum(_row(_state_tensor(p)) for p in c4_states) * c4_rows,
        "c4_indexer_state": sum(_row(_state_tensor(p)) for p in istates) * c4_rows,
    }

    def total(objs) -> int:
        return sum(nbytes(t) for t in tensors(objs))

    full_alloc = (total(c4.kv_buffer) + total(c128.kv_buffer) + total(idx.index_k_with_scale_buffer)
                  + total([_state_tensor(p) for p in c128_states]))
    swa_alloc = total(swa_pool.kv_buffer) + total([_state_tensor(p) for p in c4_states + istates])
    common = {"method": "dsv4", "kv_pool": type(kv).__name__, "page_size": int(alloc.page_size),
              "layers": len(stage), "c4_layers": n4, "c128_layers": n128,
              "qk_nope_head_dim": int(kv.qk_nope_head_dim), "qk_rope_head_dim": int(kv.qk_rope_head_dim),
              "indexer_head_dim": int(kv.indexer_head_dim), "state_dtype": str(getattr(kv, "c4_state_dtype", ""))}
    return {
        "full": dict(common, bytes_per_token=sum(full_parts.values()), tokens=full_tokens,
                     allocated_bytes=full_alloc, parts=full_parts,
                     allocated_bytes_per_token=full_alloc / full_tokens if full_tokens else 0.0),
        "swa": dict(common, bytes_per_token=sum(swa_parts.values()), tokens=swa_tokens,
                    allocated_bytes=swa_alloc, parts=swa_parts, swa_page_size=int(kv.swa_page_size),
                    allocated_bytes_per_token=swa_alloc / swa_tokens if swa_tokens else 0.0),
    }


def _register_bytes() -> None:
    from tracer.sglang.runtime import kv_bytes

    kv_bytes.DESCRIBERS["DeepSeekV4TokenToKVPool"] = pool_bytes


_register_bytes()
