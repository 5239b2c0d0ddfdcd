"""Small workloads and settings that replay in about a second per run."""

from __future__ import annotations

import numpy as np
import pytest

#: small pools under memory pressure, so policies differ on a few dozen requests
SMALL = ("full_pool_tokens=16384", "swa_full_tokens_ratio=0.25", "chunked_prefill_size=1024",
         "max_prefill_tokens=2048", "max_running_requests=4")


def multi_turn_rows(sessions: int = 3, turns: int = 4, turn_tokens: int = 768, output_tokens: int = 24,
                    gap_ns: int = 150_000_000) -> list[dict]:
    """Sessions whose every turn repeats the session's history plus ``turn_tokens`` new tokens."""
    from tracer.schema.hashing import page_hashes_from_keys

    rows, rid = [], 0
    blocks = turn_tokens // 16
    for t in range(turns):
        for s in range(sessions):
            keys = np.arange(blocks * (t + 1), dtype=np.uint64) + np.uint64(1_000_000 * (s + 1))
            rows.append({"rid": rid, "ts_ns": rid * gap_ns, "session_id": s, "turn": t,
                         "input_len": blocks * (t + 1) * 16, "output_len": output_tokens,
                         "max_new_tokens": output_tokens, "page_hashes": page_hashes_from_keys(keys)})
            rid += 1
    return rows


@pytest.fixture(scope="session")
def small_workload(tmp_path_factory):
    from replay.backends.sglang import write_workload

    return write_workload(tmp_path_factory.mktemp("wl") / "w", multi_turn_rows(), hash_block_tokens=16)
