"""``multi_turn``: chat sessions whose every turn re-sends the whole conversation.

Turn k+1's prompt = turn k's prompt + turn k's answer + a new user message, so consecutive
turns of a session share all but their last page hashes. Sessions start with one of
``num_system_prompts`` shared system prompts chosen with Zipf popularity, so different sessions
share the system prompt's full blocks (and nothing after it). The gap between two turns is the
answer's decode time plus a log-normal user think time.

Defaults and where they come from (docs/workloads.md has the full table):
- output_tokens_median = 350: output p50 of the Mooncake FAST'25 conversation trace.
- think_time_median_s = 7.2: p50 inter-turn gap (previous answer end to next request) measured
  on a Qwen-Bailian chatbot trace by a third-party analysis (gahow/agentic-kvc).
- first_user_tokens_median = 3000: chosen so that the input p50 over all turns lands near the
  Mooncake conversation trace's 6.9k tokens (we measure ~6.6k).
- mean_turns, Zipf exponent, prompt sizes, sigmas, decode speed: our own choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.hashing import name_key
from replay.workloads.shapes.base import (
    RequestPlan,
    UnitPlan,
    geometric_turns,
    lognormal_int,
    lognormal_s,
    zipf_weights,
)


@dataclass(frozen=True)
class MultiTurnConfig:
    """Parameters of the ``multi_turn`` shape (token counts are per message)."""

    num_system_prompts: int = 16
    system_prompt_zipf_s: float = 1.0
    system_prompt_tokens_min: int = 256
    system_prompt_tokens_max: int = 4096
    mean_turns: float = 4.0
    max_turns: int = 32
    first_user_tokens_median: int = 3000
    first_user_tokens_sigma: float = 1.0
    followup_user_tokens_median: int = 300
    followup_user_tokens_sigma: float = 1.0
    output_tokens_median: int = 350
    output_tokens_sigma: float = 0.8
    max_new_tokens: int = 4096
    think_time_median_s: float = 7.2
    think_time_sigma: float = 0.7
    decode_ms_per_token: float = 30.0
    max_context_tokens: int = 131072


def system_prompt_tokens(namespace: str, index: int, lo: int, hi: int) -> int:
    """Fixed length of shared prompt ``index`` (log-uniform in [lo, hi], from its name)."""
    if hi <= lo:
        return int(lo)
    u = name_key(namespace, "length", index) / 2.0**64
    return int(round(np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))))


def plan_multi_turn(cfg: MultiTurnConfig, rng: np.random.Generator, prefix: str) -> UnitPlan:
    """Plan one chat session.

    Args:
        cfg: shape parameters.
        rng: the generator's random stream.
        prefix: unique name of this unit (keys its private segments).

    Returns:
        The session's segments and requests (at least one).
    """
    unit = UnitPlan()
    sp = int(rng.choice(cfg.num_system_prompts, p=zipf_weights(cfg.num_system_prompts, cfg.system_prompt_zipf_s)))
    sp_len = system_prompt_tokens(
        "multi_turn/system", sp, cfg.system_prompt_tokens_min, cfg.system_prompt_tokens_max
    )
    prompt = [unit.add_segment(("multi_turn/system", sp), sp_len)]
    used = sp_len
    turns = geometric_turns(rng, cfg.mean_turns, cfg.max_turns)
    t = 0.0
    for k in range(turns):
        if k == 0:
            user = lognormal_int(rng, cfg.first_user_tokens_median, cfg.first_user_tokens_sigma, 1, cfg.max_context_tokens)
            user = max(1, min(user, cfg.max_context_tokens - used - 1))
        else:
            user = lognormal_int(rng, cfg.followup_user_tokens_median, cfg.followup_user_tokens_sigma, 1, cfg.max_context_tokens)
        out = lognormal_int(rng, cfg.output_tokens_median, cfg.output_tokens_sigma, 1, cfg.max_new_tokens)
        if k > 0 and used + user + 1 > cfg.max_context_tokens:
            break  # the conversation no longer fits the context window: the session ends
        prompt.append(unit.add_segment((prefix, "user", k), user))
        used += user
        out = min(out, cfg.max_context_tokens - used)
        unit.requests.append(RequestPlan(t, k, tuple(prompt), out, cfg.max_new_tokens))
        prompt.append(unit.add_segment((prefix, "answer", k), out))
        used += out
        t += out * cfg.decode_ms_per_token / 1e3 + lognormal_s(rng, cfg.think_time_median_s, cfg.think_time_sigma)
    return unit
