"""A key table computed in batches (:mod:`replay.backends.reference.keybatch`) holds the keys
``PageKeys`` computes request by request with its donors, int for int, and shares the adopted
keys' int objects as they do, on the bundled workloads and Hypothesis sessions, at page sizes
that are multiples of the hash block, divisors of it and neither, in one batch or many."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.backends.reference import keybatch
from replay.backends.reference.keys import KeyDonors, LazyPrompt, PageKeys, SequenceOrigins
from replay.backends.reference.request import output_plan
from replay.backends.sglang.tokens import TokenSynth
from replay.workloads import read_workload
from tests.reference.test_keys_reuse import _session_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


def _one_by_one(wl, ps: int) -> dict[int, list[int]]:
    """Each request keyed by its own ``PageKeys`` (its donors adopted), in arrival order, as a
    run with no table keys them."""
    synth = TokenSynth(wl)
    donors = KeyDonors(wl.requests, synth._next_turn)
    rows = {}
    for w in wl.requests:
        plan = output_plan(w)
        keys = PageKeys(LazyPrompt(synth, w, int(w.input_len)), ps, plan, SequenceOrigins(synth, w))
        donors.adopt(keys, w)
        rows[int(w.rid)] = list(keys.up_to(int(w.input_len) + len(plan)))
    return rows


def _objects(rows: dict) -> int:
    """How many distinct int objects the rows hold (adopted keys are their donor's)."""
    return len({id(k) for row in rows.values() for k in row})


def _same(wl, ps: int) -> tuple[dict, dict]:
    want = _one_by_one(wl, ps)
    got = keybatch.build_rows(wl, ps, wl.requests)
    assert got.keys() == want.keys()
    for rid, row in want.items():
        assert got[rid] == row, f"request {rid}: keys differ at page size {ps}"
    assert _objects(got) == _objects(want), "the adopted keys are not shared as PageKeys shares them"
    return got, want


@pytest.mark.parametrize("ps", (1, 4, 16, 24, 64, 256))
@pytest.mark.parametrize("name", ("multi_turn", "agentic", "mixed", "shared_prefix", "long_context"))
def test_batched_keys_are_the_keys_of_one_request_at_a_time(name, ps):
    wl = read_workload(WORKLOADS / name)
    got, _ = _same(wl, ps)
    shared = sum(len(r) for r in got.values()) - _objects(got)
    if name in ("multi_turn", "shared_prefix") and ps in (4, 16, 64):
        assert shared > 0, "no key adopted: the check says nothing about donors"


def test_many_batches_give_the_keys_of_one(monkeypatch):
    """Batches far smaller than a session: donors in earlier batches, chains across them."""
    wl = read_workload(WORKLOADS / "multi_turn")
    monkeypatch.setattr(keybatch, "BATCH_PAGES", 50)
    _same(wl, 16)
    _same(wl, 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), bt=st.sampled_from((4, 16)), ps=st.sampled_from((1, 2, 3, 4, 8, 16, 32)),
       batch=st.sampled_from((7, 100, keybatch.BATCH_PAGES)))
def test_batched_keys_on_adversarial_sessions(tmp_path_factory, monkeypatch, seed, bt, ps, batch):
    path = tmp_path_factory.mktemp("wl") / "w"
    _session_workload(path, seed, bt, 40)
    monkeypatch.setattr(keybatch, "BATCH_PAGES", batch)
    _same(read_workload(path), ps)


def test_no_request_and_requests_shorter_than_a_page():
    wl = read_workload(WORKLOADS / "mixed")
    assert keybatch.build_rows(wl, 16, []) == {}
    rows = keybatch.build_rows(wl, 1 << 20, wl.requests)  # a page longer than every sequence
    assert rows and all(row == [] for row in rows.values())
