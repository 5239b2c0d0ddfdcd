"""Hooks on the fork's HiCache host pools (``sglang.srt.mem_cache.memory_pool_host``:
``HostKVCache`` and its subclasses, ``LogicalHostPool``, ``DeepSeekV4PagedHostPool``,
``HostPoolGroup``): the same rows as 0.5.23's ``hooks/pool_host.py``, whose wrappers are reused.

Every ``alloc`` / ``free`` / ``clear`` is measured under the pool's own lock (available size
before and after; a free counts when queued, released slots are available); at #659
``_merge_release_slots`` is a ``merge`` marker with the concatenation's cost (before #659 the
fork has no release list: every free concatenates, and there is no merge to mark). Pools are
tagged by their ``HostPoolGroup`` entry: ``kv`` (DSV4: the ``LogicalHostPool`` anchor) ->
``host_full``, ``swa`` (DSV4: a ``DeepSeekV4PagedHostPool``) -> ``host_swa``; the DSV4
compressed side pools (``deepseek_v4_c4``, ``..._c128``, their indexer and state pools) are not
recorded: they take no slots of their own (they follow the anchor's indices) and
``DeepSeekV4StateHostPool`` has no allocator at all.
"""

from __future__ import annotations

from tracer.sglang.hooks import pool_host as base
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.patching import _subclasses, target
from tracer.sglang.wrappers import after_call, after_init, timed_before

MOD = "sglang.srt.mem_cache.memory_pool_host"
_host = ("host_full", "host_swa")
CONTRACTS = contracts(
    MOD,
    *[dict(hook="pool.host", cls=c, method=m, reads=("lock", "free_slots"), pools=_host)
      for c in ("HostKVCache", "LogicalHostPool") for m in ("alloc", "free", "clear")],
    dict(hook="pool.host", cls="HostKVCache", method="_merge_release_slots",
         reads=("num_release_slots",), optional=True),
    dict(hook="pool.host", cls="LogicalHostPool", method="_merge_release_slots",
         reads=("num_release_slots",), optional=True),
    dict(hook="pool.host_group", cls="HostPoolGroup", method="__init__",
         reads=("entries",), levels=("steps", "counts", "pages"), pools=_host),
)


def _register(p) -> None:
    """A host pool with an allocator of its own joins the sampler's registry (a DSV4 state
    pool, whose ``available_size`` raises, does not)."""
    try:
        p.available_size()
    except Exception:
        return
    base._register(p)


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the fork's host pool classes (``lazy``: only if imported). Returns count."""
    mod = target(MOD, lazy)
    if mod is None:
        return 0
    n = 0
    for b in (mod.HostKVCache, mod.LogicalHostPool):
        if level != "steps":
            for name in ("alloc", "free", "clear"):
                n += patcher.wrap_method_tree(b, name, base._make_op(name))
            n += patcher.wrap_method_tree(b, "_merge_release_slots", timed_before(
                "host_pool.merge", base._staged, base._account_merge))
        for cls in _subclasses(b):  # (DeepSeekV4PagedHostPool has its own constructor)
            n += patcher.wrap_method(cls, "__init__", after_init("host_pool.init", _register))
    G = mod.HostPoolGroup
    n += patcher.wrap_method(G, "__init__", after_call("host_pool.group_init", base.tag_group))
    return n
