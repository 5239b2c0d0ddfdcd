"""DeepSeek-V4-shaped cases of the differential suite: page 256, window 128, SWA at the DSV4 ratio
0.1 of the full pool (``kv_stack=dsv4``), roomy / pressured / HiCache, on the seeded small
workloads of :mod:`tests.differential.cases` (prompts of 1..6 pages, shared bases, sessions).

The reference backend runs them under ``fork-659`` (what post659 does, ``replay.knobs``) with the
fork's decode release cadence (``max(ps, W)`` floored to a page: 256 tokens); the fork backend
runs them with ``--code`` on post659 (its own behaviour: sizes only).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.differential.cases import Case

PS = 256
WINDOW = 128


@dataclass(frozen=True)
class Dsv4Case:
    name: str
    seed: int
    full_pool_tokens: int
    host_pool_tokens: int = 0
    num_requests: int = 24

    def workload_case(self) -> Case:
        """The :class:`tests.differential.cases.Case` whose workload this case replays."""
        swa = int(self.full_pool_tokens * 0.1) // PS * PS
        return Case(self.seed, PS, WINDOW, self.full_pool_tokens, swa, self.host_pool_tokens, self.num_requests)

    def sets(self) -> list[str]:
        """Sizes both backends take (the fork refuses policy knobs: its code is its behaviour)."""
        return [f"page_size={PS}", f"sliding_window_tokens={WINDOW}", "kv_stack=dsv4",
                f"full_pool_tokens={self.full_pool_tokens}", "swa_pool_tokens=0", "swa_full_tokens_ratio=0.1",
                f"host_pool_tokens={self.host_pool_tokens}", "max_running_requests=8",
                f"chunked_prefill_size={8 * PS}", f"max_prefill_tokens={16 * PS}"]

    def reference_sets(self) -> list[str]:
        return self.sets() + [f"swa_eviction_interval_tokens={PS}"]


DSV4_CASES = (
    Dsv4Case("dsv4-roomy", 101, 64 * PS),            # SWA 1536 (6 pages)
    Dsv4Case("dsv4-pressured", 102, 40 * PS),        # SWA 1024 (4 pages): SWA waits, retractions
    Dsv4Case("dsv4-hicache", 103, 48 * PS, host_pool_tokens=96 * PS),  # SWA 1024, host 96/8 pages
)
