"""Lock rows of the fork's ``UnifiedRadixCache``: ``inc_lock_ref(node)`` / ``dec_lock_ref(node,
params)`` (the fork's only device lock API: requests, admission, HiCache write-through and
load-back acks all go through it) write one ``lock`` / ``unlock`` ``cache`` row with the change
of the tree's protected sizes, as 0.5.23's ``lock`` / ``unlock`` do (its ``_lock_rows`` is
reused). Host locks (``inc/dec_host_lock_ref``) change no device ledger and write nothing, as
on 0.5.23.

The admission's temporary pin of a candidate's prefix (``PrefillAdder._lock_node`` inside
``add_one_req``) leaves no rows (``S.pin_select``); the admission's own lock
(``_req_inc_lock_ref``) and a load-back's lock do (``S.pin_commit``; ``fork/schedule_policy.py``).
"""

from __future__ import annotations

from tracer.schema import CacheOp
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.hooks.unified_radix_cache_locks import _lock_rows
from tracer.sglang.patching import exact_only
from tracer.sglang.runtime.state import NOOP, S

import tracer

LOCK, UNLOCK = int(CacheOp.LOCK), int(CacheOp.UNLOCK)
MOD = "sglang.srt.mem_cache.unified_radix_cache"
CONTRACTS = contracts(
    MOD,
    dict(hook="cache.lock", cls="UnifiedRadixCache", method="inc_lock_ref",
         params="(self, node)", reads=("full_protected_size", "swa_protected_size")),
    dict(hook="cache.lock", cls="UnifiedRadixCache", method="dec_lock_ref",
         params="(self, node, params=None)",
         reads=("full_protected_size", "swa_protected_size")),
)


def _make_inc(orig):
    def inc_lock_ref(self, node):
        if tracer.pool is NOOP or (S.pin_select and not S.pin_commit):
            return orig(self, node)
        return _lock_rows(self, LOCK, orig, node)

    return inc_lock_ref


def _make_dec(orig):
    def dec_lock_ref(self, node, params=None):
        if tracer.pool is NOOP or (S.pin_select and not S.pin_commit):
            return orig(self, node, params)
        if params is None:
            return _lock_rows(self, UNLOCK, orig, node)
        return _lock_rows(self, UNLOCK, lambda t, n: orig(t, n, params), node)

    return dec_lock_ref


def install(patcher, U) -> int:
    n = patcher.wrap_method(U, "inc_lock_ref", exact_only("(self, node)", _make_inc))
    n += patcher.wrap_method(U, "dec_lock_ref",
                             exact_only("(self, node, params=None)", _make_dec))
    return n
