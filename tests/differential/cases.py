"""Randomized small workloads and matching settings for the differential suite.

Each case: a seed (the workload), page size, window, pool sizes, HiCache on/off. Workloads are
tiny (a few dozen requests of a few pages, shared prefixes from a few bases, multi-turn sessions)
so both backends replay each in about a second.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from replay.backends.sglang.workload import write_workload


@dataclass(frozen=True)
class Case:
    seed: int
    page_size: int
    window: int
    full_pool_tokens: int
    swa_pool_tokens: int
    host_pool_tokens: int = 0
    num_requests: int = 24

    @property
    def name(self) -> str:
        host = f"-host{self.host_pool_tokens}" if self.host_pool_tokens else ""
        return f"s{self.seed}-ps{self.page_size}-w{self.window}-full{self.full_pool_tokens}{host}"

    def sets(self) -> list[str]:
        ps = self.page_size
        return [f"page_size={ps}", f"sliding_window_tokens={self.window}",
                f"full_pool_tokens={self.full_pool_tokens}", f"swa_pool_tokens={self.swa_pool_tokens}",
                f"host_pool_tokens={self.host_pool_tokens}", "max_running_requests=8",
                f"chunked_prefill_size={8 * ps}", f"max_prefill_tokens={16 * ps}",
                f"swa_eviction_interval_tokens={max(ps, 8)}"]


def _cases() -> list[Case]:
    out = []
    grid = [(1, 8), (1, 24), (16, 8), (16, 32), (64, 32), (64, 96)]  # windows below and above the page
    seed = 0
    for ps, w in grid:
        # roomy, pressured (evictions + retractions), and HiCache
        full = 64 * ps * 4
        out.append(Case(seed, ps, w, full, max(4 * w, 16 * ps)))
        seed += 1
        out.append(Case(seed, ps, w, 24 * ps, max(2 * w + 2 * ps, 8 * ps)))
        seed += 1
        out.append(Case(seed, ps, w, 32 * ps, max(3 * w, 12 * ps), host_pool_tokens=64 * ps))
        seed += 1
    out.append(Case(seed, 16, 32, 20 * 16, 160, num_requests=40))
    out.append(Case(seed + 1, 1, 16, 160, 96, num_requests=40))
    return out


CASES = _cases()


def write_case_workload(case: Case, path) -> None:
    """The case's workload: sessions over a few shared bases, prompts of 1..6 pages."""
    rng = random.Random(case.seed)
    ps = case.page_size
    block = ps
    bases = [[rng.getrandbits(62) for _ in range(8)] for _ in range(3)]
    rows, t = [], 0
    sessions: dict[int, list[int]] = {}
    for i in range(case.num_requests):
        t += rng.randint(0, 3) * 5_000_000
        if sessions and rng.random() < 0.3:
            sid = rng.choice(list(sessions))
            hashes = sessions[sid] + [rng.getrandbits(62) for _ in range(rng.randint(1, 2))]
        else:
            sid = len(sessions)
            base = rng.choice(bases)
            hashes = base[:rng.randint(0, 4)] + [rng.getrandbits(62) for _ in range(rng.randint(1, 3))]
        hashes = hashes[:6]
        sessions[sid] = hashes
        n_tokens = len(hashes) * block - rng.randint(0, block - 1)
        out_len = rng.randint(1, 3 * max(ps, 8))
        rows.append(dict(rid=i, ts_ns=t, input_len=n_tokens, page_hashes=hashes, session_id=sid,
                         max_new_tokens=out_len, output_len=out_len))
    write_workload(path, rows, hash_block_tokens=block)
