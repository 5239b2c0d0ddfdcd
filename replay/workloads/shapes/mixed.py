"""``mixed``: a weighted mix of the other shapes, by default with bursty arrivals.

The weights are shares of *requests*; a unit (session, run, request, document) of shape i is
started with probability proportional to ``weight_i / mean_requests_per_unit_i``. Arrivals of
units are Gamma-distributed with CV 2 by default (bursty; ``--arrival poisson`` for Poisson).
The weights (chat-dominated, with a to-B shared-prefix share and a small share of agent and
long-document traffic) and the CV are our own choices; each component keeps its own defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.shapes.base import UnitPlan


@dataclass(frozen=True)
class MixedConfig:
    """Share of requests per component shape (need not sum to 1; normalized)."""

    weight_multi_turn: float = 0.55
    weight_shared_prefix: float = 0.25
    weight_agentic: float = 0.10
    weight_long_context: float = 0.10


COMPONENTS = ("multi_turn", "shared_prefix", "agentic", "long_context")


def component_probabilities(cfg: MixedConfig) -> np.ndarray:
    """Probability that a new unit is of each component, so request shares match the weights."""
    from replay.workloads.shapes import SHAPES, unit_stats

    w = np.array([getattr(cfg, f"weight_{c}") for c in COMPONENTS], dtype=float)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("mixed: weights must be >= 0 with a positive sum")
    mean = np.array([unit_stats(SHAPES[c], SHAPES[c].config_cls())[0] for c in COMPONENTS])
    p = w / mean
    return p / p.sum()


def estimate_mixed(cfg: MixedConfig) -> tuple[float, float]:
    """Exact mean requests per unit (sum(w) / sum(w_i / m_i)) and the largest component span p99."""
    from replay.workloads.shapes import SHAPES, unit_stats

    stats = [unit_stats(SHAPES[c], SHAPES[c].config_cls()) for c in COMPONENTS]
    w = np.array([getattr(cfg, f"weight_{c}") for c in COMPONENTS], dtype=float)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("mixed: weights must be >= 0 with a positive sum")
    mean = w.sum() / sum(wi / m for wi, (m, _) in zip(w, stats))
    return float(mean), max(span for wi, (_, span) in zip(w, stats) if wi > 0)


def plan_mixed(cfg: MixedConfig, rng: np.random.Generator, prefix: str) -> UnitPlan:
    """Plan one unit of a component drawn by weight.

    Args:
        cfg: component weights.
        rng: the generator's random stream.
        prefix: unique name of this unit.

    Returns:
        The component's unit.
    """
    from replay.workloads.shapes import SHAPES

    c = COMPONENTS[int(rng.choice(len(COMPONENTS), p=component_probabilities(cfg)))]
    spec = SHAPES[c]
    return spec.plan(spec.config_cls(), rng, f"{prefix}/{c}")
