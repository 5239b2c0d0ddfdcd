"""The reference backend's page keys, built the fast way (pages in a sequence's leading run of
hash-block tokens keyed from the block hashes, the rest from token ids synthesized lazily, a slice
at a time), have exactly the equalities of keys hashed from the whole token sequences: across every
request of the bundled workloads at page sizes that are multiples, divisors or neither of the hash
block, prompt and output pages both, a page's fast key and its token key correspond one to one."""

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


def _one_to_one(pairs) -> None:
    fwd, back = {}, {}
    for fast, slow in pairs:
        assert fwd.setdefault(fast, slow) == slow, "one fast key for two token prefixes"
        assert back.setdefault(slow, fast) == fast, "two fast keys for one token prefix"


@pytest.mark.parametrize("ps", (1, 8, 16, 48, 64, 24))
@pytest.mark.parametrize("name", ("multi_turn", "agentic", "mixed", "shared_prefix"))
def test_fast_keys_have_the_equalities_of_token_keys(name, ps):
    wl = read_workload(WORKLOADS / name)
    wl.__dict__["requests"] = wl.requests[:150]
    values, _ = resolve("swa-fixes", [f"page_size={ps}", "full_pool_tokens=" + str(ps << 20)],
                        wl.manifest.get("server"))
    pairs, block_pages, shared = [], 0, 0
    with ReferenceBackend(wl, from_knobs(values)) as be:
        be.clock_ns = max(w.arrival_ns for w in wl.requests)
        be._admit_arrivals()
        reqs = list(be._active.values())
        for req in reqs:
            whole = PageKeys(be._synth._sequence(req.wreq, req.input_len), ps, list(req.plan))
            a = req.keys.up_to(req.input_len // 2)  # lazily, in two pieces, as a chunked prefill
            assert a == req.keys.up_to(req.input_len)[:len(a)]
            req.output_ids.extend(req.plan)  # the output pages, as the decode appends them
            n = req.input_len + len(req.plan)
            fast, slow = req.keys.up_to(n), whole.up_to(n)
            assert len(fast) == len(slow) == n // ps, req.rid
            pairs += zip(fast, slow)
            block_pages += req.keys._block_pages
    _one_to_one(pairs)
    fast_keys = {f for f, _ in pairs}
    shared = len(pairs) - len(fast_keys)
    assert reqs and shared > 0, "no page shared between requests: the check says nothing"
    if ps % wl.hash_block_tokens == 0 or wl.hash_block_tokens % ps == 0:
        assert block_pages > 0, "no page keyed from block hashes"


def test_copied_outputs_share_the_next_turns_pages():
    """A turn whose prompt ends on a block boundary generates the next turn's tokens: its output
    pages (keyed from the next turn's block hashes) are the next turn's prompt pages."""
    wl = read_workload(WORKLOADS / "multi_turn")
    values, _ = resolve("swa-fixes", ["page_size=16", "full_pool_tokens=" + str(1 << 24)], wl.manifest.get("server"))
    found = 0
    with ReferenceBackend(wl, from_knobs(values)) as be:
        be.clock_ns = max(w.arrival_ns for w in wl.requests)
        be._admit_arrivals()
        reqs = {r.rid: r for r in be._active.values()}
        for req in reqs.values():
            nxt, shared = be._synth._copied_from(req.wreq)
            if nxt is None or nxt.rid not in reqs or req.input_len % 16 or shared < 32:
                continue
            req.output_ids.extend(req.plan)
            pages = (req.input_len + shared - 1) // 16
            assert req.keys._block_pages > req.input_len // 16
            mine = req.keys.up_to(pages * 16)
            theirs = reqs[nxt.rid].keys.up_to(pages * 16)
            assert mine == theirs
            found += 1
    if not found:
        pytest.skip("multi_turn has no turn ending on a block boundary whose next turn is loaded")


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
