"""``agentic``: tool-using agent runs with long, growing contexts (32k-128k tokens).

A run starts from a shared agent prompt (system prompt + tool definitions, one of a few, Zipf
popular) plus a private task/repository context, so its first request is 32k-48k tokens. Each
step appends the model's (short) output and a tool result, and the next request re-sends the
whole context; the run ends when the next step would pass its final context size, drawn in
64k-128k. Steps follow each other after the output's decode time plus a tool latency.

Defaults and where they come from:
- agent prompt 12k-20k tokens: the SemiAnalysis Claude Code trace dataset
  (semianalysisai/cc-traces-weka-042026) reports ~12.4k-13k tool tokens plus 2.7k-7.5k system
  tokens per session.
- output_tokens_median = 150: same dataset's per-request outputs (~150-250 tokens); TraceLab
  (arXiv 2606.30560) characterizes coding agents as "long contexts with short outputs".
- tool_latency_median_s = 1.6: p50 inter-turn gap of a production agentic (Qwen3-Coder) trace
  per a third-party analysis (gahow/agentic-kvc).
- context bounds 32k-128k: the issue's specification. Tool output sizes, sigmas: our choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.shapes.base import RequestPlan, UnitPlan, lognormal_int, lognormal_s, zipf_weights
from replay.workloads.shapes.multi_turn import system_prompt_tokens


@dataclass(frozen=True)
class AgenticConfig:
    """Parameters of the ``agentic`` shape."""

    num_agent_prompts: int = 4
    agent_prompt_zipf_s: float = 1.0
    agent_prompt_tokens_min: int = 12000
    agent_prompt_tokens_max: int = 20000
    initial_context_tokens_min: int = 32768
    initial_context_tokens_max: int = 49152
    final_context_tokens_min: int = 65536
    final_context_tokens_max: int = 131072
    output_tokens_median: int = 150
    output_tokens_sigma: float = 0.8
    max_new_tokens: int = 8192
    tool_output_tokens_median: int = 1200
    tool_output_tokens_sigma: float = 1.2
    tool_latency_median_s: float = 1.6
    tool_latency_sigma: float = 1.2
    decode_ms_per_token: float = 30.0
    max_steps: int = 400


def plan_agentic(cfg: AgenticConfig, rng: np.random.Generator, prefix: str) -> UnitPlan:
    """Plan one agent run (see module docstring).

    Args:
        cfg: shape parameters.
        rng: the generator's random stream.
        prefix: unique name of this unit.

    Returns:
        The run's segments and requests (at least one).
    """
    unit = UnitPlan()
    ap = int(rng.choice(cfg.num_agent_prompts, p=zipf_weights(cfg.num_agent_prompts, cfg.agent_prompt_zipf_s)))
    ap_len = system_prompt_tokens(
        "agentic/agent_prompt", ap, cfg.agent_prompt_tokens_min, cfg.agent_prompt_tokens_max
    )
    initial = int(rng.integers(cfg.initial_context_tokens_min, cfg.initial_context_tokens_max + 1))
    final = int(rng.integers(max(initial, cfg.final_context_tokens_min), max(initial, cfg.final_context_tokens_max) + 1))
    prompt = [unit.add_segment(("agentic/agent_prompt", ap), ap_len)]
    prompt.append(unit.add_segment((prefix, "task"), max(1, initial - ap_len)))
    used = max(initial, ap_len + 1)
    t = 0.0
    for k in range(cfg.max_steps):
        out = lognormal_int(rng, cfg.output_tokens_median, cfg.output_tokens_sigma, 1, cfg.max_new_tokens)
        unit.requests.append(RequestPlan(t, k, tuple(prompt), out, cfg.max_new_tokens))
        tool = lognormal_int(rng, cfg.tool_output_tokens_median, cfg.tool_output_tokens_sigma, 1, final)
        if used + out + tool > final:
            break
        prompt.append(unit.add_segment((prefix, "output", k), out))
        prompt.append(unit.add_segment((prefix, "tool", k), tool))
        used += out + tool
        t += out * cfg.decode_ms_per_token / 1e3 + lognormal_s(rng, cfg.tool_latency_median_s, cfg.tool_latency_sigma)
    return unit
