"""A DeepSeek-V4 capture replays with the capacities the server had (issue 24, item 5).

One fork process (post659) captures the fork's DSV4 stack in HiCache mode as a server records it
(``tracer.sglang.install()``, the fork's own Scheduler on the pools its configurator builds:
``DeepSeekV4TokenToKVPool`` + the paged SWA allocator, page 256, the DSV4 default ratio 0.1;
HiCache: ``LogicalHostPool`` anchor, ``DeepSeekV4PagedHostPool`` for SWA, the state pools; the
manifest's ``server`` block written from the live objects as the autoload does). The HiCache
ratio is one where ``host_pool_tokens / full_pool_tokens`` as a ratio would rebuild each host pool
one page short (1.84 on 69 device pages and 6 SWA pages: 126 host pages and 11 SWA host pages;
32256/17664 gives 125 and 10), so the replay must size the host pools as the fork does.

A second fork process replays that trace with ``--code`` on the same commit under ``recorded``
(the sizes come from the capture: manifest ``server`` block and the rank's ``dsv4`` facts).
Checked: every pool's ``stats`` capacity (full, swa, host_full, host_swa) equals the capture's;
the run's ``kvtrace verify`` finds 0 divergences; the retractions the fork's own Scheduler made
are counted as its trace's retract rows say. The reference backend replays the same capture
with the same capacities (DSV4 host sizing, page 256, ratio 0.1).
"""

from __future__ import annotations

import json

import pytest

from tests.fork.conftest import fork_tarball, require_fork

PS = 256
COMMIT = "post659"
#: full 69 pages; ratio 0.1 (DSV4's default) -> SWA int(1766.4) -> 1536 = 6 pages
FULL = 69 * PS
#: host: max(int(69 * 1.84), 70) = 126 pages, SWA host max(int(6 * 1.84), 7) = 11 pages
HICACHE_RATIO = 1.84
HOOKED = ("sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.swa_memory_pool",
          "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.memory_pool_host",
          "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.common",
          "sglang.srt.managers.schedule_policy", "sglang.srt.managers.schedule_batch",
          "sglang.srt.managers.scheduler")


def _requests() -> list[dict]:
    from replay.backends.fork.driver import synth_tokens

    shared = synth_tokens("shared", 300)
    out = [{"rid": f"p{i}", "input_ids": shared + synth_tokens(f"p{i}", 50), "max_new_tokens": 300,
            "arrival_step": 3 * i} for i in range(3)]
    # long prompts arriving together over a 256-token chunk budget: SWA pressure, a decode that
    # outgrows the SWA pool (retraction); then prompts that push the shared prefix off the device
    # and a repeat of it (a host hit)
    out += [{"rid": f"l{i}", "input_len": 900, "max_new_tokens": 40, "arrival_step": 10} for i in range(6)]
    out += [{"rid": f"f{i}", "input_len": 1200, "max_new_tokens": 8, "arrival_step": 400 + i} for i in range(16)]
    out.append({"rid": "again", "input_ids": shared + synth_tokens("p0", 50), "max_new_tokens": 8,
                "arrival_step": 800})
    return out


def capture(out_dir: str) -> dict:
    """(In the fork's process.) Record the DSV4 HiCache run into ``out_dir`` as a server does;
    returns the driver's summary and the built pools (JSON)."""
    import importlib

    import tracer
    import tracer.sglang
    from replay.backends.fork import dsv4_pools
    from replay.backends.fork.driver import run_requests
    from tracer.sglang.activation.autoload import update_manifest_server
    from tracer.sglang.runtime import requests, state

    for m in HOOKED:
        importlib.import_module(m)
    state.reset()
    tracer.sglang.install()
    orig = dsv4_pools.make_server_args

    def with_ratio(*a, **kw):  # the server's --hicache-ratio (make_server_args derives it otherwise)
        return orig(*a, **kw, hicache_ratio=HICACHE_RATIO)

    dsv4_pools.make_server_args = with_ratio
    tracer.start(out_dir, source="fork-dsv4-capture-test", hash_block_tokens=requests.DEFAULT_HASH_BLOCK_TOKENS)
    try:
        summary = run_requests(_requests(), kind="dsv4", max_total_tokens=FULL, chunked_prefill_size=256,
                               hicache_host_tokens=int(FULL * HICACHE_RATIO), max_running_requests=8,
                               max_steps=8000)
        update_manifest_server()  # what the autoload writes from the live objects
        tracer.sglang.sample()
    finally:
        tracer.stop()
        tracer.sglang.uninstall()
        dsv4_pools.make_server_args = orig
    summary["failures"] = dict(state.failures)
    return summary


_RUNS: dict = {}


@pytest.fixture(scope="module")
def dsv4_runs(tmp_path_factory):
    """The capture (fork process 1), its replay with --code on the same commit (fork process 2)."""
    if not _RUNS:
        require_fork()
        from replay.codes import call_in_code, prepare
        from replay.runs.replay import replay_run

        base = tmp_path_factory.mktemp("fork-dsv4-replay")
        tarball = fork_tarball(COMMIT)
        cap = base / "capture"
        summary = call_in_code(prepare(tarball), "tests.fork.test_fork_dsv4_replay:capture",
                               {"out_dir": str(cap)}, timeout_s=540).result
        run = replay_run(cap, base / "fork", policy="recorded", code=str(tarball))
        ref = replay_run(cap, base / "reference", policy="fork-659", backend="reference",
                         sets=["swa_eviction_interval_tokens=256"])
        _RUNS.update(capture=cap, summary=summary, fork=base / "fork", fork_summary=run, base=base,
                     reference=base / "reference", reference_summary=ref)
    return _RUNS


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("fork-dsv4-replay")]


def _capacities(trace) -> dict:
    from tests.sglang.hooks_util import rows

    out: dict = {}
    for r in rows(trace, "stats"):
        out.setdefault(r["pool"], set()).add(int(r["capacity"]))
    return out


def _retract_rows(trace) -> int:
    from tests.sglang.hooks_util import rows

    return sum(r["kind"] == "retract" for r in rows(trace, "sched"))


def test_the_capture_is_the_fork_dsv4_hicache_stack(dsv4_runs):
    s = dsv4_runs["summary"]
    assert s["failures"] == {} and s["num_finished"] == len(_requests())
    pools = s["pools"]
    assert pools["kv_pool"] == "DeepSeekV4TokenToKVPool" and pools["configurator"] == "DSV4PoolConfigurator"
    assert pools["page_size"] == PS and pools["swa_size"] == 6 * PS  # DSV4's ratio 0.1
    assert pools["host_anchor"] == "LogicalHostPool" and pools["host_entries"]["swa"] == "DeepSeekV4PagedHostPool"
    assert "DeepSeekV4StateHostPool" in pools["host_entries"].values()
    caps = _capacities(dsv4_runs["capture"])
    assert caps == {"full": {FULL}, "swa": {6 * PS}, "host_full": {126 * PS}, "host_swa": {11 * PS}}, caps
    assert _retract_rows(dsv4_runs["capture"]) >= 1


def test_recorded_settings_of_a_dsv4_capture_follow_dsv4(dsv4_runs):
    from replay.backends.dsv4 import recorded_settings
    from tracer.schema.manifest import read_manifest

    cap = dsv4_runs["capture"]
    got = recorded_settings(cap, read_manifest(cap))
    assert got["kv_stack"] == "dsv4" and got["page_size"] == PS and got["swa_full_tokens_ratio"] == 0.1
    assert (got["full_pool_tokens"], got["swa_pool_tokens"]) == (FULL, 6 * PS)
    assert (got["host_pool_tokens"], got["host_swa_pool_tokens"]) == (126 * PS, 11 * PS)
    # a trace without a server block (the rank's dsv4 facts and the stats rows give the sizes)
    bare = read_manifest(cap) | {"server": {}}
    got = recorded_settings(cap, bare)
    assert got["page_size"] == PS and got["sliding_window_tokens"] == 128 and got["swa_full_tokens_ratio"] == 0.1
    assert (got["full_pool_tokens"], got["swa_pool_tokens"]) == (FULL, 6 * PS)
    assert (got["host_pool_tokens"], got["host_swa_pool_tokens"]) == (126 * PS, 11 * PS)


def test_a_code_replay_has_the_capacities_the_server_had(dsv4_runs):
    from replay.diagnosis.verify import verify

    cap, run = dsv4_runs["capture"], dsv4_runs["fork"]
    assert _capacities(run) == _capacities(cap)
    pools = dsv4_runs["fork_summary"].code["pools"]
    assert pools["kv_pool"] == "DeepSeekV4TokenToKVPool" and pools["host_anchor_tokens"] == 126 * PS
    rep = verify(run)
    assert rep.divergences == [] and rep.identity_violations == [] and rep.stats_rows_checked > 100, \
        rep.divergences[:3]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run"]["settings"]["kv_stack"] == "dsv4"
    server = manifest["server"]  # what the fork built, as the capture's server block says
    cap_server = json.loads((cap / "manifest.json").read_text())["server"]
    for key in ("full_pool_tokens", "swa_pool_tokens", "host_pool_tokens", "host_swa_pool_tokens"):
        assert server[key] == cap_server[key], key


def test_the_fork_backend_counts_dsv4_retractions_as_its_trace_does(dsv4_runs):
    s = dsv4_runs["fork_summary"]
    n = _retract_rows(dsv4_runs["fork"])
    assert n >= 1 and s.retractions == n, (s.retractions, n)
    assert s.finished == s.requests == len(_requests())


def test_the_reference_backend_replays_it_with_the_dsv4_capacities_and_retraction(dsv4_runs):
    """Measured: 720 reference steps against the fork's 721, one retraction each."""
    from replay.diagnosis.verify import verify

    ref, s = dsv4_runs["reference"], dsv4_runs["reference_summary"]
    assert _capacities(ref) == _capacities(dsv4_runs["capture"])
    assert s.settings["kv_stack"] == "dsv4" and s.settings["page_size"] == PS
    assert s.retractions == _retract_rows(ref) == dsv4_runs["fork_summary"].retractions >= 1
    assert s.finished == s.requests and abs(s.steps - dsv4_runs["fork_summary"].steps) <= 0.02 * s.steps
    assert verify(ref).divergences == []


def test_doctor_reads_a_dsv4_capture_with_its_stack(dsv4_runs):
    """``doctor``'s recorded settings and its re-runs' settings (``--replay``) are the DSV4 ones."""
    from replay.diagnosis.doctor import recorded
    from replay.diagnosis.rerun import recorded_settings
    from replay.trace import open_trace

    tr = open_trace(dsv4_runs["capture"])
    knobs, _env = recorded(tr)
    assert knobs["kv_stack"] == "dsv4" and knobs["page_size"] == PS and knobs["swa_full_tokens_ratio"] == 0.1
    assert (knobs["host_pool_tokens"], knobs["host_swa_pool_tokens"]) == (126 * PS, 11 * PS)
    sets, _incident, _ = recorded_settings(tr)
    got = dict(s.split("=", 1) for s in sets)
    assert got["kv_stack"] == "dsv4" and int(got["page_size"]) == PS
    assert (int(got["full_pool_tokens"]), int(got["host_swa_pool_tokens"])) == (FULL, 11 * PS)
