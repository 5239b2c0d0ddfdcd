"""``ReqToTokenPool`` hooks: ``pool`` rows of pool ``req_to_token`` (request rows taken and
returned) and the set of requests holding a KV row, which the stats sampler's ``held`` sums over.
"""

from __future__ import annotations


import tracer
from tracer.schema import Pool, PoolOp
from tracer.sglang import state

_NOOP = state._NOOP
ALLOC, FREE, ALLOC_FAIL, CLEAR = (int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.ALLOC_FAIL),
                                  int(PoolOp.CLEAR))
REQ = int(Pool.REQ_TO_TOKEN)


def _make_req_pool(name: str):
    def make(orig):
        def req_op(self, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, *args, **kwargs)
            d = self.__dict__
            if d.get("_kvt_busy"):
                return orig(self, *args, **kwargs)
            try:
                before = len(self.free_slots)
            except Exception:
                return orig(self, *args, **kwargs)
            return state.run_measured(
                self, orig, args, kwargs,
                lambda dur, out: _account_req_pool(self, name, before, dur, args, out),
                f"req_to_token.{name}")

        return req_op

    return make


def _account_req_pool(p, name: str, before: int, dur_ns: int, args, out) -> None:
    delta = before - len(p.free_slots)
    rid = state.cur_rid[0]
    state.dirty[0] = True
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


def install(patcher, lazy: bool = False) -> int:
    """Wrap ``ReqToTokenPool`` (``lazy``: only if already imported). Returns count."""
    from tracer.sglang.patching import target

    mp = target("sglang.srt.mem_cache.memory_pool", lazy)
    if mp is None:
        return 0
    return sum(patcher.wrap_method(mp.ReqToTokenPool, name, _make_req_pool(name))
               for name in ("alloc", "alloc_rows", "free", "free_rows", "clear"))
