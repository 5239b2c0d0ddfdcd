"""``long_context``: prompts longer than ``chunked_prefill_size``, so chunked prefill matters.

A unit is a long document (log-uniform between ``min_prefill_chunks`` and
``max_prefill_chunks`` times ``chunked_prefill_size`` tokens) asked one or more questions; each
question re-sends the document with a new question (not the previous answers), so follow-ups
share the document's blocks only. Documents are capped so that document + question stays
within ``max_context_tokens``.

Defaults: chunked_prefill_size = 8192 is SGLang 0.5.23's default on 80-160 GB GPUs (H100,
H200; ``srt/arg_groups/memory_hook.py``); the 1.5x-16x range (12k-128k tokens) puts every
prompt in 2 to 16 chunks. Question/output sizes and follow-up rate are our own choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.shapes.base import (
    RequestPlan,
    UnitPlan,
    geometric_turns,
    log_uniform_int,
    lognormal_int,
    lognormal_s,
)


@dataclass(frozen=True)
class LongContextConfig:
    """Parameters of the ``long_context`` shape."""

    chunked_prefill_size: int = 8192
    min_prefill_chunks: float = 1.5
    max_prefill_chunks: float = 16.0
    mean_questions: float = 1.5
    max_questions: int = 8
    question_tokens_median: int = 100
    question_tokens_sigma: float = 0.8
    output_tokens_median: int = 300
    output_tokens_sigma: float = 0.8
    max_new_tokens: int = 4096
    think_time_median_s: float = 20.0
    think_time_sigma: float = 0.8
    decode_ms_per_token: float = 30.0
    max_context_tokens: int = 131072


def plan_long_context(cfg: LongContextConfig, rng: np.random.Generator, prefix: str) -> UnitPlan:
    """Plan one document with its questions.

    Args:
        cfg: shape parameters.
        rng: the generator's random stream.
        prefix: unique name of this unit.

    Returns:
        The unit (one request per question, every prompt > chunked_prefill_size).
    """
    unit = UnitPlan()
    lo = int(cfg.min_prefill_chunks * cfg.chunked_prefill_size) + 1
    hi = max(lo, min(int(cfg.max_prefill_chunks * cfg.chunked_prefill_size), cfg.max_context_tokens - 1024))
    doc = unit.add_segment((prefix, "document"), log_uniform_int(rng, lo, hi))
    t = 0.0
    for k in range(geometric_turns(rng, cfg.mean_questions, cfg.max_questions)):
        q_len = lognormal_int(rng, cfg.question_tokens_median, cfg.question_tokens_sigma, 1, 1024)
        q = unit.add_segment((prefix, "question", k), q_len)
        out = lognormal_int(rng, cfg.output_tokens_median, cfg.output_tokens_sigma, 1, cfg.max_new_tokens)
        unit.requests.append(RequestPlan(t, k, (doc, q), out, cfg.max_new_tokens))
        t += out * cfg.decode_ms_per_token / 1e3 + lognormal_s(rng, cfg.think_time_median_s, cfg.think_time_sigma)
    return unit
