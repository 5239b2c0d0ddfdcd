"""Hooks on the SWA composite allocator (``SWATokenToKVPoolAllocator``, ``allocator/swa.py``).

The composite is never measured itself (its two leaves are, see ``allocator.py``), so nothing is
counted twice. Its constructor tags its leaves (``full`` / ``swa`` pool, ``tag_swa``) and
registers it for the sampler; a leaf never tagged (built before ``install``) counts as ``full``
until the sampler or the tree adopts its composite.

Free groups: on the composite, a group that released something is framed by
``free_group_begin`` / ``free_group_end`` marker rows, per pool, around its release rows (which
come from the leaves' hooks); empty groups (most decode steps) leave no rows.
"""

from __future__ import annotations

import tracer
from tracer.sglang.hooks.allocator_common import (FULL, GROUP_BEGIN, GROUP_END, SWA, Types, emit,
                                                 tag_swa)
from tracer.sglang.patching import exact_only
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP
from tracer.sglang.wrappers import after_init
from tracer.sglang.targets.contract import Contract


_SWA = "sglang.srt.mem_cache.allocator.swa"
CONTRACTS: tuple[Contract, ...] = (
    Contract("pool.swa_leaves", _SWA, "SWATokenToKVPoolAllocator", "__init__",
             reads=("full_attn_allocator", "swa_attn_allocator")),
    Contract("pool.swa_leaves", _SWA, "SWATokenToKVPoolAllocator", "free_group_end",
             params="(self)"),
)


def _swa_init(self) -> None:
    self.__dict__.pop("_kvt_tagged", None)  # a subclass may rebuild its leaves
    self.__dict__.pop("_kvt_sample", None)  # (the sampler's cached facts, runtime.sampler)
    tag_swa(self)
    state.registry.allocator = self
    state.touch("allocator")


def _make_swa_group_end():
    """Markers around a group's release, for each pool that had deferred frees: the full leaf's
    own group and the SWA side the composite defers itself. The release rows in between come
    from the leaves' ``_release_page_ids`` / ``free`` hooks like any other free. Most groups
    (most decode steps) deferred nothing: that check is the whole cost."""

    def make(orig):
        def free_group_end(self):
            d = self.__dict__
            if tracer.pool is NOOP:
                return orig(self)
            full = d.get("full_attn_allocator")
            fd = full.__dict__ if full is not None else {}
            full_pending = fd.get("free_group") or fd.get("free_page_ids_group")
            swa_pending = d.get("swa_page_ids_group") or d.get("swa_free_group")
            if not (full_pending or swa_pending):
                return orig(self)
            try:
                swa = d.get("swa_attn_allocator")
                tag_swa(self)
                pools = []
                if full_pending:
                    pools.append(fd.get("_kvt_pool", FULL))
                if swa_pending and swa is not None and swa is not full:
                    pools.append(swa.__dict__.get("_kvt_pool", SWA))
                pools = [p for p in pools if p is not None]
                ps = self.page_size
                for p in pools:
                    emit(p, GROUP_BEGIN, 0, ps, 0)
            except Exception as e:
                state.note_failure("allocator.swa_group_end", e)
                return orig(self)
            try:
                return orig(self)
            finally:
                try:
                    for p in pools:
                        emit(p, GROUP_END, 0, ps, 0)
                except Exception as e:
                    state.note_failure("allocator.swa_group_end", e)

        return free_group_end

    return make


def install(patcher, swa_mod) -> int:
    """Wrap the SWA composite classes of ``swa_mod`` (``sglang...allocator.swa``)."""
    S_ = swa_mod.SWATokenToKVPoolAllocator
    Types.swa = (S_,)
    Types.is_swa.clear()
    # PureSWA and other SWA subclasses have their own constructors: tag after each
    n = patcher.wrap_method_tree(S_, "__init__", after_init("allocator.swa_init", _swa_init))
    n += patcher.wrap_method(S_, "free_group_end", exact_only("(self)", _make_swa_group_end()))
    return n
