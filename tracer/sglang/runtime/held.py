"""Request-private (``held``) tokens for the ``stats`` rows: KV rows of live requests and sessions.

The sampler (``sampler.py``) calls :func:`held_tokens` at every sample. sglang's own helpers
compute it per request; the formula is inlined here (it runs for every request at every sample)
while :func:`swa_inline_ok` finds sglang's helpers to be the 0.5.23 source it restates.
"""

from __future__ import annotations

from tracer.sglang.runtime import state


# sglang's request-private SWA helper and its component type (``pool_stats_observer``), taken
# when that module is hooked (``hooks/scheduler.py``): {"swa": fn, "swa_ct": ComponentType.SWA}
helpers: dict = {}


def held_tokens(tree, ps: int, swa: bool) -> tuple[int, int]:
    """(full, swa) request-private tokens: KV rows of live requests and sessions.

    Per row, the full side is the page-ceiled allocated length minus the protected prefix
    (sglang's ``kv_private_tokens``, inlined: it runs for every request at every sample); the
    SWA side additionally subtracts the freed out-of-window range ``[swa_dead_lo, evicted)``
    (sglang's ``kv_private_swa_tokens``), inlined too while :func:`swa_inline_ok` holds (the
    helpers are sglang 0.5.23's own), else through sglang's helper.
    """
    kvs = []
    if tree is not None:
        try:
            recs = tree.session_records()
            if recs:
                kvs = [kv for kv in recs.values() if kv.req_pool_idx is not None]
        except Exception:
            pass
    if kvs:
        session_ids = {id(kv) for kv in kvs}
        for r in list(state.registry.live_reqs.values()):
            kv = r.kv
            if kv.req_pool_idx is not None and id(kv) not in session_ids:
                kvs.append(kv)
    else:
        kvs = [kv for r in list(state.registry.live_reqs.values())
               if (kv := r.kv).req_pool_idx is not None]
    full = swa_held = 0
    if not swa:
        for kv in kvs:
            full += -(-kv.kv_allocated_len // ps) * ps - kv.cache_protected_len
        return full, 0
    swa_ct = helpers.get("swa_ct")
    swa_fn = helpers.get("swa")
    inline = swa_fn is not None and swa_inline_ok(kvs[0] if kvs else None)
    for kv in kvs:
        prot = kv.cache_protected_len
        own = -(-kv.kv_allocated_len // ps) * ps - prot
        full += own
        ev = kv.component_evicted_seqlens.get(swa_ct) if swa_fn is not None else None
        if not ev:
            swa_held += own
        elif inline:  # kv_private_swa_tokens: own minus max(0, evicted - swa_dead_lo)
            lo = kv.swa_evict_floor
            if lo > prot:
                if ps > 1:
                    lo = -(-lo // ps) * ps
            else:
                lo = prot
            swa_held += own - ev + lo if ev > lo else own
        else:
            swa_held += swa_fn(kv, ps)
    if tree is not None:
        swa_held += int(tree.swa_transient_size())
    return full, swa_held


_swa_inline: dict = {}


def swa_inline_ok(kv) -> bool:
    """Whether the inlined SWA formula of :func:`held_tokens` is sglang's: its helper
    ``kv_private_swa_tokens`` and the ``ReqKvInfo`` methods it calls are the 0.5.23 functions
    whose source the formula restates (checked once per record class; the source is compared,
    so a patched or newer sglang falls back to calling the helper)."""
    if kv is None:
        return True
    t = type(kv)
    ok = _swa_inline.get(t)
    if ok is None:
        ok = _swa_inline[t] = _same_sources(helpers.get("swa"), t)
    return ok


# Normalized bodies of the sglang 0.5.23 functions the inlined formula restates.
_SWA_SOURCES = {
    "kv_private_swa_tokens": ("allocated=ceil_align(kv.kv_allocated_len,page_size)window_freed=max("
                              "0,kv.get_evicted_seqlen(ComponentType.SWA)-kv.swa_dead_lo(page_size)"
                              ")returnallocated-kv.cache_protected_len-window_freed"),
    "swa_dead_lo": ("lo=max(self.cache_protected_len,self.swa_evict_floor)ifpage_size>1andlo>"
                    "self.cache_protected_len:lo=ceil_align(lo,page_size)returnlo"),
    "get_evicted_seqlen": "returnself.component_evicted_seqlens.get(component_type,0)",
}


def _body(fn) -> str:
    import inspect

    lines = inspect.getsource(fn).splitlines()
    body = [ln.split("#", 1)[0] for ln in lines if not ln.lstrip().startswith(("def ", "@"))]
    return "".join("".join(body).split())


def _same_sources(helper, kv_type) -> bool:
    try:
        fns = {"kv_private_swa_tokens": helper, "swa_dead_lo": kv_type.swa_dead_lo,
               "get_evicted_seqlen": kv_type.get_evicted_seqlen}
        return all(_body(f) == _SWA_SOURCES[n] for n, f in fns.items())
    except Exception:  # no source, another class layout
        return False
