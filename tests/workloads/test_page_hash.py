"""The one page-hash function (tracer.schema.hashing, kvtrace-chain-v1) and its entry points."""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.workloads import hashing as workload_hashing
from replay.workloads.io import workload_manifest
from tracer.schema import MANIFEST_KEYS
from tracer.schema import hashing as H
from tracer.schema.manifest import new_manifest
from tracer.sglang.runtime.requests import page_hashes as hook_page_hashes

MASK = (1 << 64) - 1


def _fmix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def _reference_chain(keys) -> list[int]:
    """The documented formula, one block at a time: s = s * P + fmix(key + SALT); h = fmix(s)."""
    s, out = int(H.ROOT), []
    for k in keys:
        s = (s * int(H.P) + _fmix((int(k) + int(H.KEY_SALT)) & MASK)) & MASK
        out.append(_fmix(s))
    return out


def _common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


_keys = st.lists(st.integers(min_value=0, max_value=5), max_size=14)


@settings(max_examples=150, deadline=None)
@given(_keys, _keys)
def test_chain_prefix_equality_iff_block_prefix_equality(a, b):
    ha, hb = H.chain(a).tolist(), H.chain(b).tolist()
    assert ha == _reference_chain(a) and hb == _reference_chain(b)
    common = _common_prefix(a, b)
    for j in range(min(len(a), len(b))):
        assert (ha[j] == hb[j]) == (j < common)
    assert not set(ha[common:]) & set(hb)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3), max_size=80), st.sampled_from([1, 4, 16]))
def test_token_and_key_entry_points_feed_the_same_core(tokens, block):
    keys = H.block_keys_from_tokens(tokens, block)
    assert len(keys) == len(tokens) // block
    via_tokens = H.page_hashes_from_tokens(tokens, block).tolist()
    assert via_tokens == H.chain(keys).tolist() == H.page_hashes_from_keys(keys).tolist()
    # the hooks hash with this very function, for every container sglang hands them
    assert hook_page_hashes(tokens, block).tolist() == via_tokens
    assert hook_page_hashes(array("q", tokens), block).tolist() == via_tokens
    assert hook_page_hashes(tokens, 0) is None


def test_token_blocks_share_exactly_the_equal_prefix():
    rng = np.random.default_rng(1)
    a = rng.integers(1, 50_000, 16 * 6)
    b = a.copy()
    b[16 * 3 + 2] += 1  # block 3 differs
    ha, hb = H.page_hashes_from_tokens(a, 16), H.page_hashes_from_tokens(b, 16)
    assert ha[:3].tolist() == hb[:3].tolist() and not set(ha[3:].tolist()) & set(hb.tolist())


def test_batch_core_equals_one_by_one_and_workload_hashing_delegates():
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 1 << 63, size=n).astype(np.uint64) for n in (0, 3, 17, 1, 9, 0, 40)]
    flat, lengths = np.concatenate(rows), [len(r) for r in rows]
    batch = H.chain(flat, lengths)
    assert batch.tolist() == np.concatenate([H.chain(r) for r in rows]).tolist()
    assert workload_hashing.chain_hashes(flat, lengths).tolist() == batch.tolist()
    assert workload_hashing.chain_one(rows[2]).tolist() == _reference_chain(rows[2].tolist())


def test_every_manifest_names_the_function():
    assert "page_hash" in MANIFEST_KEYS
    assert new_manifest()["page_hash"] == H.PAGE_HASH_NAME == "kvtrace-chain-v1"
    assert workload_manifest(16, {})["page_hash"] == H.PAGE_HASH_NAME
    assert H.page_hash_of({}) == H.LEGACY_PAGE_HASH == "kvtrace-legacy"
    assert H.page_hash_of({"page_hash": "kvtrace-chain-v1"}) == "kvtrace-chain-v1"


def test_hook_records_a_declared_prompt_row_and_hashes_a_plain_one(tmp_path):
    """The arrival hook: declared rows are recorded as declared; plain prompts are hashed."""
    from types import SimpleNamespace

    import tracer
    from replay.trace import open_trace
    from tracer.sglang.runtime.requests import declared_prompt, emit_arrival

    def req(rid, ids, session=None):
        return SimpleNamespace(rid=rid, origin_input_ids=ids, session_id=session,
                               sampling_params=SimpleNamespace(max_new_tokens=9))

    toks = array("q", range(1, 50))
    for clock in ("manual", "step"):
        out = tmp_path / clock
        tracer.start(out, hash_block_tokens=16, clock=clock)
        try:
            if clock == "manual":
                tracer.set_clock(1000)
            emit_arrival(req("a", toks))
            emit_arrival(req("b", declared_prompt(toks, page_hashes=[11, 12], session_id=4, turn=2,
                                                  output_len=7, arrival_ns=600)))
            now = tracer.tick()
        finally:
            tracer.stop()
        rows = open_trace(out).table("request").to_pylist()
        a, b = rows
        assert a["page_hashes"] == H.page_hashes_from_tokens(toks, 16).tolist() and a["turn"] == -1
        assert (b["page_hashes"], b["session_id"], b["turn"], b["output_len"], b["input_len"]) == (
            [11, 12], 4, 2, 7, 49)
        if clock == "manual":  # stamped at the declared arrival; the clock is restored after it
            assert (a["ts_ns"], b["ts_ns"]) == (1000, 600) and now == 1000
