"""Workload shapes: a registry of named request-stream generators.

Each shape has a frozen config dataclass (saved in the manifest's ``workload.parameters``) and a
``plan(cfg, rng, prefix) -> UnitPlan`` function that plans one unit (session, agent run, ...).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from replay.workloads.errors import WorkloadError
from replay.workloads.shapes.agentic import AgenticConfig, plan_agentic
from replay.workloads.shapes.base import UnitPlan, geometric_mean_capped
from replay.workloads.shapes.long_context import LongContextConfig, plan_long_context
from replay.workloads.shapes.mixed import MixedConfig, estimate_mixed, plan_mixed
from replay.workloads.shapes.multi_turn import MultiTurnConfig, plan_multi_turn
from replay.workloads.shapes.shared_prefix import SharedPrefixConfig, plan_shared_prefix


@dataclass(frozen=True)
class Shape:
    """A registered shape.

    Args:
        name: registry name (``--shape``).
        config_cls: frozen dataclass of its parameters.
        plan: plans one unit.
        default_qps: request rate used when ``--qps`` is not given.
        default_arrival: 'poisson' or 'gamma' for unit starts.
        default_cv: coefficient of variation of Gamma inter-arrivals.
        summary: one line for ``--help`` and ``kvtrace workload shapes``.
        estimate: optional exact ``cfg -> (mean requests per unit, unit span p99 s)``; the
            default estimates both from sampled units.
        mean_requests: optional exact ``cfg -> mean requests per unit`` (the span is still
            sampled); sampling 2000 units leaves ~1-2% error in the mean, hence in the rate.
    """

    name: str
    config_cls: type
    plan: Callable[[Any, np.random.Generator, str], UnitPlan]
    default_qps: float
    summary: str
    default_arrival: str = "poisson"
    default_cv: float = 1.0
    estimate: Callable[[Any], tuple[float, float]] | None = None
    mean_requests: Callable[[Any], float] | None = None


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("multi_turn", MultiTurnConfig, plan_multi_turn, 3.4,
              "chat sessions, each turn re-sends history + answer + new message; Zipf system prompts",
              mean_requests=lambda c: geometric_mean_capped(c.mean_turns, c.max_turns)),
        Shape("agentic", AgenticConfig, plan_agentic, 0.5,
              "agent runs, tool outputs appended, contexts growing 32k-128k tokens"),
        Shape("shared_prefix", SharedPrefixConfig, plan_shared_prefix, 5.0,
              "independent requests over a few long common prefixes", mean_requests=lambda c: 1.0),
        Shape("long_context", LongContextConfig, plan_long_context, 0.5,
              "documents longer than chunked_prefill_size, with follow-up questions",
              mean_requests=lambda c: geometric_mean_capped(c.mean_questions, c.max_questions)),
        Shape("mixed", MixedConfig, plan_mixed, 3.4,
              "weighted mix of the shapes above, bursty Gamma arrivals (CV 2)", "gamma", 2.0,
              estimate_mixed),
    )
}


def get_shape(name: str) -> Shape:
    """The shape registered as ``name``; WorkloadError listing the known ones otherwise."""
    try:
        return SHAPES[name]
    except KeyError:
        raise WorkloadError(f"unknown shape {name!r}; known shapes: {', '.join(SHAPES)}") from None


def make_config(shape: Shape, overrides: dict[str, str] | None = None):
    """Build a shape's config from string overrides (``--set key=value``).

    Args:
        shape: the shape.
        overrides: field name -> value as text (converted with the field's type).

    Returns:
        The frozen config.

    Raises:
        WorkloadError: unknown field (the known ones are listed) or unparsable value.
    """
    known = {f.name: f for f in fields(shape.config_cls)}
    kwargs = {}
    for key, text in (overrides or {}).items():
        if key not in known:
            raise WorkloadError(f"shape {shape.name!r} has no parameter {key!r}; known: {', '.join(known)}")
        default = getattr(shape.config_cls(), key)
        try:
            if isinstance(default, bool):
                if str(text).lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                kwargs[key] = str(text).lower() in ("true", "1")
            else:
                kwargs[key] = type(default)(text)
        except ValueError:
            raise WorkloadError(f"{shape.name}.{key}: cannot parse {text!r} as {type(default).__name__}") from None
    return shape.config_cls(**kwargs)


ESTIMATE_MAX_REQUESTS = 50_000  # the defaults plan <= 47k requests in 2000 units (agentic: 46,282)
ESTIMATE_MIN_UNITS = 20


@functools.lru_cache(maxsize=64)
def unit_stats(shape: Shape, cfg, samples: int = 2000) -> tuple[float, float]:
    """Mean requests per unit and the 99th percentile of a unit's span (first to last arrival).

    Estimated from ``samples`` units planned with a fixed private seed, so it does not depend on
    (or consume) the workload's seed; sampling stops early (after at least
    ``ESTIMATE_MIN_UNITS`` units) once ``ESTIMATE_MAX_REQUESTS`` requests were planned.

    Returns:
        (mean_requests_per_unit, span_p99_s)
    """
    if shape.estimate is not None:
        return shape.estimate(cfg)
    rng = np.random.default_rng(0x5EED)
    counts, spans = [], []
    planned = 0  # requests planned so far: the sampling's work budget (deterministic)
    for i in range(samples):
        u = shape.plan(cfg, rng, f"estimate/{i}")
        counts.append(len(u.requests))
        spans.append(u.requests[-1].offset_s)
        planned += len(u.requests)
        if planned >= ESTIMATE_MAX_REQUESTS and i + 1 >= ESTIMATE_MIN_UNITS:
            break  # units with thousands of requests (e.g. tiny agent tool outputs): enough
    mean = shape.mean_requests(cfg) if shape.mean_requests is not None else float(np.mean(counts))
    return float(mean), float(np.percentile(spans, 99))
