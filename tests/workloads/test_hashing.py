"""Chained page hashes: prefix sharing, batch/single agreement, pinned values, determinism."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from replay.workloads.hashing import chain_hashes, chain_one, name_key, segment_block_keys


def test_equal_prefixes_and_only_those_share_hashes():
    a = chain_one([5, 6, 7, 8])
    b = chain_one([5, 6, 9, 8])
    c = chain_one([6, 5, 7, 8])
    assert list(a[:2]) == list(b[:2])
    assert a[2] != b[2] and a[3] != b[3]  # same block id after a different prefix: different hash
    assert not set(a.tolist()) & set(c.tolist())  # same ids, different order
    assert len(set(a.tolist())) == 4


def test_batch_equals_one_by_one():
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 50, size=n).astype(np.uint64) for n in (0, 3, 17, 1, 9, 0, 40)]
    flat = np.concatenate(rows)
    batch = chain_hashes(flat, np.array([len(r) for r in rows]))
    assert batch.tolist() == np.concatenate([chain_one(r) for r in rows]).tolist()


def test_hash_values_are_pinned():
    # Any change to the hash function changes every workload; bump the format if this moves.
    assert chain_one([0, 1]).tolist() == PINNED
    assert name_key("multi_turn/system", 0) == PINNED_NAME
    assert segment_block_keys([1, 2, 3], [40, 30, 20], 16).tolist() == PINNED_SEGMENTS


PINNED = [6644136537403873788, 2682901057189299320]  # kvtrace-chain-v1 (tracer.schema.hashing)
PINNED_NAME = 416926038733456914
PINNED_SEGMENTS = [
    13356089514408245588, 12429443601155899572, 10202017331233722508, 9552647263866345120,
    17466880927442389521,
]


def test_same_hashes_in_another_process():
    code = "from replay.workloads.hashing import chain_one; print(chain_one([3, 1, 4, 1, 5]).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(chain_one([3, 1, 4, 1, 5]).tolist())


def test_segment_blocks_share_exactly_the_common_content():
    # prompt A = sys(40) + user(30); prompt B = sys(40) + user(30) + answer(20) + user2(5)
    a = segment_block_keys([1, 2], [40, 30], 16)
    b = segment_block_keys([1, 2, 3, 4], [40, 30, 20, 5], 16)
    c = segment_block_keys([1, 7], [40, 30], 16)  # other user message after the same system prompt
    assert len(a) == 70 // 16 and len(b) == 95 // 16
    assert a.tolist() == b[: len(a)].tolist()  # append-only: every full block of A is in B
    assert a[:2].tolist() == c[:2].tolist()  # blocks 0-1 lie inside the system prompt
    assert a[2] != c[2]  # block 2 straddles system prompt and user message
    assert not set(a[3:].tolist()) & set(c.tolist())


def test_partial_last_block_is_not_hashed():
    assert len(segment_block_keys([1], [15], 16)) == 0
    assert len(segment_block_keys([1, 2], [8, 8], 16)) == 1


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ids = st.lists(st.integers(min_value=0, max_value=6), max_size=12)


@settings(max_examples=200, deadline=None)
@given(_ids, _ids)
def test_hashes_shared_exactly_on_the_common_prefix(a, b):
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    ha, hb = chain_one(a).tolist(), chain_one(b).tolist()
    assert ha[:common] == hb[:common]
    assert not set(ha[common:]) & set(hb)  # past the common prefix nothing is shared
