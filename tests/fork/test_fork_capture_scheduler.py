"""Capture under the DeepSeek-V4 fork's own ``Scheduler``, at both shared commits.

In the fork's process (``replay.codes.call_in_code``): ``tracer.sglang.install()`` (the target is
recognized from the code and installs ``tracer.sglang.hooks.fork``), ``tracer.start``, then
``replay.backends.fork.driver.run_requests`` drives the fork's Scheduler on the DSV4 pools built
by its configurator path (``DeepSeekV4TokenToKVPool`` + paged ``SWATokenToKVPoolAllocator``,
page 256, window 128), in direct mode and in HiCache mode (``LogicalHostPool`` anchor,
``DeepSeekV4PagedHostPool``), ``tracer.stop()``. One fork process per commit records both traces
(module fixture); the tests read them in the main venv.

Workload: a shared 300-token prefix (prefix hits), long prompts arriving together (chunked
prefills under SWA pressure: the SWA pool holds 6 pages; one decode is retracted), decodes that
cross pages, finishes; in
HiCache mode a small device pool so early prefixes are evicted to the host and a late request
that repeats one loads it back.

Checked per trace: per pool Σalloc − Σfree == capacity − available at every stats row and at the
end; available + evictable + protected + held == capacity on every stats row; one arrival and one
finish per request; step rows = the batches the Scheduler ran; retract rows; admission rows' prefix and
match rows' device hit = the fork's cached tokens per request; lock/unlock balanced; backup and
load_back rows in HiCache mode; ``kvtrace verify`` 0 divergences; doctor and report run; the rank
entry's coverage is the fork target with every hook installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fork.conftest import COMMITS

PS = 256
HOOKED = ("sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.swa_memory_pool",
          "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.memory_pool_host",
          "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.common",
          "sglang.srt.managers.schedule_policy", "sglang.srt.managers.schedule_batch",
          "sglang.srt.managers.scheduler")


def _requests(hicache: bool) -> list[dict]:
    from replay.backends.fork.driver import synth_tokens

    shared = synth_tokens("shared", 300)
    out = [{"rid": f"p{i}", "input_ids": shared + synth_tokens(f"p{i}", 50), "max_new_tokens": 300,
            "arrival_step": 3 * i} for i in range(3)]
    # SWA pressure: long prompts arriving together over a 256-token chunk budget
    out += [{"rid": f"l{i}", "input_len": 900, "max_new_tokens": 40, "arrival_step": 10}
            for i in range(6)]
    if hicache:
        # new prompts that push the early prefixes off the device, then a repeat of one
        out += [{"rid": f"f{i}", "input_len": 1000, "max_new_tokens": 8, "arrival_step": 400 + i}
                for i in range(12)]
        out.append({"rid": "again", "input_ids": shared + synth_tokens("p0", 50),
                    "max_new_tokens": 8, "arrival_step": 800})
    return out


CASES = {
    "direct": dict(kind="dsv4", chunked_prefill_size=256, max_steps=5000),
    # full 8192, SWA 1536 (6 pages): the f* prompts push the shared prefix off the device
    "hicache": dict(kind="dsv4", chunked_prefill_size=256, max_total_tokens=8192,
                    swa_full_tokens_ratio=0.2, hicache_host_tokens=32768, max_steps=5000),
}


def record_cases(out_dir: str, cases: dict) -> dict:
    """(In the fork's process.) For each case: install the hooks through
    ``tracer.sglang.install()``, record ``run_requests`` into ``out_dir/<case>``; returns the
    driver's summaries plus what the checks need (JSON)."""
    import importlib

    import tracer
    import tracer.sglang
    from replay.backends.fork.driver import run_requests
    from tracer.sglang.runtime import state

    for m in HOOKED:  # (as the server has imported them when the autoload installs)
        importlib.import_module(m)
    out = {}
    for name, case in cases.items():
        case = dict(case)
        reqs = case.pop("requests")
        state.reset()
        tracer.sglang.install()
        trace = str(Path(out_dir) / name)
        tracer.start(trace, source="fork-capture-scheduler-test")
        try:
            summary = run_requests(reqs, **case)
            tracer.sglang.sample()  # the end state (after flush_cache) as a last stats row
            cov = tracer.sglang.hooks.coverage()
        finally:
            tracer.stop()
            tracer.sglang.uninstall()
        summary["failures"] = dict(state.failures)
        summary["coverage"] = cov
        summary["trace"] = trace
        out[name] = summary
    return out


_RUNS: dict = {}


@pytest.fixture(scope="module", params=COMMITS)
def fork_run(request, fork_codes, tmp_path_factory):
    commit = request.param
    if commit not in _RUNS:
        from replay.codes import call_in_code

        base = tmp_path_factory.mktemp(f"fork-capture-{commit}")
        cases = {n: dict(c, requests=_requests(n == "hicache")) for n, c in CASES.items()}
        run = call_in_code(fork_codes[commit], "tests.fork.test_fork_capture_scheduler:record_cases",
                           {"out_dir": str(base), "cases": cases}, timeout_s=540)
        _RUNS[commit] = run.result
    return commit, _RUNS[commit]


pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("fork-capture-scheduler")]  # module fixtures: one worker


def _trace(fork_run, case):
    commit, runs = fork_run
    s = runs[case]
    assert s["failures"] == {}, (commit, case, s["failures"])
    return commit, s, Path(s["trace"])


@pytest.mark.parametrize("case", list(CASES))
def test_the_scheduler_ran_the_workload(fork_run, case):
    commit, s, _ = _trace(fork_run, case)
    n = len(_requests(case == "hicache"))
    assert s["num_finished"] == n, (commit, case, s["num_finished"])
    assert s["chunked_steps"] > 0 and s["min_available"]["swa"] == 0, (commit, case)  # SWA pressure
    assert s["cached_tokens"] >= 2 * PS, (commit, case)  # prefix hits
    assert s["after_flush"] == s["initial"], (commit, case)


@pytest.mark.parametrize("case", list(CASES))
def test_coverage_is_the_fork_target_with_every_hook_installed(fork_run, case):
    commit, s, trace = _trace(fork_run, case)
    cov = s["coverage"]
    assert cov["target"] == f"bytedance-dsv4-{commit}" and cov["state"] == "full", (commit, cov)
    bad = {h: v for h, v in cov["hooks"].items() if v["state"] not in ("installed", "skipped")}
    assert not bad, (commit, bad)
    assert all(p["accounted"] for p in cov["pools"].values()), cov["pools"]
    rank = json.loads(next((trace / "ranks").glob("rank=*.json")).read_text())
    assert rank["coverage"]["target"] == cov["target"] and rank["coverage"]["state"] == "full"
    assert rank["dsv4"]["swa_mode"] == "paged" and rank["dsv4"]["page_size"] == PS


@pytest.mark.parametrize("case", list(CASES))
def test_pool_ledger_and_occupancy_identity_hold_on_every_stats_row(fork_run, case):
    from tests.sglang.hooks_util import identity_mismatches, ledger, ledger_mismatches, rows

    commit, s, trace = _trace(fork_run, case)
    pools = {"full", "swa"} | ({"host_full", "host_swa"} if case == "hicache" else set())
    stats_pools = {r["pool"] for r in rows(trace, "stats")}
    assert stats_pools >= pools, (commit, case, stats_pools)
    n, bad = ledger_mismatches(trace)
    assert n >= 50 and not bad, (commit, case, n, bad[:5])
    n, bad = identity_mismatches(trace)
    assert n >= 50 and not bad, (commit, case, n, bad[:5])
    # at the end (a stats row sampled after flush_cache, past every pool row): the ledger is the
    # pools' real use, and the device pools are whole
    net = ledger(trace)
    assert net["full"] == 0 and net["swa"] == 0, (commit, case, net)
    last = {}
    for r in rows(trace, "stats"):
        last[r["pool"]] = r
    pool_seq = max(r["seq"] for r in rows(trace, "pool"))
    for p in pools:
        assert last[p]["seq"] > pool_seq, (commit, p)
        assert net.get(p, 0) == last[p]["capacity"] - last[p]["available"], (commit, p, net)


@pytest.mark.parametrize("case", list(CASES))
def test_request_and_sched_rows_match_what_the_scheduler_did(fork_run, case):
    from tests.sglang.hooks_util import rows

    commit, s, trace = _trace(fork_run, case)
    req = rows(trace, "request")
    events: dict = {}
    for r in req:
        events.setdefault(r["rid_str"], []).append(str(r["event"]))
    assert events == {rid: ["arrival", "finish"] for rid in s["finished"]}, (commit, case)
    rid_str = {r["rid"]: r["rid_str"] for r in req}
    sched = rows(trace, "sched")
    steps = [r for r in sched if r["kind"] == "step"]
    modes = {m: sum(r["mode"] == m for r in steps) for m in ("prefill", "decode")}
    assert modes == {"prefill": s["prefill_steps"], "decode": s["decode_steps"]}, (commit, case)
    # (an idle iteration writes a step row only when its boundary closes a step: at most one per
    # idle stretch)
    assert sum(r["mode"] == "idle" for r in steps) <= s["idle_steps"]
    assert len(steps) - modes["prefill"] - modes["decode"] == sum(r["mode"] == "idle" for r in steps)
    verdicts = {r["verdict"] for r in sched if r["kind"] == "admit"}
    assert verdicts >= {"admitted", "chunked", "swa_wait"}, verdicts
    # a retraction (decode out of SWA): one retract row per request row given back and taken
    # again, and the request still finishes
    from tests.sglang.hooks_util import pool_ops

    retracts = [rid_str[r["rid"]] for r in sched if r["kind"] == "retract"]
    assert retracts and set(retracts) <= set(s["finished"]), (commit, case, retracts)
    assert pool_ops(trace)["req_to_token"]["alloc"] == len(s["finished"]) + len(retracts)
    # the fork's cached_tokens = the prefix (device + host) at a request's first admission;
    # the match row just before it reports the same hit
    first: dict = {}
    last_match: dict = {}
    for r in sorted(sched + rows(trace, "cache"), key=lambda r: r["seq"]):
        rid = rid_str.get(r["rid"])
        if r.get("op") == "match":
            last_match[rid] = r
        elif r.get("kind") == "admit" and r["chunk_admitted"] > 0 and rid not in first:
            first[rid] = (r, last_match.get(rid))
    input_len = {r["rid_str"]: r["input_len"] for r in req if r["event"] == "arrival"}
    for rid, f in s["finished"].items():
        admit, match = first[rid]
        assert admit["prefix_len"] + admit["host_hit_len"] == f["cached_tokens"], (commit, rid, admit)
        assert admit["prefix_len"] + admit["host_hit_len"] + admit["extend_len"] == input_len[rid]
        assert match["device_hit"] + match["host_hit"] == f["cached_tokens"], (commit, rid, match)


@pytest.mark.parametrize("case", list(CASES))
def test_cache_rows_locks_balance_and_hicache_traffic(fork_run, case):
    from collections import Counter

    from tests.sglang.hooks_util import rows

    commit, s, trace = _trace(fork_run, case)
    cache = rows(trace, "cache")
    ops = Counter(str(r["op"]) for r in cache)
    assert set(ops) >= {"match", "insert", "lock", "unlock", "release", "swa_release", "evict"}, ops
    assert ops["lock"] == ops["unlock"], (commit, case, ops)
    assert ops["release"] >= len(s["finished"])
    if case == "hicache":
        assert ops["backup"] > 0 and ops["load_back"] > 0, (commit, ops)
        assert any(r["host_hit"] > 0 for r in cache if r["op"] == "match"), commit


@pytest.mark.parametrize("case", list(CASES))
def test_verify_doctor_and_report_read_the_trace(fork_run, case, tmp_path):
    import subprocess
    import sys

    from replay.diagnosis.verify import verify

    commit, s, trace = _trace(fork_run, case)
    rep = verify(trace)
    assert rep.divergences == [] and rep.identity_violations == [], (commit, case, rep.divergences[:3])
    assert rep.stats_rows_checked >= 50
    kv = [sys.executable, "-m", "replay.cli"]
    # doctor's exit 1 is a verdict (growing: a second of decodes whose KV grows), not an error
    for args, ok in ((["verify", str(trace), "--json"], (0,)),
                     (["doctor", str(trace), "--json"], (0, 1)),
                     (["report", str(trace), "--out", str(tmp_path / "r.html"), "--json"], (0,))):
        p = subprocess.run(kv + args, capture_output=True, text=True, timeout=240)
        assert p.returncode in ok, (commit, case, args[0], p.stdout[-800:], p.stderr[-800:])
        out = json.loads(p.stdout)
        if args[0] == "doctor":
            assert out["verdict"] in ("stable", "growing"), (commit, case, out["verdict"])
        if args[0] == "verify":
            assert out["verdict"] == "ok" and out["totals"]["divergences"] == 0
