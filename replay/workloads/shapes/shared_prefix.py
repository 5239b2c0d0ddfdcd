"""``shared_prefix``: many independent single-turn requests over a few long common prefixes.

Each request = one of ``num_prefixes`` long prefixes (few-shot template, document, API system
prompt; Zipf popular) + a private suffix. This is the to-B API pattern of the Qwen-Bailian
traces: "KVCache Cache in the Wild" (Wang et al., USENIX ATC'25, arXiv 2506.02634) finds
single-turn requests carry 97% of cache hits in the to-B trace, thanks to shared system
prompts, with fewer than 0.1% multi-turn requests and most reuses within 10 s. Prefix and
suffix sizes and the Zipf exponent are our own choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.shapes.base import RequestPlan, UnitPlan, lognormal_int, zipf_weights
from replay.workloads.shapes.multi_turn import system_prompt_tokens


@dataclass(frozen=True)
class SharedPrefixConfig:
    """Parameters of the ``shared_prefix`` shape."""

    num_prefixes: int = 4
    prefix_zipf_s: float = 1.0
    prefix_tokens_min: int = 4096
    prefix_tokens_max: int = 16384
    suffix_tokens_median: int = 400
    suffix_tokens_sigma: float = 1.0
    output_tokens_median: int = 150
    output_tokens_sigma: float = 0.8
    max_new_tokens: int = 2048


def plan_shared_prefix(cfg: SharedPrefixConfig, rng: np.random.Generator, prefix: str) -> UnitPlan:
    """Plan one request: a shared prefix and a private suffix.

    Args:
        cfg: shape parameters.
        rng: the generator's random stream.
        prefix: unique name of this unit.

    Returns:
        A unit with one request.
    """
    unit = UnitPlan()
    p = int(rng.choice(cfg.num_prefixes, p=zipf_weights(cfg.num_prefixes, cfg.prefix_zipf_s)))
    p_len = system_prompt_tokens("shared_prefix/prefix", p, cfg.prefix_tokens_min, cfg.prefix_tokens_max)
    suffix = lognormal_int(rng, cfg.suffix_tokens_median, cfg.suffix_tokens_sigma, 1, 1 << 20)
    out = lognormal_int(rng, cfg.output_tokens_median, cfg.output_tokens_sigma, 1, cfg.max_new_tokens)
    a = unit.add_segment(("shared_prefix/prefix", p), p_len)
    b = unit.add_segment((prefix, "suffix"), suffix)
    unit.requests.append(RequestPlan(0.0, 0, (a, b), out, cfg.max_new_tokens))
    return unit
