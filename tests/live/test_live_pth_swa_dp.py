"""A real hybrid-SWA sglang server with two data-parallel ranks, recorded through ``KVTRACE_DIR``
and the autoload ``.pth``, then killed with SIGKILL and recovered.

The model is a tiny random-weight ``MellumForCausalLM`` whose layers alternate sliding-window
(32 tokens) and full attention, so sglang builds an ``SWAKVPool`` (SWA pool 0.8 of the full pool)
and a ``UnifiedRadixCache`` with FULL and SWA components. ``--dp-size 2`` starts two scheduler
processes (on CPU sglang wants each rank's cores in ``SGLANG_CPU_OMP_THREADS_BIND``); each
records its own rank partition. The ``.pth`` is written by ``kvtrace hooks install-pth
--site-dir`` into a temporary directory that the server's interpreters add as a site dir (the
stubs' sitecustomize does it for ``KVTRACE_LIVE_SITE_DIR``), exactly as from site-packages.

Traffic is kept under ~1,200 tokens per rank: sglang's CPU attention backend (``torch_native``)
indexes SWA layers with full-pool positions and raises ``IndexError`` once a position passes the
SWA pool size (../shared/notes/sglang-server-on-cpu.md), a server bug these tests must not hit.

The whole process group is SIGKILLed by the server's PID (no graceful stop); ``kvtrace recover``
must then give a trace on which every check holds per rank.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from tests.live import live_util as lu
from tests.live import trace_checks as tc
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches

# one worker runs the module (make test: --dist loadgroup): split over both, the second worker
# would wait, idle, on shared_once's lock for the whole server run
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.xdist_group("live-pth")]

PREFIX = list(range(100, 164))  # 64 shared tokens: two windows


def _drive(port: int) -> dict:
    out: dict = {}
    conc = {f"swa-c{i}": PREFIX + [200 + i] * (8 + i) for i in range(6)}
    threads = [threading.Thread(target=lambda r=r, ids=ids: out.__setitem__(r, lu.generate(port, ids, 16, rid=r)))
               for r, ids in conc.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(4):  # sequential: each extends a prompt the same rank may have cached
        out[f"swa-s{i}"] = lu.generate(port, PREFIX + [300] * (20 + 10 * (i // 2)), 8, rid=f"swa-s{i}")
    t = threading.Thread(target=lambda: out.__setitem__(
        "swa-abort", lu.generate(port, list(range(400, 440)), 600, rid="swa-abort")))
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        loads = json.loads(lu.get(port, "/v1/loads")[1])["loads"]
        if sum(x["num_running_reqs"] for x in loads) > 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    status, text = lu.post(port, "/abort_request", {"rid": "swa-abort"})
    assert status == 200, text
    t.join(120)
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    return lu.shared_once(tmp_path_factory, "live-pth", _run_server)


def _run_server(d):
    model = lu.write_mellum_swa(d / "model")
    site_dir = d / "site"
    site_dir.mkdir()
    p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "hooks", "install-pth", "--site-dir", str(site_dir)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    trace = d / "trace"
    port = lu.free_port()
    env = lu.stub_env({"KVTRACE_DIR": str(trace), "KVTRACE_FLUSH_MS": "200",
                       "KVTRACE_LIVE_SITE_DIR": str(site_dir), "SGLANG_CPU_OMP_THREADS_BIND": "0|1"})
    argv = [str(lu.VENV_BIN / "python"), "-m", "sglang.launch_server", "--model-path", str(model),
            "--port", str(port), "--skip-tokenizer-init", "--dp-size", "2", *lu.BASE_FLAGS]
    srv = lu.LiveServer(argv, env, port, d / "server.log")
    try:
        t0 = time.monotonic()
        srv.start()
        res = {"trace": trace, "start_s": srv.start_s}
        res["responses"] = _drive(port)
        lu.wait_idle(port)
        time.sleep(1.0)
        res["loads_idle"] = lu.wait_idle(port)
        status, text = lu.post(port, "/flush_cache", {})
        assert status == 200, text
        time.sleep(1.5)  # > flush interval: the flush is on disk before the crash
        srv.kill_group()  # SIGKILL to the server's process group (its PID)
        srv.wait(60)
        res["log"] = srv.log.read_text(errors="replace")
        rec = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "recover", "--json", str(trace)],
                             capture_output=True, text=True, timeout=300)
        res["recover"] = (rec.returncode, rec.stdout, rec.stderr)
        res["wall_s"] = time.monotonic() - t0
        print(f"\nlive pth/swa/dp2: server start {srv.start_s:.1f} s, module {res['wall_s']:.1f} s")
        return res
    finally:
        srv.kill_tree()


def _ranks_of(live) -> dict[str, int]:
    return {rid: r["meta_info"]["dp_rank"] for rid, r in live["responses"].items()}


def test_sigkill_leaves_a_recoverable_trace(live):
    rc, out, err = live["recover"]
    assert rc == 0, out + err
    p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "inspect", "--json", str(live["trace"])],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    info = json.loads(p.stdout)
    assert sorted(info["ranks"]) == [0, 1]
    assert info["rank_states"] == {"0": "recovered", "1": "recovered"}
    assert info["drops"] == 0 and info["unreadable_files"] == [] and info["problems"] == []
    assert all(n > 0 for fam, n in info["families"].items() if fam != "drops")


def test_each_rank_records_its_own_requests(live):
    ranks = _ranks_of(live)
    assert sorted(set(ranks.values())) == [0, 1]
    for rank in (0, 1):
        by_rid = tc.request_rows(live["trace"], rank)
        sent = {rid: ("abort" if rid == "swa-abort" else "finish") for rid, r in ranks.items() if r == rank}
        assert tc.lifecycle_problems(by_rid, sent) == []
        foreign = [rid for rid, r in ranks.items() if r != rank and rid in by_rid]
        assert foreign == []
        for rid in sent:
            assert tc.end_row(by_rid, rid)["cached_len"] == live["responses"][rid]["meta_info"]["cached_tokens"]
    assert max(r["meta_info"]["cached_tokens"] for r in live["responses"].values()) >= len(PREFIX)


def test_swa_pool_is_live_and_the_identity_holds_per_rank(live):
    for rank in (0, 1):
        stats = tc.rows(live["trace"], "stats", rank)
        pools = {str(r["pool"]) for r in stats}
        assert {"full", "swa"} <= pools
        swa_cap = {r["capacity"] for r in stats if str(r["pool"]) == "swa"}
        full_cap = {r["capacity"] for r in stats if str(r["pool"]) == "full"}
        assert len(swa_cap) == 1 and swa_cap.pop() < full_cap.pop()
        n, bad = identity_mismatches(live["trace"], rank)
        assert n > 10 and bad == []
        n, bad = ledger_mismatches(live["trace"], rank)
        assert bad == []
        releases = [r for r in tc.rows(live["trace"], "cache", rank) if str(r["op"]) == "swa_release"]
        assert releases, "no out-of-window SWA release recorded"


def test_pool_sums_equal_each_ranks_used_size(live):
    """Per rank at idle: the server's used size (``/v1/loads``, max over the full and SWA pools of
    capacity − available − evictable) equals the trace's; Σ alloc − Σ free equals capacity −
    available in each pool; the flush empties both pools."""
    for rank in (0, 1):
        load = {x["dp_rank"]: x for x in live["loads_idle"]}[rank]
        clears = tc.clear_seqs(live["trace"], rank)
        assert clears, "the /flush_cache left no clear marker"
        used = {}
        for pool in ("full", "swa"):
            idle = tc.last_stats_before(live["trace"], rank, pool, clears[0])
            used[pool] = idle["capacity"] - idle["available"] - idle["evictable"]
            ledger = tc.ledger_until(live["trace"], rank, idle["seq"])[pool]
            assert ledger == idle["capacity"] - idle["available"], (rank, pool)
        assert max(used.values()) == load["num_used_tokens"], (rank, used, load)
        assert all(v == 0 for v in tc.ledger_until(live["trace"], rank, clears[-1] + 1).values())
