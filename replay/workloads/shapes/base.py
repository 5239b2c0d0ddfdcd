"""Building blocks shared by the shapes: the unit plan and seeded samplers.

A shape plans *units*: a chat session, an agent run, one shared-prefix request, a document
with its follow-up questions. A unit owns synthetic content *segments* (a system prompt, a user
message, an answer, a tool output...), each a run of tokens named by a 64-bit key, and a list
of requests, each a prompt made of some of those segments plus planned output and arrival
offset. Equal segment keys at equal positions mean equal tokens, which is what the page hashes
encode (``hashing.segment_block_keys``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from replay.workloads.hashing import name_key


@dataclass(frozen=True)
class RequestPlan:
    """One planned request of a unit.

    Args:
        offset_s: arrival time relative to the unit's start, seconds.
        turn: 0-based turn within the unit.
        prompt: indices into the unit's segments, in prompt order.
        output_len: planned generated tokens (<= max_new_tokens).
        max_new_tokens: generation cap sent with the request.
    """

    offset_s: float
    turn: int
    prompt: tuple[int, ...]
    output_len: int
    max_new_tokens: int


@dataclass
class UnitPlan:
    """Segments (key, tokens) and the requests built from them."""

    seg_keys: list[int | tuple] = field(default_factory=list)
    seg_tokens: list[int] = field(default_factory=list)
    requests: list[RequestPlan] = field(default_factory=list)

    def add_segment(self, key: int | tuple, num_tokens: int) -> int:
        """Append a segment; returns its index.

        Args:
            key: a 64-bit key, or a tuple of name parts turned into one by
                ``hashing.name_key(*parts)`` only if the unit is written (planning stays cheap).
            num_tokens: segment length.
        """
        self.seg_keys.append(key)
        self.seg_tokens.append(int(num_tokens))
        return len(self.seg_keys) - 1

    def prompt_tokens(self, prompt: tuple[int, ...]) -> int:
        return sum(self.seg_tokens[i] for i in prompt)

    def segment_key(self, i: int) -> int:
        """The 64-bit key of segment ``i``."""
        k = self.seg_keys[i]
        return k if isinstance(k, int) else name_key(*k)


def lognormal_int(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    """One integer draw from a log-normal with the given median, clipped to [lo, hi]."""
    x = rng.lognormal(math.log(max(median, 1e-9)), sigma) if sigma > 0 else median
    if not math.isfinite(x):  # a huge sigma overflows the draw to inf (or 0 below)
        return int(hi if x > 0 else lo)
    return int(min(max(round(x), lo), hi))


def lognormal_s(rng: np.random.Generator, median_s: float, sigma: float) -> float:
    """One log-normal duration draw (seconds) with the given median."""
    if median_s <= 0:
        return 0.0
    return float(rng.lognormal(math.log(median_s), sigma)) if sigma > 0 else float(median_s)


def log_uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """One integer uniform in log space between lo and hi (inclusive)."""
    if hi <= lo:
        return int(lo)
    return int(min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Normalized Zipf popularity of ranks 1..n: p(k) ∝ k**-s."""
    w = np.arange(1, n + 1, dtype=float) ** (-s)
    return w / w.sum()


def geometric_turns(rng: np.random.Generator, mean: float, max_turns: int) -> int:
    """Turns per session: geometric on {1, 2, ...} with the given mean, capped at max_turns."""
    p = 1.0 / max(mean, 1.0)
    return int(min(rng.geometric(p), max_turns))


def geometric_mean_capped(mean: float, max_turns: int) -> float:
    """Exact mean of ``geometric_turns(rng, mean, max_turns)``: (1 - (1 - p)**max) / p, written
    with ``log1p``/``expm1`` so that a tiny p (a huge mean) does not round ``1 - p`` to 1 (a
    mean of 0 requests per unit)."""
    p = 1.0 / max(mean, 1.0)
    return -math.expm1(max_turns * math.log1p(-p)) / p if p < 1.0 else 1.0
