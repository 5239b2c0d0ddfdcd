"""Per-pool occupancy of a real-code backend run and its identity check (DESIGN.md §4.5).

For every pool: ``available + evictable + protected + held == capacity``. The numbers come from
the real objects: the allocator (available), the tree (evictable, protected; the sizes
``SchedulerPoolStatsObserver`` reports), and ``held`` summed over the requests that own a row
with sglang's own ``kv_private_tokens`` / ``kv_private_swa_tokens`` (the formulas of its
``SchedulerInvariantChecker``). ``held`` is therefore computed independently of the other three,
and a broken identity is a real leak or double free.

Host pools (HiCache) report capacity and available from the host pool; every used host slot is
owned by the tree (backed-up or host-only nodes), reported as evictable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PoolOccupancy:
    """One pool's state, in slots (tokens; requests for ``req_to_token``)."""

    capacity: int
    available: int
    evictable: int
    protected: int
    held: int

    @property
    def balance(self) -> int:
        """``capacity - (available + evictable + protected + held)``; 0 when consistent."""
        return self.capacity - (self.available + self.evictable + self.protected + self.held)

    def as_dict(self) -> dict:
        return asdict(self)


def measure(rt, owners: list) -> dict[str, PoolOccupancy]:
    """Occupancy of every pool of ``rt`` (keys: 'full', 'swa', 'host_full', 'host_swa', 'req_to_token').

    Args:
        rt: the run's :class:`replay.backends.sglang.build.Runtime`.
        owners: requests that own a request row (running, last batch, chunked).
    """
    from sglang.srt.managers.scheduler_components.pool_stats_observer import (
        kv_private_swa_tokens,
        kv_private_tokens,
    )

    ps_ = rt.settings.page_size
    tree, alloc = rt.tree, rt.allocator
    full_held = sum(kv_private_tokens(r.kv, ps_) for r in owners)
    out: dict[str, PoolOccupancy] = {}
    if rt.settings.has_swa:
        # The numbers SchedulerPoolStatsObserver._get_swa_token_info reads. Its public
        # get_pool_stats is not called here: the loop calls it once per step, and tracer
        # hooks take that call as the step boundary.
        out["full"] = PoolOccupancy(rt.settings.full_pool_tokens, alloc.full_available_size(),
                                    tree.full_evictable_size(), tree.full_protected_size(), full_held)
        swa_held = tree.swa_transient_size() + sum(kv_private_swa_tokens(r.kv, ps_) for r in owners)
        out["swa"] = PoolOccupancy(rt.settings.swa_tokens, alloc.swa_available_size(),
                                   tree.swa_evictable_size(), tree.swa_protected_size(), swa_held)
    else:
        out["full"] = PoolOccupancy(rt.settings.full_pool_tokens, alloc.available_size(),
                                    tree.evictable_size(), tree.protected_size(), full_held)
    for name, pool in rt.host_pools.items():
        cap, avail = int(pool.logical_size), int(pool.available_size())
        out[f"host_{name}"] = PoolOccupancy(cap, avail, cap - avail, 0, 0)
    r2t = rt.req_to_token_pool
    out["req_to_token"] = PoolOccupancy(r2t.size, r2t.available_size(), 0, 0, len(owners))
    return out


def check_identity(rt, owners: list) -> dict[str, PoolOccupancy]:
    """Assert every pool's identity; returns the occupancy.

    Raises:
        AssertionError: naming the pool and its numbers.
    """
    occ = measure(rt, owners)
    for name, o in occ.items():
        assert o.balance == 0, f"{name} pool identity broken (balance {o.balance}): {o}"
        assert min(o.available, o.evictable, o.protected, o.held) >= 0, f"{name}: negative count {o}"
    for name, pool in rt.host_pools.items():
        used = int(pool.slot_used.sum())
        assert used + int(pool.available_size()) == int(pool.logical_size), (
            f"host_{name}: {used} used + {pool.available_size()} available != {pool.logical_size}")
    return occ
