"""The fork's DSV4 pools (its configurator path) and its own Scheduler driving them, at both commits.

One fork process per commit runs every case (a fork process spends most of its time importing
sglang); the tests read that run's summaries.
"""

from __future__ import annotations

import pytest

from tests.fork.conftest import COMMITS

# The shared README's tiny DSV4 config at max_total_tokens 16384: the sizes its probe reports.
DSV4_SIZES = {"swa_size": 1536, "c4_size": 4096, "c128_size": 128, "c4_state_pool_size": 96,
              "c128_state_pool_size": 16384, "page_size": 256}


def _shared_prefix_requests():
    from replay.backends.fork.driver import synth_tokens

    prefix = synth_tokens("shared", 300)
    return [{"rid": f"r{i}", "input_ids": prefix + synth_tokens(f"r{i}", 50), "max_new_tokens": 40,
             "arrival_step": i} for i in range(3)]


CASES = {
    "dsv4": dict(kind="dsv4", chunked_prefill_size=256),
    "dsv4_hicache": dict(kind="dsv4", chunked_prefill_size=256, hicache_host_tokens=32768),
    "swa16": dict(kind="swa", page_size=16, max_total_tokens=4096, swa_full_tokens_ratio=0.5,
                  sliding_window_tokens=32, chunked_prefill_size=128),
    "mha1": dict(kind="mha", page_size=1, max_total_tokens=4096),
}

_RUNS: dict = {}
_TMPDIRS: dict = {}


@pytest.fixture(scope="module", params=COMMITS)
def fork_run(request, fork_codes, tmp_path_factory):
    commit = request.param
    if commit not in _RUNS:
        from replay.codes import call_in_code

        reqs = _shared_prefix_requests()
        cases = [dict(opts, requests=reqs) for opts in CASES.values()]
        tmpdir = _TMPDIRS[commit] = tmp_path_factory.mktemp(f"tmpdir-{commit}")
        run = call_in_code(fork_codes[commit], "replay.backends.fork.driver:run_cases", {"cases": cases},
                           env={"TMPDIR": str(tmpdir)}, timeout_s=540)
        _RUNS[commit] = dict(zip(CASES, run.result))
    return commit, _RUNS[commit]


def test_the_runs_leave_nothing_in_the_temporary_directory(fork_run):
    """Each case's model directory and the files behind its Scheduler's ipc:// names (sglang's
    ``PortArgs`` makes them with ``NamedTemporaryFile(delete=False)``) are removed: before, every
    run left a ``kvtrace-fork-model-*`` directory and 3-5 empty ``tmp*`` files in /tmp."""
    commit, _ = fork_run
    left = sorted(p.name for p in _TMPDIRS[commit].iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], commit  # torch's compile cache (one per user, reused) is torch's own


pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("fork-driver")]  # module fixtures: one worker


def test_dsv4_pools_by_the_forks_configurator(fork_run):
    commit, runs = fork_run
    for name in ("dsv4", "dsv4_hicache"):
        pools = runs[name]["pools"]
        assert pools["configurator"] == "DSV4PoolConfigurator", (commit, name)
        assert pools["kv_pool"] == "DeepSeekV4TokenToKVPool" and pools["allocator"] == "SWATokenToKVPoolAllocator"
        assert {k: pools[k] for k in DSV4_SIZES} == DSV4_SIZES, (commit, name, pools)
        assert runs[name]["initial"] == {"full": 16384, "swa": 1536}
        assert pools["tree"] == "UnifiedRadixCache"


def test_dsv4_hicache_builds_the_forks_host_pools(fork_run):
    commit, runs = fork_run
    pools = runs["dsv4_hicache"]["pools"]
    assert pools["host_anchor"] == "LogicalHostPool" and pools["host_anchor_tokens"] == 32768, (commit, pools)
    assert pools["host_entries"]["swa"] == "DeepSeekV4PagedHostPool"
    assert "DeepSeekV4StateHostPool" in pools["host_entries"].values()
    assert "host_pool" not in runs["dsv4"]["pools"]


@pytest.mark.parametrize("case", list(CASES))
def test_scheduler_prefills_chunks_decodes_finishes_and_flushes_whole(fork_run, case):
    commit, runs = fork_run
    s = runs[case]
    assert s["num_finished"] == 3 and all(f["output_tokens"] == 40 for f in s["finished"].values()), (commit, s)
    assert s["prefill_steps"] >= 3 and s["decode_steps"] >= 39
    if case != "mha1":
        assert s["chunked_steps"] >= 1, (commit, case)  # a 350-token prompt over a 256/128-token chunk
    cached = sorted(f["cached_tokens"] for f in s["finished"].values())
    assert cached[0] == 0 and cached[1] >= (300 if case == "mha1" else 256), (commit, case, cached)  # the shared prefix
    assert s["min_available"]["full"] < s["initial"]["full"]
    assert s["flushed"] and s["after_flush"] == s["initial"], (commit, case, s["after_flush"])
    assert s["sent"].get("BatchTokenIDOutput", 0) >= 40


@pytest.mark.timeout(600)
def test_a_kvtrace_workload_runs_to_completion_under_swa_pressure(fork_codes):
    """300 multi_turn requests (cut to 1024 input / 32 new tokens) on the DSV4 stack at post659."""
    from replay.backends.fork.workload import requests_from_workload
    from replay.codes import call_in_code
    from tests.fork.conftest import ROOT

    reqs = requests_from_workload(ROOT / "data" / "workloads" / "multi_turn", max_requests=300,
                                  max_input_tokens=1024, max_new_tokens=32, step_ns=20_000_000)
    assert len({r["rid"] for r in reqs}) == 300
    s = call_in_code(fork_codes["post659"], "replay.backends.fork.driver:run_requests",
                     {"requests": reqs, "kind": "dsv4", "max_running_requests": 32, "sample_every_steps": 50},
                     timeout_s=540).result
    assert s["num_finished"] == 300
    assert s["cached_tokens"] > 0 and s["chunked_steps"] > 0
    assert s["min_available"]["swa"] < s["initial"]["swa"] // 4  # the SWA pool ran under pressure
    assert s["after_flush"] == s["initial"] == {"full": 16384, "swa": 1536}
