"""``kvtrace record --backend sglang``: traces produced by the tracer hooks on the real code.

Scripted scenarios check the events the real code must produce (pool alloc/free per pool, SWA
tombstones after SWA eviction, a host hit after demotion, a chunk cut under SWA pressure), the
occupancy identity at every ``stats`` row, and that summing the pool ops reproduces every row.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

from replay.backends.sglang import write_workload  # noqa: E402
from replay.cli import main  # noqa: E402
from replay.record import record_workload  # noqa: E402
from replay.trace import open_trace  # noqa: E402
from tests.sglang.backend_util import BLOCK, blocks, multi_turn_rows, req  # noqa: E402
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches  # noqa: E402

pytestmark = pytest.mark.sglang

SMALL = ("page_size=16", "sliding_window_tokens=32", "full_pool_tokens=4096", "swa_pool_tokens=1024",
         "chunked_prefill_size=256", "max_running_requests=8")


def _record(tmp_path, rows, sets=SMALL, name="t", **kw):
    w = write_workload(tmp_path / f"{name}_w", rows, hash_block_tokens=BLOCK)
    summary = record_workload(w, tmp_path / name, overrides=tuple(sets), check_integrity_every=1, **kw)
    assert summary["hook_failures"] == {}
    return summary, open_trace(tmp_path / name)


def _frame(tr, family):
    return tr.lazy(family).collect()


def _rid_of(tr) -> dict[int, int]:
    """Trace rid -> workload rid (the hooks number requests themselves; rid_str is ours)."""
    r = _frame(tr, "request")
    return {int(a): int(b) for a, b in zip(r["rid"], r["rid_str"])}


def _check_ledger_and_identity(path):
    n, bad = ledger_mismatches(path)
    assert n > 0 and not bad, bad[:5]
    n, bad = identity_mismatches(path)
    assert n > 0 and not bad, bad[:5]


def test_cli_record_every_family_and_no_drops(tmp_path):
    write_workload(tmp_path / "w", multi_turn_rows(), hash_block_tokens=BLOCK)
    args = ["record", "--workload", str(tmp_path / "w"), "--out", str(tmp_path / "t"), "--json",
            "--check-every", "1"] + [a for s in SMALL for a in ("--set", s)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["result"]["num_finished"] == 12 and summary["hook_failures"] == {}
    assert json.loads((tmp_path / "t" / "backend.json").read_text())["settings"]["page_size"] == 16
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "t"), "--json"])
    info = json.loads(res.output)
    assert info["drops"] == 0 and info["problems"] == []
    assert all(n > 0 for fam, n in info["families"].items() if fam != "drops"), info["families"]
    assert info["families"]["drops"] == 0
    assert info["producer"]["source"] == "sglang-backend"
    assert info["server"]["sliding_window_tokens"] == 32
    _check_ledger_and_identity(tmp_path / "t")
    # arrival rows keep the workload's sessions (numbered by the hooks)
    arr = _frame(open_trace(tmp_path / "t"), "request")
    arr = arr.filter(arr["event"] == "arrival")
    by_session = {}
    for rid_str, session in zip(arr["rid_str"], arr["session_id"]):
        by_session.setdefault(session, set()).add(int(rid_str))
    want = {}
    for row in multi_turn_rows():
        want.setdefault(row["session_id"], set()).add(row["rid"])
    assert sorted(map(sorted, by_session.values())) == sorted(map(sorted, want.values()))


def test_cli_rejects_bad_set_key(tmp_path):
    write_workload(tmp_path / "w", multi_turn_rows(1, 1), hash_block_tokens=BLOCK)
    res = CliRunner().invoke(main, ["record", "--workload", str(tmp_path / "w"), "--out",
                                    str(tmp_path / "t"), "--set", "window=3"])
    assert res.exit_code != 0
    assert "unknown knob 'window'" in res.output and "sliding_window_tokens" in res.output


def test_alloc_free_counts_per_pool(tmp_path):
    """One 100-token request, 5 outputs, page 16, no chunking: exact per-pool ledger."""
    rows = [req(0, 0, blocks("one", 7), input_len=100, out=5, max_new=5)]
    summary, tr = _record(tmp_path, rows, ("page_size=16", "sliding_window_tokens=32",
                                           "full_pool_tokens=4096", "swa_pool_tokens=1024",
                                           "chunked_prefill_size=1024"))
    pool = _frame(tr, "pool")
    net = {}
    for name in ("full", "swa", "req_to_token"):
        p = pool.filter(pool["pool"] == name)
        alloc = int(p.filter(p["op"] == "alloc")["num_slots"].sum())
        free = int(p.filter(p["op"] == "free")["num_slots"].sum())
        net[name] = (alloc, free)
    # one request row, allocated once and freed once
    assert net["req_to_token"] == (1, 1)
    # full: 104 KV tokens (100 prompt + 4 decoded; the 5th sampled token has no KV) = 7 pages;
    # at finish the tree keeps the 6 whole pages, the partial 7th page is freed
    assert net["full"] == (112, 16)
    # swa: same 7 pages allocated; everything out of the window that the tree does not need is
    # freed (at insert and at finish); what stays is the last ceil(max(W, ps)) window
    swa_alloc, swa_free = net["swa"]
    assert swa_alloc == 112 and 0 < swa_free < swa_alloc
    # the trace's ledger ends where the real pools ended
    final = summary["result"]["final_occupancy"]
    assert final["full"]["capacity"] - final["full"]["available"] == 96 == final["full"]["evictable"]
    assert final["swa"]["capacity"] - final["swa"]["available"] == swa_alloc - swa_free
    assert final["full"]["held"] == final["swa"]["held"] == 0
    _check_ledger_and_identity(tmp_path / "t")


def test_swa_eviction_leaves_tombstones(tmp_path):
    """Groups sharing a prefix under a small SWA pool: SWA eviction tombstones internal nodes."""
    rows, rid = [], 0
    for g in range(6):
        prefix = blocks(("g", g), 16)
        for _ in range(3):
            rows.append(req(rid, rid * 400, prefix + blocks(("r", rid), 8)))
            rid += 1
    _, tr = _record(tmp_path, rows, ("page_size=16", "sliding_window_tokens=32", "full_pool_tokens=16384",
                                     "swa_pool_tokens=512", "chunked_prefill_size=1024"))
    c = _frame(tr, "cache")
    ev = c.filter(c["op"] == "evict")
    assert len(ev) > 0 and int(ev["tombstones"].sum()) > 0
    # tombstoning frees SWA without freeing full KV
    assert int(ev["swa_tokens"].sum()) > int(ev["full_tokens"].sum())
    _check_ledger_and_identity(tmp_path / "t")


def test_host_hit_after_demotion(tmp_path):
    """HiCache write-through: a prefix pushed off the device by other requests hits on host."""
    prefix = blocks("p", 32)
    rows = [req(0, 0, prefix)]
    rows += [req(i, i * 400, blocks(("x", i), 32)) for i in range(1, 6)]
    rows.append(req(9, 4000, prefix + blocks("q", 8)))
    summary, tr = _record(tmp_path, rows, ("page_size=16", "sliding_window_tokens=32", "full_pool_tokens=1536",
                                           "swa_pool_tokens=1024", "chunked_prefill_size=1024",
                                           "host_pool_tokens=8192"))
    c = _frame(tr, "cache")
    rids = _rid_of(tr)
    match = {rids[int(r)]: (d, h) for r, d, h in zip(c.filter(c["op"] == "match")["rid"],
                                                      c.filter(c["op"] == "match")["device_hit"],
                                                      c.filter(c["op"] == "match")["host_hit"])}
    assert match[9] == (0, 512)  # all of the shared prefix is host-only: demoted, not deleted
    assert len(c.filter(c["op"] == "backup")) > 0 and len(c.filter(c["op"] == "load_back")) == 1
    assert summary["result"]["cached_tokens"] == 512
    st = _frame(tr, "stats")
    assert {"host_full", "host_swa"} <= set(st["pool"].cast(str).to_list())
    _check_ledger_and_identity(tmp_path / "t")


def test_chunk_cut_under_swa_pressure(tmp_path):
    """A prompt whose SWA need exceeds the SWA pool is admitted as a shrunk chunk."""
    rows = [req(0, 0, blocks("long", 200))]  # 3200 tokens, SWA pool 1024
    _, tr = _record(tmp_path, rows, ("page_size=16", "sliding_window_tokens=64", "full_pool_tokens=16384",
                                     "swa_pool_tokens=1024", "chunked_prefill_size=4096"))
    sc = _frame(tr, "sched")
    adm = sc.filter(sc["kind"] == "admit")
    first = adm.row(0, named=True)
    assert first["verdict"] == "shrunk"
    assert first["chunk_requested"] == 3200 and 0 < first["chunk_admitted"] < 1024
    assert first["chunk_admitted"] % 16 == 0
    assert int(np.sum(adm["chunk_admitted"].to_numpy())) == 3200  # the whole prompt, in pieces
    _check_ledger_and_identity(tmp_path / "t")


def test_detail_pages_carries_page_ids(tmp_path):
    _, tr = _record(tmp_path, multi_turn_rows(1, 2), detail="pages")
    pool = _frame(tr, "pool")
    allocs = pool.filter((pool["op"] == "alloc") & (pool["pool"] == "full"))
    assert len(allocs) > 0 and allocs["page_ids"].null_count() == 0
    assert all(len(ids) == n for ids, n in zip(allocs["page_ids"].to_list(), allocs["num_pages"].to_list()))


def test_overhead_bench_runs(tmp_path):
    """bench/sglang_overhead.py on a tiny workload: both runs agree, the JSON has its keys."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "sglang_overhead.py"
    spec = importlib.util.spec_from_file_location("sglang_overhead", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    w = write_workload(tmp_path / "w", multi_turn_rows(2, 2), hash_block_tokens=BLOCK)
    r = bench.measure(w, overrides=SMALL, repeat=1)
    assert {"wall_s_off", "wall_s_on", "slowdown_pct", "events_per_s", "slowdown_pct_step_min"} <= set(r)
    assert r["events"] > 0 and r["num_requests"] == 4
    # every step timed in both modes: the per-step minima add up to at most the whole runs
    assert 0 < r["step_min_s_off"] <= r["wall_s_off"] and 0 < r["step_min_s_on"] <= r["wall_s_on"]
    d = bench.decompose(w, overrides=SMALL, repeat=1)
    assert tuple(d["modes"]) == bench.DECOMPOSE_MODES and d["num_steps"] == r["num_steps"]
    assert d["modes"]["off"]["step_min_pct"] == 0 and d["events_per_step"] > 0
    assert all(0 < v["step_min_s"] <= v["wall_s"] for v in d["modes"].values())


def test_hook_failures_are_this_traces_own(tmp_path):
    """The hooks' failure counters are per process: failures counted before a recording (another
    test's deliberate hook failure, an earlier recording with the hooks left installed) are not
    reported as this recording's."""
    import tracer.sglang

    tracer.sglang.install(detail="counts")  # installed by another caller: not reset by record
    try:
        tracer.sglang.failures["allocator.alloc_extend"] += 2
        rows = [req(0, 0, blocks("one", 7), input_len=100, out=5, max_new=5)]
        _record(tmp_path, rows)  # asserts hook_failures == {}
    finally:
        tracer.sglang.uninstall()
