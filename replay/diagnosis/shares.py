"""Slot-seconds bounded by what the SWA pool can hold (``doctor``'s holder and cause shares).

A holder row (:mod:`replay.diagnosis.holders`) claims ``slot_seconds`` over ``[since_ns,
until_ns]``: a rate of ``slot_seconds / (until - since)`` slots. The claims are estimates from
``cache`` rows alone, and they overlap: two chunks of one request, or concurrent requests, can
each claim thousands of slots while the tree evicts under them, so the plain sums could exceed
the pool (a 200-request trace showed 71 % for one cause; larger ones went past 100 %).

Here they are bounded by construction, on the time grid of the SWA ``stats`` rows (the pool's
capacity ``C(t)`` and in-use slots ``U(t) = C(t) - available(t)``, each held until the next row):

- a holder's slot-seconds are ``∫ min(rate, C(t)) dt`` over its interval cut to the stats span;
- a cause's slot-seconds are ``∫ min(Σ rates of its holders, B(t)) dt`` with ``B = U`` (slots
  held are slots in use) except for the over-count (``all_tombstone_last_leaf``: the tree
  counts slots the allocator holds free, so ``B = C``);
- a share is slot-seconds over ``∫ C(t) dt`` (capacity x span), hence in [0, 1].
"""

from __future__ import annotations

import numpy as np

from tracer.schema import Pool

NS = 1e9
#: Causes whose slots are counted by the tree but free in the allocator (not in ``U``).
OVERCOUNT_CAUSES = frozenset({"all_tombstone_last_leaf"})


class Grid:
    """The SWA pool over time: segment starts ``t`` (ns), capacity ``cap`` and in-use ``used``
    per segment, segment lengths ``dt_s``; the last row closes the span."""

    def __init__(self, st):
        m = st.pool == int(Pool.SWA)
        if not np.any(m):
            m = st.pool == int(Pool.FULL)
        order = np.argsort(st.ts_ns[m], kind="stable")
        self.t = st.ts_ns[m][order].astype(np.int64)
        self.cap = st.capacity[m][order].astype(np.float64)
        self.used = np.clip(self.cap - st.available[m][order], 0, self.cap)
        self.dt_s = np.diff(self.t, append=self.t[-1] if len(self.t) else 0) / NS
        self.capacity_slot_seconds = float(np.sum(self.cap * self.dt_s))

    def share(self, slot_seconds: float) -> float:
        """``slot_seconds`` as a fraction of capacity x span (0 when the span is empty)."""
        if self.capacity_slot_seconds <= 0:
            return 0.0
        return float(min(max(slot_seconds / self.capacity_slot_seconds, 0.0), 1.0))

    def bounded(self, since_ns, until_ns, rate, bound: np.ndarray) -> float:
        """``∫ min(Σ_i rate_i·[since_i, until_i), bound(t)) dt`` in slot-seconds over the span."""
        if len(self.t) < 2 or not len(rate):
            return 0.0
        lo, hi = self.t[0], self.t[-1]
        s = np.clip(np.asarray(since_ns, dtype=np.int64), lo, hi)
        u = np.clip(np.asarray(until_ns, dtype=np.int64), lo, hi)
        r = np.where(u > s, np.asarray(rate, dtype=np.float64), 0.0)
        edges = np.unique(np.concatenate([self.t, s, u]))
        # total claimed rate on each [edges[k], edges[k+1]): a difference array over the edges
        d = np.zeros(len(edges) + 1)
        np.add.at(d, np.searchsorted(edges, s), r)
        np.add.at(d, np.searchsorted(edges, u), -r)
        claimed = np.maximum(np.cumsum(d)[:-1], 0.0)  # >= 0 despite float cancellation
        seg = np.searchsorted(self.t, edges, side="right") - 1  # the stats row in force
        width = np.diff(edges, append=edges[-1]) / NS
        return float(np.sum(np.minimum(claimed, bound[seg]) * width))


def bound_holders(holders: list[dict], st) -> tuple[list[dict], dict[str, float], Grid]:
    """Holders with bounded ``slot_seconds`` (and ``slots`` at most the capacity), each cause's
    bounded slot-seconds, and the grid (for shares)."""
    g = Grid(st)
    if not holders or len(g.t) < 2:
        return holders, {h["cause"]: 0.0 for h in holders}, g
    cap_max = float(g.cap.max())
    since = np.array([h["since_ns"] for h in holders], dtype=np.int64)
    until = np.array([h["until_ns"] for h in holders], dtype=np.int64)
    secs = np.maximum(until - since, 0) / NS
    raw = np.array([h["slot_seconds"] for h in holders], dtype=np.float64)
    rate = np.divide(raw, secs, out=np.zeros_like(raw), where=secs > 0)
    # one holder alone: rate x its overlap with the span, unless the rate exceeds the capacity
    inside = (np.clip(until, g.t[0], g.t[-1]) - np.clip(since, g.t[0], g.t[-1])) / NS
    own = rate * inside
    for i in np.flatnonzero(rate > g.cap.min()):
        own[i] = g.bounded(since[i:i + 1], until[i:i + 1], rate[i:i + 1], g.cap)
    out = [dict(h, slots=int(min(h["slots"], cap_max)), slot_seconds=float(own[i]))
           for i, h in enumerate(holders)]
    by_cause: dict[str, float] = {}
    causes = np.array([h["cause"] for h in holders])
    for c in dict.fromkeys(causes.tolist()):
        m = causes == c
        by_cause[c] = g.bounded(since[m], until[m], rate[m], g.cap if c in OVERCOUNT_CAUSES else g.used)
    return sorted(out, key=lambda h: -h["slot_seconds"]), by_cause, g


__all__ = ["Grid", "bound_holders", "OVERCOUNT_CAUSES"]
