"""Bytes per token of each KV pool, read from the server's live pool objects, for the rank entry
(``ranks/rank=<r>.json``, key ``kv_bytes``; docs/capacity.md "Bytes per token").

No GPU work and no torch import: only tensor metadata (``shape``, ``numel()``,
``element_size()``) and numbers the pools already hold (``size``, ``page_size``, ``mem_usage``,
the host pools' ``size_per_token``). ``note(tree, alloc)`` is called at a scheduler loop's first
boundary (``hooks/scheduler.adopt``) and by the fork's DSV4 hook; it writes once per (KV pool,
tree) pair.

The entry (schema 1.x, optional: readers accept traces without it)::

    "kv_bytes": {"kv_pool": "SWAKVPool", "method": "tensors",
                 "pools": {"full": POOL, "swa": POOL, "host_full": POOL, "host_swa": POOL}}

    POOL = {"bytes_per_token": float,   # what one token of the pool's capacity costs
            "tokens": int,              # the pool's capacity (its ``size``)
            "allocated_bytes": int,     # what the pool's buffers hold in all (padding page incl.)
            "method": str,              # how bytes_per_token was found (below)
            ...}                        # layout facts: layers, heads, head dims, dtype, parts

Methods: ``kv_buffers`` (device MHA/MLA pools: per buffer, its bytes over its rows; a row is a
token slot or, for page-major buffers, a page; the sum over buffers is the per-token cell size
sglang's pool configurator budgets with); ``host_size_per_token`` (HiCache host pools: the
``size_per_token`` the host pool was sized with); ``dsv4`` (the fork's DeepSeek-V4 pools:
``tracer.sglang.hooks.fork.dsv4.pool_bytes``, registered in :data:`DESCRIBERS`).
"""

from __future__ import annotations

from tracer.sglang.runtime import state

#: KV pool class name -> ``fn(kv_pool, alloc) -> {pool: POOL}`` (the fork's DSV4 pool registers here)
DESCRIBERS: dict = {}
_done: set = set()  # (id(recorder), id(kv pool), id(tree)) already written

_BUFFERS = ("k_buffer", "v_buffer", "kv_buffer", "k_scale_buffer", "v_scale_buffer",
            "native_k_scale_buffer", "native_v_scale_buffer", "dq_k_buffer", "dq_v_buffer",
            "index_k_with_scale_buffer")


def tensors(obj) -> list:
    """The tensors in ``obj`` (a tensor, or a list/tuple of them; None: none)."""
    if obj is None:
        return []
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensors(x)]
    return [obj] if hasattr(obj, "element_size") and hasattr(obj, "numel") else []


def nbytes(t) -> int:
    return int(t.numel()) * int(t.element_size())


def tokens_per_row(t, size: int, page_size: int) -> int:
    """1 when the buffer's leading dim is token slots (``size + page_size`` rows), else the page
    size (page-major buffers: about ``size / page_size`` rows)."""
    rows = int(t.shape[0]) if len(t.shape) else 1
    return 1 if rows >= size else max(1, page_size)


def buffer_bytes_per_token(p, names=_BUFFERS) -> tuple[float, int, dict]:
    """(bytes per token, allocated bytes, {buffer name: bytes per token}) of one device pool."""
    size, ps = int(getattr(p, "size", 0) or 0), int(getattr(p, "page_size", 1) or 1)
    per, total, parts = 0.0, 0, {}
    for name in names:
        got = 0.0
        for t in tensors(getattr(p, name, None)):
            b = nbytes(t)
            total += b
            rows = int(t.shape[0]) * tokens_per_row(t, size, ps) if len(t.shape) else 1
            got += b / rows if rows else 0.0
        if got:
            parts[name] = got
            per += got
    return per, total, parts


def _server_total(p) -> int | None:
    """sglang's own ``get_kv_size_bytes()`` (K + V), None where the pool has none or it fails."""
    fn = getattr(p, "get_kv_size_bytes", None)
    if fn is None:
        return None
    try:
        got = fn()
    except Exception:
        return None
    return int(sum(got)) if isinstance(got, (tuple, list)) else int(got)


def _num(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def device_pool(p) -> dict:
    """The POOL entry of one MHA/MLA-like device pool (``kv_buffers``)."""
    per, total, parts = buffer_bytes_per_token(p)
    out = {"bytes_per_token": per, "tokens": int(getattr(p, "size", 0) or 0), "allocated_bytes": total,
           "method": "kv_buffers", "kv_pool": type(p).__name__, "parts": parts,
           "page_size": int(getattr(p, "page_size", 1) or 1), "dtype": str(getattr(p, "dtype", "")),
           "layers": _num(getattr(p, "layer_num", None))}
    for k in ("head_num", "head_dim", "v_head_dim", "kv_cache_dim"):
        v = _num(getattr(p, k, None))
        if v is not None:
            out[k] = v
    server = _server_total(p)
    if server is not None:
        out["server_kv_size_bytes"] = server
    mem = _num(getattr(p, "mem_usage", None))
    if mem:
        out["server_mem_usage_gb"] = float(mem)
    return out


def device_pools(kv, alloc=None) -> dict:
    """{pool: POOL} of the device KV pool object ``kv`` ({} for a layout this module does not know)."""
    fn = DESCRIBERS.get(type(kv).__name__)
    if fn is not None:
        return fn(kv, alloc)
    if getattr(kv, "full_kv_pool", None) is not None and getattr(kv, "swa_kv_pool", None) is not None:
        return {"full": device_pool(kv.full_kv_pool), "swa": device_pool(kv.swa_kv_pool)}
    if any(getattr(kv, n, None) is not None for n in ("k_buffer", "kv_buffer")):
        return {"full": device_pool(kv)}
    return {}


def _host_name(entry_name: str) -> str | None:
    """Host pool group entry -> pool: ``kv`` host_full, ``swa`` host_swa; the fork's DSV4 side
    pools by what they are sized with (c4 state rows per SWA page: host_swa; the rest per full
    page: host_full); other entries (mamba, ...) None."""
    if entry_name == "kv":
        return "host_full"
    if entry_name == "swa":
        return "host_swa"
    if entry_name.startswith("deepseek_v4_"):
        return "host_swa" if "c4" in entry_name and entry_name.endswith("state") else "host_full"
    return None


def host_pools(tree) -> dict:
    """{host_full/host_swa: POOL} of the tree's HiCache host pools ({} without HiCache)."""
    group = getattr(tree, "host_pool_group", None)
    if group is None:
        ctrl = getattr(tree, "cache_controller", None)
        group = getattr(ctrl, "mem_pool_host", None) if ctrl is not None else None
    entries = getattr(group, "entries", None)
    if entries is None:
        hp = getattr(tree, "token_to_kv_pool_host", None)
        entries = [type("E", (), {"name": "kv", "host_pool": hp})()] if hp is not None else []
    out: dict = {}
    for e in entries:
        name = _host_name(str(getattr(e.name, "value", e.name)))
        hp = e.host_pool
        if name is None or hp is None:
            continue
        spt = int(getattr(hp, "size_per_token", 0) or 0)
        total = sum(nbytes(t) for t in tensors(getattr(hp, "kv_buffer", None)))
        size = int(getattr(hp, "size", 0) or 0)
        cur = out.setdefault(name, {"bytes_per_token": 0.0, "tokens": 0, "allocated_bytes": 0,
                                    "method": "host_size_per_token", "parts": {}})
        label = str(getattr(e.name, "value", e.name))
        if label in ("kv", "swa"):
            cur["tokens"] = int(getattr(hp, "logical_size", size) or size)
        if spt and total == 0:
            total = size * spt  # (a buffer this module cannot see: as sized)
        cur["allocated_bytes"] += total
        cur["parts"][label] = {"size_per_token": spt, "tokens": size, "allocated_bytes": total}
    for name, cur in out.items():
        tokens = cur["tokens"]
        only = list(cur["parts"].values())
        if len(only) == 1 and only[0]["size_per_token"] and only[0]["allocated_bytes"] == tokens * only[0]["size_per_token"]:
            cur["bytes_per_token"] = float(only[0]["size_per_token"])  # as sized (0.5.23 MHA/MLA host)
        else:  # the fork's DSV4 group: the logical anchor holds nothing, its side pools the bytes
            cur["bytes_per_token"] = cur["allocated_bytes"] / tokens if tokens else 0.0
            cur["method"] = "host_buffers"
    return out


def describe(tree, alloc) -> dict | None:
    """The ``kv_bytes`` entry (see the module) of these pools; None when no KV pool is known."""
    kv = alloc.get_kvcache() if alloc is not None and hasattr(alloc, "get_kvcache") else None
    if kv is None:
        return None
    pools = device_pools(kv, alloc)
    if not pools:
        return None
    if tree is not None:
        pools.update(host_pools(tree))
    return {"kv_pool": type(kv).__name__, "pools": pools}


def note(tree, alloc) -> None:
    """Write the ``kv_bytes`` entry of these pools into the active recording's rank entry (once per
    (KV pool, tree); never raises into sglang)."""
    try:
        kv = alloc.get_kvcache() if alloc is not None and hasattr(alloc, "get_kvcache") else None
        rec = state.recorder()
        key = (id(rec), id(kv), id(tree))
        if kv is None or rec is None or key in _done:
            return
        got = describe(tree, alloc)
        _done.add(key)
        if got is None:
            return
        publish(rec, "kv_bytes", got)
    except Exception as e:
        state.note_failure("kv_bytes", e)


def publish(rec, key: str, value) -> None:
    """Set ``rec.info[key]`` and rewrite the rank entry now (the drain process gets it at the next
    flush through ``info_changed``)."""
    from tracer.schema import manifest

    rec.info[key] = value
    rec.info_changed = True
    manifest.update_rank_info(rec.dir, rec.rank, rec.info)


def reset() -> None:
    """Forget which pools were written (tests; a new recording writes them again)."""
    _done.clear()


__all__ = ["DESCRIBERS", "buffer_bytes_per_token", "describe", "device_pool", "device_pools", "host_pools",
           "note", "publish", "reset"]
