"""The reference backend's page keys, built the fast way (prompt tokens synthesized lazily, a
slice at a time; the leading pages of a new request adopted from its session's previous turn, or
from the last request that began with the same hash block, where their hash blocks are equal), are the keys of the whole token sequence hashed from scratch, for
every request of the bundled workloads at several page sizes, prompt and output pages both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replay.backends.reference.keys import PageKeys
from replay.backends.reference.scheduler import ReferenceBackend
from replay.backends.reference.settings import from_knobs
from replay.knobs import resolve
from replay.workloads import read_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


@pytest.mark.parametrize("ps", (1, 16, 64))
@pytest.mark.parametrize("name", ("multi_turn", "agentic", "mixed", "shared_prefix"))
def test_fast_keys_are_the_keys_of_the_whole_sequence(name, ps):
    wl = read_workload(WORKLOADS / name)
    wl.__dict__["requests"] = wl.requests[:150]
    values, _ = resolve("swa-fixes", [f"page_size={ps}", "full_pool_tokens=" + str(1 << 24)],
                        wl.manifest.get("server"))
    with ReferenceBackend(wl, from_knobs(values)) as be:
        be.clock_ns = max(w.arrival_ns for w in wl.requests)
        be._admit_arrivals()
        reqs = list(be._active.values())
        adopted = 0
        for req in reqs:
            adopted += len(req.keys.keys) > 0  # keys taken from an earlier request at arrival
            whole = PageKeys(be._synth._sequence(req.wreq, req.input_len), ps, list(req.plan))
            assert req.keys.up_to(req.input_len) == whole.up_to(req.input_len), req.rid
            req.output_ids.extend(req.plan)  # the output pages, as the decode appends them
            n = req.input_len + len(req.plan)
            assert req.keys.up_to(n) == whole.up_to(n), req.rid
    assert reqs
    if name in ("multi_turn", "shared_prefix") and ps % wl.hash_block_tokens == 0:
        assert adopted > 0, "no request adopted an earlier request's keys"


def test_sequence_slice_is_the_slice_of_the_sequence():
    from replay.backends.sglang.tokens import TokenSynth

    wl = read_workload(WORKLOADS / "mixed")
    syn = TokenSynth(wl)
    rng = np.random.default_rng(0)
    for w in wl.requests[:100]:
        n = w.input_len + 40
        full = syn._sequence(w, n)
        for a, b in rng.integers(0, n + 1, size=(6, 2)):
            a, b = min(a, b), max(a, b)
            assert np.array_equal(syn.sequence_slice(w, int(a), int(b)), full[a:b])
