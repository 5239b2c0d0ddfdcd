"""The DeepSeek-V4 fork's own ``python -m sglang.launch_server`` on CPU, recorded.

A DSV4 server cannot start on CPU (its forward is CUDA-only: tilelang, deep_gemm, the fork's
JIT kernels; ../shared/targets/bytedance-dsv4/README.md), so the live server is the fork's tiny
hybrid-SWA ``LagunaForCausalLM`` (4 layers alternating sliding/full attention, window 32,
``SWAKVPool`` + ``SWATokenToKVPoolAllocator`` + the fork's ``UnifiedRadixCache`` with
``SGLANG_ENABLE_UNIFIED_RADIX_TREE=1``), at the fork's commit with #659. One server is recorded
through ``kvtrace launch`` and one through ``KVTRACE_DIR`` plus the ``.pth`` autoload; each
serves concurrent requests sharing a prefix, sequential prefix extensions and a flush, and the
trace is checked against what the server reported (cached tokens, ``/v1/loads`` used size) and
against itself (ledger and occupancy identity at every stats row), and its coverage must name
the fork's target with every hook of the server's stack installed.

The server runs in the fork's own environment (``replay.codes``: the code unpacked from the
shared tarball, transformers 5.6 overlay, import stubs, CPU kernel fallbacks; this directory's
``fork_site/sitecustomize.py`` bootstraps every process of the server tree).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.live import live_util as lu
from tests.live import trace_checks as tc
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.xdist_group("live-fork")]  # module fixtures: one worker

SHARED = lu.REPO.parent / "shared" / "targets" / "bytedance-dsv4"
POST659 = SHARED / "sglang-post659.tar.xz"
FORK_SITE = Path(__file__).with_name("fork_site")
PREFIX = list(range(100, 148))  # 48 shared tokens
FLAGS = ("--swa-full-tokens-ratio", "1.0", "--skip-tokenizer-init")


def _skip_without_shared():
    if not POST659.exists():
        pytest.skip(f"the fork's tarball is not here ({POST659}: ../shared is absent)")


def fork_env(extra: dict | None = None) -> dict:
    """The environment of a fork server process (the code's paths, then this repo, then the
    fork_site bootstrap), without any KVTRACE_* of the caller."""
    from replay.codes import code_environ, prepare

    code = prepare(POST659)
    env = code_environ(code, {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_ENABLE_UNIFIED_RADIX_TREE": "1"})
    for k in list(env):
        if k.startswith("KVTRACE_") and k != "KVTRACE_CODE_PYTHON":
            env.pop(k)
    env["PYTHONPATH"] = env["PYTHONPATH"] + ":" + str(FORK_SITE)
    env["PATH"] = str(lu.VENV_BIN) + ":" + env.get("PATH", "")
    env.update(extra or {})
    return env


def _drive(port: int) -> dict:
    out: dict = {}
    concurrent = {f"fork-c{i}": PREFIX + [200 + i] * (4 + i) for i in range(4)}
    threads = [threading.Thread(target=lambda r=r, ids=ids: out.__setitem__(r, lu.generate(port, ids, 16, rid=r)))
               for r, ids in concurrent.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    out["fork-s0"] = lu.generate(port, PREFIX + [300] * 20, 8, rid="fork-s0")
    out["fork-s1"] = lu.generate(port, PREFIX + [300] * 20 + [301] * 10, 40, rid="fork-s1")  # past the window
    return out


def _serve(d: Path, how: str) -> dict:
    _skip_without_shared()
    model = lu.write_laguna(d / "model")
    # The fork picks its nccl port with bind(0) and its scheduler binds it later (upstream picks
    # one below the ephemeral range), so the test hands it one: the port after --port. Both lie
    # below 22000, so the fork's derived gRPC port (--port + 10000) stays under 65536.
    port = lu.free_port(offsets=(0, 1))
    trace = d / "trace"
    server = [str(lu.VENV_BIN / "python"), "-m", "sglang.launch_server", "--model-path", str(model),
              "--port", str(port), "--nccl-port", str(port + 1), *lu.BASE_FLAGS, *FLAGS]
    if how == "launch":
        argv = [str(lu.VENV_BIN / "kvtrace"), "launch", "--out", str(trace), "--flush-ms", "200", "--", *server]
        env = fork_env()
    else:
        site = d / "site"
        site.mkdir()
        p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "hooks", "install-pth", "--site-dir", str(site)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        argv = server
        env = fork_env({"KVTRACE_DIR": str(trace), "KVTRACE_LIVE_SITE_DIR": str(site),
                        "KVTRACE_FLUSH_MS": "200"})
    srv = lu.LiveServer(argv, env, port, d / "server.log")
    try:
        srv.start()
        res = {"trace": trace, "start_s": srv.start_s, "how": how}
        res["responses"] = _drive(port)
        lu.wait_idle(port, timeout_s=120)
        time.sleep(1.0)
        res["loads_idle"] = lu.wait_idle(port, timeout_s=120)
        status, text = lu.post(port, "/flush_cache", {})
        assert status == 200, text
        time.sleep(1.0)
        srv.signal(signal.SIGTERM)
        res["exit_code"] = srv.wait(180)
        res["log"] = srv.log.read_text(errors="replace")
        # The fork's shutdown (TokenizerManager.sigterm_watchdog -> kill_process_tree(include_parent=True))
        # SIGKILLs its scheduler: the recording process never ends cleanly, so the trace is
        # 'crashed' with at most one flush interval (200 ms here, the server idle for 2 s) unwritten.
        # The SIGKILLed scheduler can outlive the server's main process by a moment (its lock is
        # held until it is gone): read the state once no process records (30 s at most).
        deadline = time.monotonic() + 30
        while True:
            res["state_at_exit"] = _inspect(trace, strict=False)[1]
            if "recording" not in res["state_at_exit"].get("rank_states", {}).values() \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "recover", str(trace)], capture_output=True,
                           text=True, timeout=300)
        res["recover"] = (p.returncode, p.stdout + p.stderr)
        return res
    finally:
        srv.kill_tree()


@pytest.fixture(scope="module", params=["launch", "pth"])
def live(request, tmp_path_factory):
    how = request.param
    return lu.shared_once(tmp_path_factory, f"live-fork-{how}", lambda d: _serve(d, how))


def _inspect(trace, strict: bool = True) -> tuple[int, dict]:
    p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "inspect", "--json", *(["--strict"] if strict else []), str(trace)],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"raw": p.stdout + p.stderr})


def test_the_server_served_with_prefix_hits(live):
    r = live["responses"]
    assert all("meta_info" in v for v in r.values()), {k: str(v)[:300] for k, v in r.items()}
    assert r["fork-s1"]["meta_info"]["cached_tokens"] >= len(PREFIX) + 20


def test_the_forks_shutdown_kills_the_recorder_and_the_trace_recovers(live):
    if live["how"] == "launch":  # launch passes on the server's own exit status: SIGKILLed by itself
        assert live["exit_code"] == 128 + signal.SIGKILL, live["log"][-3000:]
    assert "crashed" in json.dumps(live["state_at_exit"]), json.dumps(live["state_at_exit"])[:3000]
    assert live["recover"][0] == 0, live["recover"][1]


def test_trace_is_fully_covered_by_the_forks_target(live):
    """Every hook of the server's stack installed (the cache hooks too: the tree module is
    imported after the recording started, and the rank file is rewritten with the grown
    coverage); ``inspect --strict`` still says the rank was recovered, not complete."""
    from tracer.schema.manifest import read_rank_info

    cov = read_rank_info(live["trace"], 0)["coverage"]
    assert cov["target"] == "bytedance-dsv4-post659", cov
    states = {h: v["state"] for h, v in cov["hooks"].items()}
    assert {h for h, st in states.items() if st not in ("installed", "skipped")} == set(), states
    assert all(p["accounted"] for p in cov["pools"].values()), cov["pools"]
    code, info = _inspect(live["trace"])
    assert code != 0 and "recovered" in json.dumps(info)


def test_one_arrival_and_one_finish_per_request(live):
    by_rid = tc.request_rows(live["trace"])
    assert tc.lifecycle_problems(by_rid, {rid: "finish" for rid in live["responses"]}) == []


def test_hit_lengths_equal_the_servers_cached_tokens(live):
    by_rid = tc.request_rows(live["trace"])
    got = {rid: tc.end_row(by_rid, rid)["cached_len"] for rid in live["responses"]}
    want = {rid: r["meta_info"]["cached_tokens"] for rid, r in live["responses"].items()}
    assert got == want


def test_pool_sums_equal_the_servers_used_size(live):
    trace, (load,) = live["trace"], live["loads_idle"]
    clears = tc.clear_seqs(trace)
    assert clears, "the /flush_cache left no clear marker"
    idle = tc.last_stats_before(trace, 0, "full", clears[0])
    assert idle["capacity"] == load["max_total_num_tokens"]
    assert idle["capacity"] - idle["available"] - idle["evictable"] == load["num_used_tokens"]
    assert tc.ledger_until(trace, 0, idle["seq"])["full"] == idle["capacity"] - idle["available"]
    assert tc.ledger_until(trace, 0, clears[-1] + 1)["full"] == 0


def test_swa_pool_is_recorded_and_identity_and_ledger_hold_everywhere(live):
    pools = {str(r["pool"]) for r in tc.rows(live["trace"], "pool")}
    assert {"full", "swa"} <= pools, pools
    n, bad = identity_mismatches(live["trace"])
    assert n > 10 and bad == []
    n, bad = ledger_mismatches(live["trace"])
    assert n > 10 and bad == []


def test_verify_finds_no_divergence(live):
    p = subprocess.run([str(lu.VENV_BIN / "kvtrace"), "verify", "--json", str(live["trace"])],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
