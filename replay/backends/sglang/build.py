"""Construct the real sglang 0.5.23 objects of one backend run, as sglang's own test kits do.

``ServerArgs`` + ``set_global_server_args_for_scheduler``, a ``ReqToTokenPool``, an
``SWAKVPool`` (or ``MHATokenToKVPool`` without SWA) with tiny KV tensors (1 head, head_dim 1,
one full and one SWA layer, fp16: a million-slot pool costs a few MB), the real allocator,
``CacheInitParams`` and a ``UnifiedRadixCache`` with FULL(+SWA) components, optionally HiCache
(``init_hicache``) with a host pool group. Also the scheduler components the loop reuses:
``SchedulePolicy``, ``NewTokenRatioTracker``, ``SchedulerPoolStatsObserver`` and
``SchedulerInvariantChecker`` (the real leak check).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import types
from dataclasses import dataclass
from typing import Any, Iterator

from replay.backends.sglang.settings import SglangSettings
from replay.backends.sglang.env import bootstrap

#: Stand-in for the model config: the scheduler reads only these fields on our paths
#: (no logprobs, no multimodal, no encoder-decoder). ``vocab_size`` bounds sampled ids.
_MODEL_CONFIG_FIELDS = {"vocab_size": 1 << 31, "is_encoder_decoder": False, "hf_text_config": None,
                        "num_key_value_heads": 1, "is_multimodal": False}


@contextlib.contextmanager
def sglang_env(settings: SglangSettings, *, debug_memory_pool: bool) -> Iterator[None]:
    """Set the run's ``SGLANG_*`` switches and one torch intra-op thread (restored on exit).

    The scheduler's host path is single-threaded; on small CPU tensors extra intra-op threads
    only add contention (an 8k-token ``alloc_extend_naive`` takes ~1 ms on one thread, ~6 ms on
    two busy cores).

    Mutates: ``os.environ`` and ``torch.get_num_threads()`` inside the block.
    """
    import torch

    env = settings.env()
    env["SGLANG_DEBUG_MEMORY_POOL"] = "1" if debug_memory_pool else "0"
    saved = {k: os.environ.get(k) for k in env}
    threads = torch.get_num_threads()
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Runtime:
    """The real objects one backend run drives (all owned by the run)."""

    settings: SglangSettings
    server_args: Any
    model_config: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree: Any
    policy: Any
    ratio: Any  # NewTokenRatioTracker
    stats_observer: Any  # SchedulerPoolStatsObserver
    max_context_tokens: int

    @property
    def host_pools(self) -> dict[str, Any]:
        """HiCache host pools by name ('full', 'swa'); empty without HiCache."""
        group = getattr(self.tree, "host_pool_group", None)
        if group is None:
            return {}
        names = {"kv": "full", "swa": "swa"}
        return {names.get(e.name.value, e.name.value): e.host_pool for e in group.entries}

    def close(self) -> None:
        """Release HiCache host resources (idempotent)."""
        if getattr(self.tree, "cache_controller", None) is not None:
            with contextlib.suppress(Exception):
                atexit.unregister(self.tree.shutdown)
            with contextlib.suppress(Exception):
                self.tree.release_host_resources()


def build_pools(settings: SglangSettings, *, req_rows: int, row_tokens: int) -> tuple[Any, Any, Any]:
    """The real request-row pool, KV pool and allocator, sized by ``settings`` (tiny KV tensors).

    Shared by both schedulers: the mirror's :func:`build_runtime` and the real ``Scheduler``'s
    stand-in model worker (``replay.backends.sglang.scheduler``), so both replay on identical pools.

    Returns:
        ``(req_to_token_pool, kv_pool, allocator)``.
    """
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    s, ps = settings, settings.page_size
    device, dtype = "cpu", torch.float16
    r2t = ReqToTokenPool(size=req_rows, max_context_len=row_tokens, device=device, enable_memory_saver=False)
    if s.has_swa:
        kv_pool = SWAKVPool(size=s.full_pool_tokens, size_swa=s.swa_tokens, page_size=ps, dtype=dtype,
                            head_num=1, head_dim=1, swa_attention_layer_ids=[0],
                            full_attention_layer_ids=[1], device=device)
        allocator = SWATokenToKVPoolAllocator(size=s.full_pool_tokens, size_swa=s.swa_tokens, page_size=ps,
                                              dtype=dtype, device=device, kvcache=kv_pool,
                                              need_sort=s.need_sort, req_to_token_pool=r2t)
    else:
        kv_pool = MHATokenToKVPool(size=s.full_pool_tokens, page_size=ps, dtype=dtype, head_num=1, head_dim=1,
                                   layer_num=1, device=device, enable_memory_saver=False)
        if ps == 1:
            allocator = TokenToKVPoolAllocator(size=s.full_pool_tokens, dtype=dtype, device=device,
                                               kvcache=kv_pool, need_sort=s.need_sort)
        else:
            allocator = PagedTokenToKVPoolAllocator(size=s.full_pool_tokens, page_size=ps, dtype=dtype,
                                                    device=device, kvcache=kv_pool, need_sort=s.need_sort)
    return r2t, kv_pool, allocator


def build_runtime(settings: SglangSettings, *, max_context_tokens: int) -> Runtime:
    """Build the real pools, allocator, tree and scheduler components.

    Args:
        settings: the run's settings (sizes, policies).
        max_context_tokens: request row width (longest prompt + max_new_tokens + a page).
    Returns:
        :class:`Runtime`.
    Mutates:
        sglang's process-global server args (``set_global_server_args_for_scheduler``).
    Note:
        Call inside :func:`sglang_env`, which the allocators read at construction.
    """
    bootstrap()
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    s = settings
    ps = s.page_size
    hicache = dict(enable_hierarchical_cache=True, hicache_ratio=s.host_pool_tokens / s.full_pool_tokens,
                   hicache_write_policy=s.hicache_write_policy, hicache_io_backend="direct",
                   hicache_mem_layout="layer_first") if s.has_hicache else {}
    server_args = ServerArgs(
        model_path="dummy", page_size=ps, attention_backend="torch_native",
        chunked_prefill_size=s.chunked_prefill_size, max_prefill_tokens=s.max_prefill_tokens,
        max_running_requests=s.max_running_requests, schedule_policy=s.schedule_policy,
        radix_eviction_policy=s.eviction_policy, **hicache,
    )
    set_global_server_args_for_scheduler(server_args)
    row_tokens = -(-max_context_tokens // ps) * ps + ps
    r2t, kv_pool, allocator = build_pools(s, req_rows=s.max_running_requests, row_tokens=row_tokens)
    components = (ComponentType.FULL, ComponentType.SWA) if s.has_swa else (ComponentType.FULL,)
    params = CacheInitParams(
        disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=allocator, page_size=ps,
        eviction_policy=s.eviction_policy, chunked_prefill_size=s.chunked_prefill_size,
        sliding_window_size=s.sliding_window_tokens if s.has_swa else None,
        tree_components=components, tree_core_backend=s.resolved_tree_core,
    )
    tree = UnifiedRadixCache(params=params)
    if tree._tree_core_backend != s.resolved_tree_core:
        raise RuntimeError(f"sglang fell back to the {tree._tree_core_backend} tree core; "
                           f"tree_core={s.resolved_tree_core} is not available here")
    if s.has_hicache:
        tree.init_hicache(server_args, params)
    model_config = types.SimpleNamespace(**_MODEL_CONFIG_FIELDS)
    policy = SchedulePolicy(s.schedule_policy, tree, enable_hierarchical_cache=s.has_hicache,
                            enable_priority_scheduling=False, schedule_low_priority_values_first=False)
    observer = SchedulerPoolStatsObserver(
        tree_cache=tree, token_to_kv_pool_allocator=allocator, req_to_token_pool=r2t,
        session_controller=None, hisparse_coordinator=None, is_hybrid_swa=s.has_swa,
        is_hybrid_ssm=False, enable_hisparse=False,
        full_tokens_per_layer=s.full_pool_tokens if s.has_swa else None,
        swa_tokens_per_layer=s.swa_tokens if s.has_swa else None,
        max_total_num_tokens=s.full_pool_tokens,
    )
    return Runtime(settings=s, server_args=server_args, model_config=model_config, req_to_token_pool=r2t,
                   kv_pool=kv_pool, allocator=allocator, tree=tree, policy=policy,
                   ratio=NewTokenRatioTracker.from_config(), stats_observer=observer,
                   max_context_tokens=row_tokens)
