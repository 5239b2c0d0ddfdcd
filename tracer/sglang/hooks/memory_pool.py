"""Hooks on ``ReqToTokenPool`` (``sglang.srt.mem_cache.memory_pool``): ``pool`` rows of pool
``req_to_token`` (request rows taken and returned) and the set of requests holding a KV row,
which the stats sampler's ``held`` sums over.

At ``steps`` only that set is kept (``alloc``/``free``/``clear``, no rows).
"""

from __future__ import annotations


import tracer
from tracer.schema import Pool, PoolOp
from tracer.sglang.patching import target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import run_measured
from tracer.sglang.targets.contract import LEVELS, Contract
ALLOC, FREE, ALLOC_FAIL, CLEAR = (int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.ALLOC_FAIL),
                                  int(PoolOp.CLEAR))
REQ = int(Pool.REQ_TO_TOKEN)


_MP = "sglang.srt.mem_cache.memory_pool"
CONTRACTS: tuple[Contract, ...] = tuple(
    Contract("pool.req_to_token", _MP, "ReqToTokenPool", name, reads=("free_slots",), levels=lv)
    for name, lv in (("alloc", LEVELS), ("free", LEVELS), ("clear", LEVELS),
                     ("alloc_rows", ("counts", "pages")), ("free_rows", ("counts", "pages"))))


def _make_req_pool(name: str):
    def make(orig):
        def req_op(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            d = self.__dict__
            if d.get("_kvt_busy"):
                return orig(self, *args, **kwargs)
            try:
                before = len(self.free_slots)
            except Exception:
                return orig(self, *args, **kwargs)
            return run_measured(
                self, orig, args, kwargs,
                lambda dur, out: _account_req_pool(self, name, before, dur, args, out),
                f"req_to_token.{name}")

        return req_op

    return make


def _account_req_pool(p, name: str, before: int, dur_ns: int, args, out) -> None:
    delta = before - len(p.free_slots)
    rid = S.cur_rid
    S.dirty = True
    if name == "alloc" and args:
        live = state.registry.live_reqs
        for r in args[0]:
            live[id(r)] = r
        if len(args[0]) == 1:
            rid = state.rid_of(args[0][0])
    elif name == "free" and args:
        state.registry.live_reqs.pop(id(args[0]), None)
        rid = state.rid_of(args[0])
    if delta > 0:
        tracer.pool(REQ, ALLOC, rid, delta, delta, dur_ns)
    elif delta < 0:
        tracer.pool(REQ, FREE, rid, -delta, -delta, dur_ns)
    elif name in ("alloc", "alloc_rows") and out is None:
        tracer.pool(REQ, ALLOC_FAIL, rid, 0, 0, dur_ns)
    if name == "clear":
        state.registry.live_reqs.clear()
        if delta < 0:
            tracer.pool(REQ, CLEAR, rid, -delta, -delta, 0)


# ------------------------------------------------------------------ level ``steps``
def _make_live_alloc():
    def make(orig):
        def alloc(self, reqs, *args, **kwargs):
            out = orig(self, reqs, *args, **kwargs)
            if out is not None and tracer.pool is not NOOP:
                live = state.registry.live_reqs
                for r in reqs:
                    live[id(r)] = r
            return out

        return alloc

    return make


def _make_live_free():
    def make(orig):
        def free(self, req, *args, **kwargs):
            state.registry.live_reqs.pop(id(req), None)
            return orig(self, req, *args, **kwargs)

        return free

    return make


def _make_live_clear():
    def make(orig):
        def clear(self, *args, **kwargs):
            state.registry.live_reqs.clear()
            return orig(self, *args, **kwargs)

        return clear

    return make


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap ``ReqToTokenPool`` (``lazy``: only if already imported). Returns count."""
    mp = target("sglang.srt.mem_cache.memory_pool", lazy)
    if mp is None:
        return 0
    R = mp.ReqToTokenPool
    if level == "steps":
        return (patcher.wrap_method(R, "alloc", _make_live_alloc())
                + patcher.wrap_method(R, "free", _make_live_free())
                + patcher.wrap_method(R, "clear", _make_live_clear()))
    return sum(patcher.wrap_method(R, name, _make_req_pool(name))
               for name in ("alloc", "alloc_rows", "free", "free_rows", "clear"))
