"""A real ``python -m sglang.launch_server`` on CPU, recorded by ``kvtrace launch``.

One server (tiny random-weight LlamaForCausalLM with a word-level tokenizer, built by the test) is
shared by every check of this module. It serves, over HTTP on 127.0.0.1:

1. four concurrent requests sharing a 48-token prefix, then two sequential ones extending an
   earlier prompt (prefix hits), one request aborted through ``/abort_request`` while decoding;
2. with HiCache on (``--enable-hierarchical-cache``, host-copy no-ops): a prompt evicted from the
   device pool by five others and asked again (a host hit loaded back);
3. a ``/flush_cache`` once the server is idle (after its own used size is read from
   ``/v1/loads``);
4. sglang's own client, ``python -m sglang.bench_serving`` (generated-shared-prefix dataset, text
   prompts through the server's tokenizer manager);

and is then stopped by SIGTERM to the PID of ``kvtrace launch`` (forwarded to the server). The
checks compare the trace with what the server and the client reported. Needs the packages of
the ``server`` extra and the import stubs of tests/live/stubs (see docs/capture.md).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest

from tests.live import live_util as lu
from tests.live import trace_checks as tc
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches

# one worker runs the module (make test: --dist loadgroup): split over both, the second worker
# would wait, idle, on shared_once's lock for the whole server run
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(1200), pytest.mark.xdist_group("live-launch")]

PREFIX = list(range(100, 148))  # 48 shared tokens
BENCH_ARGS = ("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
              "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "64",
              "--gsp-question-len", "16", "--gsp-output-len", "8", "--num-prompts", "8",
              "--cache-report", "--output-details", "--disable-tqdm", "--seed", "1")


def _drive_http(port: int) -> dict:
    """Requests of phase 1; returns {rid: response} and the rid of the aborted request."""
    out: dict = {}
    concurrent = {f"live-c{i}": PREFIX + [200 + i] * (4 + i) for i in range(4)}
    threads = [threading.Thread(target=lambda r=r, ids=ids: out.__setitem__(r, lu.generate(port, ids, 16, rid=r)))
               for r, ids in concurrent.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    out["live-s0"] = lu.generate(port, PREFIX + [300] * 20, 8, rid="live-s0")
    out["live-s1"] = lu.generate(port, PREFIX + [300] * 20 + [301] * 10, 8, rid="live-s1")
    # The aborted request: long decode, aborted once it is running.
    t = threading.Thread(target=lambda: out.__setitem__(
        "live-abort", lu.generate(port, list(range(400, 440)), 1500, rid="live-abort")))
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        loads = json.loads(lu.get(port, "/v1/loads")[1])["loads"]
        if sum(x["num_running_reqs"] for x in loads) > 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    status, text = lu.post(port, "/abort_request", {"rid": "live-abort"})
    assert status == 200, text
    t.join(120)
    # HiCache: a prompt, then enough distinct prompts to evict it from the device pool (its
    # write-through host copy stays), then the prompt again: a host hit loaded back.
    rng = random.Random(7)
    hot = [rng.randrange(4, 512) for _ in range(300)]
    out["live-h0"] = lu.generate(port, hot, 8, rid="live-h0")
    for i in range(5):
        out[f"live-e{i}"] = lu.generate(port, [rng.randrange(4, 512) for _ in range(400)], 8,
                                        rid=f"live-e{i}")
    out["live-h1"] = lu.generate(port, hot + [5] * 10, 8, rid="live-h1")
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    return lu.shared_once(tmp_path_factory, "live-launch", _run_server)


def _run_server(d):
    model = lu.write_llama(d / "model")
    port = lu.free_port()
    trace = d / "trace"
    argv = [str(lu.VENV_BIN / "kvtrace"), "launch", "--out", str(trace), "--flush-ms", "200", "--",
            str(lu.VENV_BIN / "python"), "-m", "sglang.launch_server", "--model-path", str(model),
            "--port", str(port), *lu.BASE_FLAGS, *lu.HICACHE_FLAGS]
    srv = lu.LiveServer(argv, lu.stub_env({"KVTRACE_LIVE_HOST_NOOPS": "1"}), port, d / "server.log")
    try:
        t0 = time.monotonic()
        srv.start()
        res = {"trace": trace, "start_s": srv.start_s, "model": model}
        res["responses"] = _drive_http(port)
        lu.wait_idle(port)
        time.sleep(2.5)  # HiCache write-through acks land; an idle step samples the pools
        res["loads_idle"] = lu.wait_idle(port)  # computed by the scheduler on request
        status, text = lu.post(port, "/flush_cache", {})
        assert status == 200, text
        out_file = d / "bench.jsonl"
        p = subprocess.run(
            [str(lu.VENV_BIN / "python"), "-m", "sglang.bench_serving", "--backend", "sglang",
             "--host", "127.0.0.1", "--port", str(port), "--model", str(model),
             "--tokenizer", str(model), *BENCH_ARGS, "--output-file", str(out_file)],
            env=lu.stub_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        res["bench"] = [json.loads(line) for line in out_file.read_text().splitlines()][-1]
        lu.wait_idle(port)
        srv.signal(signal.SIGTERM)  # to kvtrace launch, which forwards it to the server
        res["exit_code"] = srv.wait(120)
        res["log"] = srv.log.read_text(errors="replace")
        res["wall_s"] = time.monotonic() - t0
        print(f"\nlive launch: server start {srv.start_s:.1f} s, module {res['wall_s']:.1f} s")
        return res
    finally:
        srv.kill_tree()


def _inspect(trace) -> dict:
    p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "inspect", "--json", "--strict", str(trace)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def test_sigterm_leaves_a_complete_trace(live):
    assert live["exit_code"] == 0
    info = _inspect(live["trace"])
    text = json.dumps(info)
    assert "complete" in text and "crashed" not in text, text[:2000]
    assert info.get("problems", []) == []


def test_one_arrival_and_one_end_per_request_sent(live):
    by_rid = tc.request_rows(live["trace"])
    sent = {rid: "finish" for rid in live["responses"] if rid != "live-abort"}
    sent["live-abort"] = "abort"
    assert live["responses"]["live-abort"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert tc.lifecycle_problems(by_rid, sent) == []
    # Every other request is a health check or bench_serving's (8 + its warm-up request).
    others = [r for r in by_rid if r not in sent and not r.startswith("HEALTH_CHECK")]
    assert len(others) == 9
    assert all([str(x["event"]) for x in by_rid[r]] == ["arrival", "finish"] for r in others)


def test_hit_lengths_equal_the_servers_cached_tokens(live):
    by_rid = tc.request_rows(live["trace"])
    got = {rid: tc.end_row(by_rid, rid)["cached_len"] for rid in live["responses"]}
    want = {rid: r["meta_info"]["cached_tokens"] for rid, r in live["responses"].items()}
    assert got == want
    assert want["live-s1"] >= len(PREFIX) + 20  # the prefix cache really hit
    for rid, r in live["responses"].items():
        row = tc.end_row(by_rid, rid)
        assert row["input_len"] == r["meta_info"]["prompt_tokens"]
        assert row["output_len"] == r["meta_info"]["completion_tokens"]


def test_bench_serving_report_matches_the_trace(live):
    bench = live["bench"]
    by_rid = tc.request_rows(live["trace"])
    ours = set(live["responses"])
    finished = [tc.end_row(by_rid, r) for r in by_rid if r not in ours and not r.startswith("HEALTH_CHECK")]
    traced = Counter((r["input_len"], r["cached_len"]) for r in finished)
    reported = Counter(zip(bench["input_lens"], bench["cached_tokens"]))
    assert sum(reported.values()) == 8 and bench["completed"] == 8
    assert reported - traced == Counter()  # every reported request, exactly
    assert sum((traced - reported).values()) == 1  # plus bench_serving's warm-up request
    assert sum(bench["input_lens"]) == bench["total_input_tokens"]


def test_pool_sums_equal_the_servers_used_size(live):
    """At idle the server's own used size (``/v1/loads``: capacity − available − evictable)
    equals the trace's; Σ alloc − Σ free equals capacity − available; the flush empties both."""
    trace, (load,) = live["trace"], live["loads_idle"]
    clears = tc.clear_seqs(trace)
    assert clears, "the /flush_cache left no clear marker"
    idle = tc.last_stats_before(trace, 0, "full", clears[0])
    assert idle["capacity"] == load["max_total_num_tokens"]
    assert idle["capacity"] - idle["available"] - idle["evictable"] == load["num_used_tokens"]
    assert tc.ledger_until(trace, 0, idle["seq"])["full"] == idle["capacity"] - idle["available"]
    assert tc.ledger_until(trace, 0, clears[-1] + 1)["full"] == 0  # flushed: nothing allocated


def test_occupancy_identity_and_ledger_at_every_stats_row(live):
    n, bad = identity_mismatches(live["trace"])
    assert n > 20 and bad == []
    n, bad = ledger_mismatches(live["trace"])
    assert n > 20 and bad == []


def test_step_rows_are_the_real_schedulers_batches(live):
    steps = tc.step_rows(live["trace"])
    prefill = [(r["batch_size"], r["num_tokens"]) for r in steps if str(r["mode"]) == "prefill"]
    logged = [(n, t) for n, t, _ in tc.prefill_log_batches(live["log"])]
    assert prefill == logged and len(logged) >= 5
    assert any(str(r["mode"]) == "decode" for r in steps)
    assert [r["forward_ct"] for r in steps] == sorted(r["forward_ct"] for r in steps)


def test_hicache_host_pool_and_load_back_are_recorded(live):
    trace = live["trace"]
    pools = {str(r["pool"]) for r in tc.rows(trace, "pool")}
    assert "host_full" in pools
    ops = Counter(str(r["op"]) for r in tc.rows(trace, "cache"))
    assert ops["backup"] > 0 and ops["load_back"] > 0, ops
    acks = [r for r in tc.rows(trace, "cache") if str(r["op"]) == "unlock" and r["rid"] == -1
            and r["full_tokens"] > 0]  # write-through acks dropping their node locks
    assert acks
    by_rid = tc.request_rows(trace)
    h1 = live["responses"]["live-h1"]["meta_info"]
    assert h1["cached_tokens"] >= 300 and tc.end_row(by_rid, "live-h1")["cached_len"] == h1["cached_tokens"]
