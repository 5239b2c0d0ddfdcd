"""Inter-arrival times of units (sessions, runs, requests): Poisson or bursty Gamma."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.errors import WorkloadError

ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True)
class ArrivalProcess:
    """A renewal process of unit starts.

    Args:
        kind: 'poisson' (exponential gaps) or 'gamma' (Gamma gaps with coefficient of
            variation ``cv``; cv > 1 is burstier than Poisson, cv = 1 is Poisson).
        rate_per_s: mean unit starts per second.
        cv: coefficient of variation of the gaps (gamma only).
    """

    kind: str
    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self):
        if self.kind not in ARRIVALS:
            raise WorkloadError(f"unknown arrival process {self.kind!r}; known: {', '.join(ARRIVALS)}")
        if not self.rate_per_s > 0:
            raise WorkloadError(f"arrival rate must be > 0 (got {self.rate_per_s})")
        if self.kind == "gamma" and not self.cv > 0:
            raise WorkloadError(f"gamma arrivals need cv > 0 (got {self.cv})")

    def gap_s(self, rng: np.random.Generator) -> float:
        """One inter-arrival gap in seconds."""
        if self.kind == "poisson":
            return float(rng.exponential(1.0 / self.rate_per_s))
        k = 1.0 / (self.cv * self.cv)
        return float(rng.gamma(k, 1.0 / (self.rate_per_s * k)))
