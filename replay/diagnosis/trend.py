"""Robust trend test for occupancy growth: Theil–Sen slope and the Mann–Kendall test (numpy only).

``trend(t_ns, values)`` -> :class:`Trend`: the median of pairwise slopes (tokens/hour), the
Mann–Kendall S statistic with the tie-corrected normal approximation (two-sided p-value) and the
fitted rise over the sampled span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NS_PER_HOUR = 3_600_000_000_000
MAX_POINTS = 600  # evenly subsampled above this (pairwise work is O(n^2))


@dataclass(frozen=True)
class Trend:
    n: int
    slope_tokens_per_hour: float
    p_value: float
    rise_tokens: float  # fitted rise over the sampled span
    first: float
    last: float

    def to_dict(self) -> dict:
        return {"samples": self.n, "slope_tokens_per_hour": round(self.slope_tokens_per_hour, 3),
                "p_value": float(f"{self.p_value:.4g}"), "rise_tokens": round(self.rise_tokens, 1),
                "first_tokens": self.first, "last_tokens": self.last}


def trend(t_ns: np.ndarray, values: np.ndarray) -> Trend:
    """Theil–Sen slope and Mann–Kendall p-value of ``values`` over time ``t_ns``."""
    t = np.asarray(t_ns, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    n = len(y)
    if n < 3 or t[-1] <= t[0]:
        return Trend(n, 0.0, 1.0, 0.0, float(y[0]) if n else 0.0, float(y[-1]) if n else 0.0)
    if n > MAX_POINTS:
        idx = np.linspace(0, n - 1, MAX_POINTS).round().astype(int)
        t, y = t[idx], y[idx]
        n = MAX_POINTS
    i, j = np.triu_indices(n, k=1)
    dt = t[j] - t[i]
    dy = y[j] - y[i]
    ok = dt > 0
    slope_per_ns = float(np.median(dy[ok] / dt[ok])) if np.any(ok) else 0.0
    s = float(np.sign(dy).sum())
    _, counts = np.unique(y, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
    if var <= 0:
        p = 1.0
    else:
        z = (s - np.sign(s)) / math.sqrt(var) if s != 0 else 0.0
        p = math.erfc(abs(z) / math.sqrt(2.0))
    return Trend(n, slope_per_ns * NS_PER_HOUR, p, slope_per_ns * (t[-1] - t[0]), float(y[0]), float(y[-1]))
