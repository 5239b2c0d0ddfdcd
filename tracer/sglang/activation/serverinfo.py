"""Server configuration for the trace manifest (``server`` key), from argv or a live process.

``from_argv(argv)`` parses the sglang flags that matter for KV memory out of a server command
line (``kvtrace launch``); ``from_live()`` reads the real objects of a scheduler process (server
args, allocator and host pool sizes, tree components) once they exist. Keys follow
``tracer.schema.SERVER_KEYS``; unknown values are left out rather than guessed.
"""

from __future__ import annotations

from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import S

# flag -> (manifest key, type)
ARGV_FLAGS: dict[str, tuple[str, type]] = {
    "--page-size": ("page_size", int),
    "--swa-full-tokens-ratio": ("swa_full_tokens_ratio", float),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--max-running-requests": ("max_running_requests", int),
    "--max-total-tokens": ("max_total_tokens", int),
    "--radix-eviction-policy": ("eviction_policy", str),
    "--hicache-ratio": ("hicache_ratio", float),
    "--hicache-size": ("hicache_size_gb", float),
    "--hicache-write-policy": ("hicache_write_policy", str),
    "--hicache-io-backend": ("hicache_io_backend", str),
    "--hicache-mem-layout": ("hicache_mem_layout", str),
    "--model-path": ("model", str),
    "--model": ("model", str),
    "--tp-size": ("tp_size", int),
    "--tp": ("tp_size", int),
    "--dp-size": ("dp_size", int),
    "--dp": ("dp_size", int),
    "--pp-size": ("pp_size", int),
    "--mem-fraction-static": ("mem_fraction_static", float),
}
ARGV_SWITCHES: dict[str, str] = {
    "--enable-hierarchical-cache": "enable_hierarchical_cache",
    "--disable-radix-cache": "disable_radix_cache",
}


def from_argv(argv: list[str]) -> dict:
    """Manifest ``server`` fields from a server command line (``--flag value`` or ``--flag=v``).

    Args:
        argv: the command (program and arguments).
    Returns:
        Known keys only; ``cache_kind`` is derived from the HiCache/radix switches.
    """
    out: dict = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        flag, eq, val = a.partition("=")
        if flag in ARGV_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    break
                val = argv[i + 1]
                i += 1
            key, typ = ARGV_FLAGS[flag]
            try:
                out[key] = typ(val)
            except ValueError:
                out[key] = val
        elif flag in ARGV_SWITCHES:
            out[ARGV_SWITCHES[flag]] = True
        i += 1
    if out.get("disable_radix_cache"):
        out["cache_kind"] = "none"
    elif out.get("enable_hierarchical_cache"):
        out["cache_kind"] = "hicache"
    return out


def from_server_args(sa) -> dict:
    """Manifest fields from a live ``ServerArgs``."""
    out: dict = {}
    for attr, key in (("page_size", "page_size"), ("swa_full_tokens_ratio", "swa_full_tokens_ratio"),
                      ("chunked_prefill_size", "chunked_prefill_size"),
                      ("max_running_requests", "max_running_requests"),
                      ("radix_eviction_policy", "eviction_policy"),
                      ("hicache_write_policy", "hicache_write_policy"),
                      ("hicache_ratio", "hicache_ratio"), ("model_path", "model"),
                      ("tp_size", "tp_size"), ("dp_size", "dp_size"), ("pp_size", "pp_size"),
                      ("enable_hierarchical_cache", "enable_hierarchical_cache")):
        v = getattr(sa, attr, None)
        if v is not None:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def from_live() -> dict:
    """Manifest fields from this process's live sglang objects (empty when none yet)."""
    out: dict = {}
    sa = S.server_args
    if sa is not None:
        out.update(from_server_args(sa))
    try:
        from importlib.metadata import version

        out["sglang_version"] = version("sglang")
    except Exception:
        pass
    alloc = state.registry.allocator
    tree = state.registry.tree
    if alloc is not None:
        out["page_size"] = int(alloc.page_size)
        if hasattr(alloc, "size_swa"):
            out["full_pool_tokens"] = int(alloc.size_full)
            out["swa_pool_tokens"] = int(alloc.size_swa)
        else:
            out["full_pool_tokens"] = int(alloc.size)
    if tree is not None:
        comps = [getattr(c, "name", str(c)).lower() for c in getattr(tree, "tree_components", ())]
        out["cache_kind"] = "unified_radix(" + "+".join(comps) + ")"
        w = getattr(tree, "sliding_window_size", None)
        if w is not None:
            out["sliding_window_tokens"] = int(w)
        if getattr(tree, "cache_controller", None) is not None:
            out["hicache_write_policy"] = tree.cache_controller.write_policy
    host = {}
    for hp in list(state.registry.host_pools.values()):
        tag = hp.__dict__.get("_kvt_pool")
        if tag is not None:
            host[int(tag)] = int(getattr(hp, "logical_size", hp.size))
    if host:
        from tracer.schema import Pool

        out["host_pool_tokens"] = host.get(int(Pool.HOST_FULL), 0)
        if int(Pool.HOST_SWA) in host:
            out["host_swa_pool_tokens"] = host[int(Pool.HOST_SWA)]
    return out
