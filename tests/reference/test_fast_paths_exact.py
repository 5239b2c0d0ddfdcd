"""The reference backend's fast paths are exact: a run with them (decode-step coalescing,
``decode_coalescing=on``, :mod:`replay.backends.reference.coalesce`; the radix walk memo,
``GrowingKeys.walks``, valid while no node the walk read has changed; node keys compared at
their last page, ``RadixTree.chained_keys``) writes the same rows, row for row (timestamps and
sequence numbers included), as a run without any (step by step, every walk done, keys compared
page by page), on the 20 differential cases, the bundled workloads and Hypothesis workloads, under
the presets baseline, swa-fixes and eic; and the stretches do run (most steps of a pressured SWA
run are coalesced). One comparison covers the fast paths (it replaced the walk memo's own test)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from replay.backends.reference.scheduler import ReferenceBackend
from replay.backends.sglang.workload import write_workload
from replay.memory.radix.tree import RadixTree
from tests.differential.cases import CASES, write_case_workload
from tests.reference.rows import first_difference, reference_rows

POLICIES = ("baseline", "swa-fixes", "eic")
WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"
BUNDLED = ("agentic", "long_context", "mixed", "multi_turn", "shared_prefix")  # the committed ones


def _both(tmp_path, workload, policy, sets=(), max_requests=None):
    on = reference_rows(workload, tmp_path / "on", policy, [*sets, "decode_coalescing=on"], max_requests)
    RadixTree.walk_memo = ReferenceBackend.chained_keys = False
    try:
        off = reference_rows(workload, tmp_path / "off", policy, [*sets, "decode_coalescing=off"], max_requests)
    finally:
        RadixTree.walk_memo = ReferenceBackend.chained_keys = True
    return on, off


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fast_paths_exact_on_differential_cases(case, policy, tmp_path):
    write_case_workload(case, tmp_path / "wl")
    on, off = _both(tmp_path, tmp_path / "wl", policy, case.sets())
    assert off["sched"], "the run wrote no step rows"
    assert first_difference(on, off) is None, first_difference(on, off)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", BUNDLED)
def test_fast_paths_exact_on_bundled_workloads(name, policy, tmp_path):
    # the first 200 arrivals of each bundled workload (all of agentic and long_context)
    on, off = _both(tmp_path, WORKLOADS / name, policy, max_requests=200)
    assert off["sched"], "the run wrote no step rows"
    assert first_difference(on, off) is None, first_difference(on, off)


def _random_workload(path, seed: int, ps: int, n: int, long_out: bool) -> None:
    rng = random.Random(seed)
    bases = [[rng.getrandbits(62) for _ in range(10)] for _ in range(3)]
    rows, t, sessions = [], 0, {}
    for i in range(n):
        t += rng.choice((0, 0, 1, 3, 20)) * 5_000_000
        if sessions and rng.random() < 0.35:
            sid = rng.choice(list(sessions))
            hashes = sessions[sid] + [rng.getrandbits(62) for _ in range(rng.randint(1, 3))]
        else:
            sid = len(sessions)
            hashes = rng.choice(bases)[:rng.randint(0, 6)] + [rng.getrandbits(62) for _ in range(rng.randint(1, 4))]
        hashes = hashes[:10]
        sessions[sid] = hashes
        out_len = rng.randint(1, (12 if long_out else 3) * max(ps, 8))
        rows.append(dict(rid=i, ts_ns=t, input_len=len(hashes) * ps - rng.randint(0, ps - 1), page_hashes=hashes,
                         session_id=sid, max_new_tokens=out_len, output_len=out_len))
    write_workload(path, rows, hash_block_tokens=ps)


@pytest.mark.timeout(900)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), ps=st.sampled_from((1, 4, 16)), window=st.sampled_from((0, 4, 16, 40)),
       full_pages=st.integers(24, 160), swa_share=st.sampled_from((0.3, 0.6, 1.0)),
       host=st.booleans(), long_out=st.booleans(), policy=st.sampled_from(POLICIES),
       rows=st.sampled_from((4, 8)))
@example(seed=100589, ps=1, window=4, full_pages=24, swa_share=0.3, host=True, long_out=False, policy="baseline",
         rows=4)  # an extend that does not fit after eviction (see below)
def test_fast_paths_exact_on_hypothesis_workloads(tmp_path_factory, seed, ps, window, full_pages, swa_share, host,
                                                   long_out, policy, rows):
    tmp = tmp_path_factory.mktemp("hyp")
    _random_workload(tmp / "wl", seed, ps, 40, long_out)
    full = full_pages * ps
    swa = max(int(full * swa_share) // ps * ps, window + 2 * ps, 2 * ps)
    if window >= swa:
        swa = (window // ps + 2) * ps
    sets = [f"page_size={ps}", f"sliding_window_tokens={window}", f"full_pool_tokens={full}",
            f"swa_pool_tokens={swa}", f"host_pool_tokens={2 * full if host else 0}",
            f"max_running_requests={rows}", f"chunked_prefill_size={8 * ps}", f"max_prefill_tokens={16 * ps}",
            f"swa_eviction_interval_tokens={max(ps, 8)}"]
    try:
        on, off = _both(tmp, tmp / "wl", policy, sets)
    except ValueError:  # a combination the settings refuse (eic without SWA, a window the SWA pool cannot
        reject()  # hold): this example only (``pytest.skip`` here would skip the whole property)
    except RuntimeError as e:
        # a pool too small to make progress (sgl-project/sglang#37610's hang), or an extend that
        # does not fit after eviction (sglang's own "Out of memory" there: seed 100589, ps 1,
        # window 4, 24 full pages, SWA share 0.3, host, baseline, 4 rows loads back no host hit
        # into a 7-slot SWA pool and needs 4 slots with 3 free, on both backends): the failure is
        # the model's, so the run without fast paths must fail the same way at the same step
        assert "stalled at step" in str(e) or "does not fit after eviction" in str(e), e
        RadixTree.walk_memo = ReferenceBackend.chained_keys = False
        try:
            with pytest.raises(RuntimeError) as off_err:
                reference_rows(tmp / "wl", tmp / "off2", policy, [*sets, "decode_coalescing=off"])
        finally:
            RadixTree.walk_memo = ReferenceBackend.chained_keys = True
        assert str(off_err.value) == str(e)
        return
    assert first_difference(on, off) is None, first_difference(on, off)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ("mixed", "multi_turn"))
def test_fast_paths_exact_on_a_dense_model(name, tmp_path):
    """The same comparison on a model without SWA (``sliding_window_tokens=0``), where a full
    batch (``batch_is_full``) outlives the step that set it and decides whether the next steps
    attempt an admission: a stretch right after a prefill step merges that step's requests once
    and leaves the batch's mode as a decode step leaves it (both were missed once, and only
    these workloads showed it: an admission attempt too many, its ``match`` row before an evict)."""
    on, off = _both(tmp_path, WORKLOADS / name, "baseline", ["sliding_window_tokens=0"], max_requests=200)
    assert off["sched"], "the run wrote no step rows"
    assert first_difference(on, off) is None, first_difference(on, off)


def test_stretches_run_on_a_pressured_swa_workload():
    """Most steps of ``mixed`` (a pressured SWA workload: the head of the queue waits for SWA) run
    in stretches (else the speed figure of ``bench/replay_speed.py`` would be the step-by-step one)."""
    from replay.backends.reference.scheduler import ReferenceBackend
    from replay.backends.reference.settings import from_knobs
    from replay.knobs import resolve
    from replay.workloads import read_workload

    wl = read_workload(WORKLOADS / "mixed")
    values, _ = resolve("swa-fixes", ["decode_coalescing=on"], wl.manifest.get("server"))
    with ReferenceBackend(wl, from_knobs(values)) as be:
        normal = coalesced = 0
        while not be.done:
            n = be._run_stretch()
            if n:
                coalesced += n
            else:
                be.step()
                normal += 1
        be.check_integrity()
    assert be.result.num_finished == len(wl.requests)
    assert coalesced > 2 * normal, (coalesced, normal)
    # the waiting-queue refresh runs inside stretches too (its walks memoized), exactly: the
    # bundled-workload comparisons above cover ``mixed`` with ~45 such refreshes per policy
    assert be.stretch_refreshes > 10, be.stretch_refreshes
    # and most budget checks of the refused head are proven refused without running them
    assert be.stretch_checks_skipped > coalesced / 4, (be.stretch_checks_skipped, coalesced)
    # a stretch also starts after a finish changed the tree elsewhere, the head's match unchanged
    # (re-walked as a pure read), exactly: the comparisons above cover these stretches too
    assert be.stretch_rematches > 10, be.stretch_rematches
    # most finishing steps run as a stretch's last step (their finishes by the normal path's own
    # ``_process_decode``), exactly: the comparisons above cover these too
    assert be.stretch_finishes > normal / 4, (be.stretch_finishes, normal)
    # and a refresh over the same first waiting requests and an unchanged tree reuses the last one's
    # walks (the comparisons above run the step-by-step side with the walk memo, and so this, off)
    assert be.refresh_reuses > 10, be.refresh_reuses
