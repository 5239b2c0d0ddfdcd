"""Hooks on the fork's ``ReqToTokenPool`` (``sglang.srt.mem_cache.memory_pool``): the same
module, class and methods as 0.5.23 (``alloc(reqs)``, ``free(req)``, ``clear``; no
``alloc_rows``/``free_rows``), so 0.5.23's ``hooks/memory_pool.py`` is installed as is: the
``req_to_token`` rows and the set of requests holding a KV row that ``held`` sums over."""

from __future__ import annotations

from tracer.sglang.hooks import memory_pool as base
from tracer.sglang.hooks.fork._contract import contracts

CONTRACTS = contracts(
    "sglang.srt.mem_cache.memory_pool",
    *[dict(hook="pool.req_to_token", cls="ReqToTokenPool", method=m, reads=("free_slots",),
           levels=("steps", "counts", "pages")) for m in ("alloc", "free", "clear")],
)


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    return base.install(patcher, lazy=lazy, level=level)
