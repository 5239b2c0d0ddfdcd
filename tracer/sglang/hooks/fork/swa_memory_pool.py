"""Hooks on the fork's SWA composite allocator (``sglang.srt.mem_cache.swa_memory_pool``:
``SWATokenToKVPoolAllocator``, which DSV4 uses paged over ``DeepSeekV4TokenToKVPool``).

As on 0.5.23 (``hooks/allocator_swa.py``) the composite is never measured itself: its
constructor tags its two leaves (``full`` / ``swa``; ``allocator_common.tag_swa``) and registers
it for the sampler, and every slot it takes or gives back is measured on the leaves
(``fork/allocator.py``): ``alloc*`` on both, ``free`` = full leaf ``free`` + ``free_swa`` (SWA
leaf ``free`` of the mapped pages), ``free_swa`` alone for out-of-window releases.

Free groups: the fork's composite collects frees in its own ``free_group`` list and releases
them at ``free_group_end`` through its ``free``; a group that released something is framed by
``free_group_begin`` / ``free_group_end`` marker rows for both pools, empty groups leave none.
"""

from __future__ import annotations

from types import SimpleNamespace

import tracer
from tracer.sglang.hooks.allocator_common import (FULL, GROUP_BEGIN, GROUP_END, SWA, Types, emit,
                                                 tag_swa)
from tracer.sglang.hooks.fork import dsv4
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP
from tracer.sglang.wrappers import after_init

MOD = "sglang.srt.mem_cache.swa_memory_pool"
CONTRACTS = contracts(
    MOD,
    dict(hook="pool.swa_leaves", cls="SWATokenToKVPoolAllocator", method="__init__",
         reads=("full_attn_allocator", "swa_attn_allocator", "page_size", "size_swa",
                "size_full"), levels=("steps", "counts", "pages"), pools=("full", "swa")),
    dict(hook="pool.swa_leaves", cls="SWATokenToKVPoolAllocator",
         method="free_group_end", params="(self)", reads=("free_group",)),
)


def _swa_init(self) -> None:
    self.__dict__.pop("_kvt_tagged", None)
    self.__dict__.pop("_kvt_sample", None)  # (the sampler's cached facts)
    tag_swa(self)
    state.registry.allocator = self
    state.touch("allocator")
    dsv4.note(SimpleNamespace(tree_cache=None, token_to_kv_pool_allocator=self))


def _make_group_end(orig):
    def free_group_end(self):
        if tracer.pool is NOOP or not self.__dict__.get("free_group"):
            return orig(self)  # an empty group releases nothing (most decode steps)
        d = self.__dict__
        try:
            tag_swa(self)
            pools = [p for p in (d["full_attn_allocator"].__dict__.get("_kvt_pool", FULL),
                                 d["swa_attn_allocator"].__dict__.get("_kvt_pool", SWA))
                     if p is not None]
            ps = self.page_size
            for p in pools:
                emit(p, GROUP_BEGIN, 0, ps, 0)
        except Exception as e:
            state.note_failure("fork.allocator.swa_group_end", e)
            return orig(self)
        try:
            return orig(self)
        finally:
            try:
                for p in pools:
                    emit(p, GROUP_END, 0, ps, 0)
            except Exception as e:
                state.note_failure("fork.allocator.swa_group_end", e)

    return free_group_end


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the composite (its constructor at every level: the sampler needs the tags)."""
    mod = target(MOD, lazy)
    if mod is None:
        return 0
    C = mod.SWATokenToKVPoolAllocator
    Types.swa = (C,)
    Types.is_swa.clear()
    n = patcher.wrap_method_tree(C, "__init__", after_init("fork.allocator.swa_init", _swa_init))
    if level != "steps":
        n += patcher.wrap_inherited(C, "free_group_end", exact_only("(self)", _make_group_end))
    return n
