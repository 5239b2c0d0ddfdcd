"""THE table: the canonical hooks (what a trace needs, whatever the code base) and the targets
(the code bases kvtrace knows, each with its hook modules and recognizer).

Adding a target is an entry in ``TARGETS`` (and, where its names differ, hook modules with their
own ``CONTRACTS``); docs/capture.md "How to add a target".
"""

from __future__ import annotations

from dataclasses import dataclass

# ------------------------------------------------------------------ canonical hooks
@dataclass(frozen=True)
class Hook:
    """One canonical hook: what it records and the pools whose occupancy rows depend on it."""

    name: str
    what: str
    pools: tuple[str, ...] = ()


HOOKS: dict[str, Hook] = {h.name: h for h in (
    Hook("pool.device", "device allocator alloc/free/clear rows (leaf free lists)", ("full", "swa")),
    Hook("pool.device_decode", "the decode step's allocation rows", ("full", "swa")),
    Hook("pool.swa_leaves", "SWA composite: leaves tagged full/swa, free-group markers", ("swa",)),
    Hook("pool.req_to_token", "request rows taken and returned; requests holding KV",
         ("req_to_token",)),
    Hook("pool.host", "host (HiCache L2) pool alloc/free/merge rows", ("host_full", "host_swa")),
    Hook("pool.host_group", "host pools tagged host_full/host_swa by their group entry",
         ("host_swa",)),
    Hook("cache.tree", "the radix tree registered for the stats sampler"),
    Hook("cache.match", "match rows"),
    Hook("cache.insert", "insert rows (inserts and checkpoints)"),
    Hook("cache.evict", "evict rows (nodes, SWA tombstones)"),
    Hook("cache.lock", "lock/unlock rows"),
    Hook("cache.load_back", "load_back rows"),
    Hook("cache.backup", "backup rows"),
    Hook("cache.host_evict", "host_evict rows"),
    Hook("cache.release", "release rows (a request's KV returned to the tree)"),
    Hook("cache.swa_release", "swa_release rows (out-of-window SWA frees)"),
    Hook("request.arrival", "arrival rows"),
    Hook("request.finish", "finish/abort rows"),
    Hook("sched.batch", "the step's batch (mode, size, tokens)"),
    Hook("sched.step", "step boundaries of the real Scheduler (step and stats rows)"),
    Hook("sched.scheduler", "the scheduler and its server args (manifest, rank)"),
    Hook("sched.admission", "admit rows"),
    Hook("sched.budget", "the SWA budget of admit rows (need, shrunk/swa_wait verdicts)"),
    Hook("sched.retract", "retract rows"),
    Hook("stats.observer", "step boundaries of loops that are not the Scheduler (real-code backend)"),
)}


# ------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    """A code base kvtrace captures.

    Attributes:
        name: e.g. ``sglang-0.5.23``.
        what: one line (where the code comes from).
        hook_modules: dotted names of the hook modules installed (each with ``CONTRACTS`` and
            ``install(patcher, lazy, level)``); empty: recognized but not captured yet.
        files: the sglang modules whose source makes the fingerprint (order matters).
        fingerprints: the known fingerprints (``source.fingerprint(root, files)``).
        requires: ``"module:Qual"`` or ``"module:Qual(shape)"`` that must be in the source
            (``shape``: parameter names and markers, ``source.shape``).
        forbids: ``"module:Qual"`` that must not be (to tell commits apart).
        not_applicable: canonical hooks this code base has no counterpart for (``skipped``).
    """

    name: str
    what: str
    hook_modules: tuple[str, ...]
    files: tuple[str, ...]
    fingerprints: frozenset[str]
    requires: tuple[str, ...]
    forbids: tuple[str, ...] = ()
    not_applicable: tuple[str, ...] = ()


_H = "tracer.sglang.hooks."
_M = "sglang.srt.mem_cache."
_G = "sglang.srt.managers."

SGLANG_0_5_23 = Target(
    name="sglang-0.5.23",
    what="upstream sglang 0.5.23 (PyPI)",
    hook_modules=tuple(_H + m for m in (
        "allocator", "memory_pool", "pool_host", "unified_radix_cache", "mem_cache_common",
        "schedule_policy", "schedule_batch", "scheduler")),
    files=(
        _M + "allocator.base", _M + "allocator.paged", _M + "allocator.token", _M + "allocator.swa",
        _M + "memory_pool", _M + "memory_pool_host", _M + "pool_host.base", _M + "pool_host.group",
        _M + "unified_radix_cache", _M + "unified_cache.component_type", _M + "common",
        _M + "prefill_budget", _G + "schedule_policy", _G + "schedule_batch", _G + "scheduler",
        _G + "scheduler_components.pool_stats_observer"),
    fingerprints=frozenset({"e1a90e7ecd1b0247"}),
    requires=(
        _M + "allocator.paged:PagedTokenToKVPoolAllocator._release_page_ids(self, *page_ids)",
        _M + "allocator.token:TokenToKVPoolAllocator",
        _M + "allocator.swa:SWATokenToKVPoolAllocator.free_group_end(self)",
        _M + "memory_pool:ReqToTokenPool.alloc",
        _M + "unified_radix_cache:UnifiedRadixCache.checkpoint(self, req, *, up_to, **kwargs)",
        _M + "unified_radix_cache:UnifiedRadixCache.match_prefix(self, params)",
        _M + "unified_cache.component_type:ComponentType",
        _M + "common:release_kv_cache(req, tree_cache, *, checkpoint)",
        _M + "prefill_budget:PrefillBudget.check_prefill",
        _G + "schedule_policy:PrefillAdder.add_one_req(self, req, has_chunked_req, truncation_align_size)",
        _G + "schedule_batch:ScheduleBatch.prepare_for_decode(self)",
        _G + "scheduler:Scheduler.get_next_batch_to_run(self, running_batch, last_batch)",
        _G + "scheduler_components.pool_stats_observer:kv_private_swa_tokens",
    ),
)

# The DeepSeek-V4 fork (bytedance-iaas/sglang, branch bytedance/deepseek_v4): one
# mem_cache/allocator.py, SWATokenToKVPoolAllocator in swa_memory_pool.py, host pools in
# memory_pool_host.py, the tree API cache_*_req and inc/dec_lock_ref (shared/targets/bytedance-dsv4).
_FORK_FILES = (
    _M + "allocator", _M + "swa_memory_pool", _M + "memory_pool", _M + "deepseek_v4_memory_pool",
    _M + "memory_pool_host", _M + "common", _M + "unified_radix_cache",
    _M + "unified_cache_components", _M + "unified_cache_components.tree_component",
    _M + "unified_cache_components.swa_component", _G + "schedule_policy", _G + "schedule_batch",
    _G + "scheduler", _G + "scheduler_components.pool_stats_observer", "sglang.srt.environ")
_FORK_REQUIRES = (
    _M + "allocator:PagedTokenToKVPoolAllocator",
    _M + "allocator:TokenToKVPoolAllocator",
    _M + "swa_memory_pool:SWATokenToKVPoolAllocator",
    _M + "deepseek_v4_memory_pool:DeepSeekV4TokenToKVPool",
    _M + "memory_pool:ReqToTokenPool.alloc",
    _M + "memory_pool_host:LogicalHostPool",
    _M + "memory_pool_host:HostPoolGroup",
    _M + "unified_radix_cache:UnifiedRadixCache.cache_finished_req",
    _M + "unified_radix_cache:UnifiedRadixCache.cache_unfinished_req",
    _M + "unified_radix_cache:UnifiedRadixCache.inc_lock_ref",
    _M + "unified_radix_cache:UnifiedRadixCache.dec_lock_ref",
    _M + "common:release_kv_cache(req, tree_cache, is_insert, is_decode)",
    _G + "scheduler:Scheduler.get_next_batch_to_run(self)",
)
# The fork's hook modules (tracer/sglang/hooks/fork/, docs/capture.md "The DeepSeek-V4 fork"):
# the same at both commits (they check the commit's differences themselves).
_FORK_HOOKS = tuple(_H + "fork." + m for m in (
    "allocator", "swa_memory_pool", "memory_pool", "memory_pool_host", "unified_radix_cache",
    "common", "schedule_policy", "schedule_batch", "scheduler"))
# #659 (shared/targets/bytedance-dsv4/659.patch): the SWA-pressure chunk cap and the
# window-aware LRU refresh are new.
_POST659_NAMES = (
    _G + "schedule_policy:PrefillAdder._swa_chunk_cap",
    _M + "unified_cache_components.tree_component:LRURefreshPhase",
)

DSV4_POST659 = Target(
    name="bytedance-dsv4-post659",
    what="DeepSeek-V4 fork at #659 (08290e30f482d20cb0fb92b79a3d58a9794efeee)",
    hook_modules=_FORK_HOOKS,
    files=_FORK_FILES,
    fingerprints=frozenset({"58394317f0758d21"}),
    requires=_FORK_REQUIRES + _POST659_NAMES,
)

DSV4_PRE659 = Target(
    name="bytedance-dsv4-pre659",
    what="DeepSeek-V4 fork before #659 (c6b67186a2def5676445566e4d0ad0efcbcf57b9)",
    hook_modules=_FORK_HOOKS,
    files=_FORK_FILES,
    fingerprints=frozenset({"08b6f0e5c092f0d9"}),
    requires=_FORK_REQUIRES,
    forbids=_POST659_NAMES,
)

# Tried in this order; the first whose fingerprint is known, else the first whose recognizer
# passes, is the target.
TARGETS: tuple[Target, ...] = (SGLANG_0_5_23, DSV4_POST659, DSV4_PRE659)


def by_name(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    raise KeyError(f"unknown target {name!r}; known: {', '.join(t.name for t in TARGETS)}")
