"""Agreement of sglang's own ``Scheduler`` (``scheduler=real``) with the restated loop (``mirror``).

Each case records the same workload through both schedulers with the tracer hooks on
(``record_run``) and compares the two traces read back with ``replay.trace.open_trace``:

- admissions: every ``sched`` admit/retract row (rid, prefix, extend, host hit, chunk asked and
  admitted, verdict, remaining budgets), in order;
- hits and evictions: every ``cache`` row (op, rid, hits, tokens per component, nodes,
  tombstones), in order;
- per-step occupancy: the non-idle ``sched`` step rows (mode, batch size, tokens) in order and
  every ``stats`` sample's (pool, available, evictable, protected, held), in order;
- the loops' own results (finished, aborted, retractions, steps, cached tokens, virtual clock).

Bundled workloads are cut to their first requests (``N_BUNDLED``) on small pools, so eviction,
chunking and SWA pressure all happen within a few seconds of CI time.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from replay.backends.sglang import load_workload
from replay.backends.sglang.settings import SglangSettings

from tests.sglang.backend_util import blocks, req, workload

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

DATA = Path(__file__).resolve().parents[2] / "data" / "workloads"
BUNDLED = sorted(p.name for p in DATA.iterdir() if p.is_dir()) if DATA.is_dir() else []
N_BUNDLED = 40
#: Small pools: the bundled prompts (up to ~8k tokens) fit, but 40 requests evict and chunk.
SMALL = dict(full_pool_tokens=32768, swa_full_tokens_ratio=0.25, chunked_prefill_size=2048,
             max_prefill_tokens=4096, max_running_requests=16)

_SCHED_COLS = ["kind", "rid", "prefix_len", "extend_len", "host_hit_len", "chunk_requested",
               "chunk_admitted", "verdict", "rem_total", "rem_swa", "swa_needed"]
_CACHE_COLS = ["op", "rid", "device_hit", "host_hit", "swa_host_hit", "full_tokens", "swa_tokens",
               "host_tokens", "nodes", "tombstones"]
_STATS_COLS = ["pool", "capacity", "available", "evictable", "protected", "held"]


def _record(w, settings: SglangSettings, out: Path):
    from replay.backends.sglang.run import record_run

    return record_run(w, settings, out)


def _views(trace_dir: Path) -> dict[str, list[tuple]]:
    import polars as pl

    from replay.trace import open_trace

    t = open_trace(trace_dir)
    sched = t.lazy("sched").sort("seq").collect()
    kind, mode = pl.col("kind").cast(pl.Utf8), pl.col("mode").cast(pl.Utf8)
    steps = sched.filter((kind == "step") & (mode != "idle"))
    decisions = sched.filter(kind != "step")
    cache = t.lazy("cache").sort("seq").collect()
    stats = t.lazy("stats").sort("seq").collect()
    # Each stats sample belongs to the step row written just before it (same boundary). Idle
    # boundaries are emitted at most once per KVTRACE_IDLE_SAMPLE_MS of wall time, so only the
    # samples that close a non-idle step are compared (numbered by that step).
    marks = sched.filter(kind == "step").select(
        "seq", (mode != "idle").cast(pl.Int64).cum_sum().alias("step_no"), (mode != "idle").alias("busy"))
    stats = stats.join_asof(marks, on="seq", strategy="backward").filter(pl.col("busy"))
    return {
        "admissions": decisions.select(_SCHED_COLS).rows(),
        "steps": steps.select(["mode", "batch_size", "num_tokens"]).rows(),
        "cache": cache.select(_CACHE_COLS).rows(),
        "stats": stats.select(["step_no", *_STATS_COLS]).rows(),
    }


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"row {i}: mirror {x} != real {y}"
    return f"lengths differ: mirror {len(a)} rows, real {len(b)} rows"


def assert_agree(w, settings: SglangSettings, tmp_path: Path) -> dict:
    runs = {}
    for sched in ("mirror", "real"):
        s = dataclasses.replace(settings, scheduler=sched)
        runs[sched] = (_record(w, s, tmp_path / sched), _views(tmp_path / sched))
    (rm, vm), (rr, vr) = runs["mirror"], runs["real"]
    for key in ("num_requests", "num_finished", "num_aborted", "num_retractions", "num_prefill_steps",
                "num_decode_steps", "prefill_tokens", "decode_tokens", "cached_tokens", "clock_ns"):
        assert getattr(rm.result, key) == getattr(rr.result, key), (
            f"{key}: mirror {getattr(rm.result, key)} != real {getattr(rr.result, key)}")
    for view in ("admissions", "steps", "cache", "stats"):
        assert vm[view] == vr[view], f"{view} differ: {_first_difference(vm[view], vr[view])}"
    assert vm["steps"] and vm["stats"]
    return vm


def _truncated(name: str, n: int):
    w = load_workload(DATA / name)
    w.__dict__["requests"] = w.requests[:n]  # the cached property: the first n arrivals
    return w


#: Per bundled workload: how many first arrivals, and settings over SMALL. Pools are sized so the
#: prompts that matter fit (agentic and long_context prompts run to ~128k tokens) while still
#: evicting and chunking; request counts keep the whole suite within ~3 minutes of CI time.
BUNDLED_CASES = {
    "agentic": (4, dict(full_pool_tokens=98304, chunked_prefill_size=8192, max_prefill_tokens=16384)),
    "long_context": (3, dict(full_pool_tokens=147456, chunked_prefill_size=8192, max_prefill_tokens=16384)),
    "mixed": (N_BUNDLED, {}),
    "multi_turn": (N_BUNDLED, {}),
    "production_1h": (24, dict(page_size=64, sliding_window_tokens=256)),
    "shared_prefix": (N_BUNDLED, {}),
}


def test_every_bundled_workload_has_a_case():
    # production_1h is git-ignored (``make data``): its case runs where it exists
    assert set(BUNDLED) <= set(BUNDLED_CASES) and set(BUNDLED_CASES) - set(BUNDLED) <= {"production_1h"}


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_workload_agrees(name, tmp_path):
    n, extra = BUNDLED_CASES.get(name, (N_BUNDLED, {}))
    w = _truncated(name, n)
    views = assert_agree(w, SglangSettings(**dict(SMALL, **extra)), tmp_path)
    assert views["cache"], "no cache operation recorded"


def _random_rows(seed: int) -> list[dict]:
    """Sessions and one-off prompts with shared prefixes, random lengths and arrival gaps."""
    rng = random.Random(seed)
    rows, t_ms = [], 0.0
    system = blocks(("sys", seed), rng.randint(2, 10))
    history: dict[int, list[int]] = {}
    for rid in range(rng.randint(12, 24)):
        t_ms += rng.expovariate(1 / 150.0)
        if rng.random() < 0.6:
            s = rng.randrange(4)
            hist = history.setdefault(s, list(system)) + blocks(("u", seed, rid), rng.randint(1, 12))
            history[s] = hist + blocks(("a", seed, rid), 1)
            rows.append(req(rid, t_ms, list(hist), out=rng.randint(1, 60), max_new=64, session=s,
                            turn=len(hist)))
        else:
            rows.append(req(rid, t_ms, system + blocks(("o", seed, rid), rng.randint(1, 40)),
                            out=rng.randint(1, 40), max_new=rng.choice([40, 80])))
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_randomized_workload_agrees(seed, tmp_path):
    rng = random.Random(100 + seed)
    settings = SglangSettings(
        page_size=rng.choice([1, 16]), sliding_window_tokens=rng.choice([0, 64, 128]),
        full_pool_tokens=rng.choice([4096, 8192]), swa_full_tokens_ratio=0.5,
        chunked_prefill_size=rng.choice([256, 1024]), max_prefill_tokens=2048,
        max_running_requests=rng.choice([4, 8]),
        swa_admission=rng.choice(["all_or_nothing", "shrink_never_fits"]))
    w = workload(tmp_path, _random_rows(seed))
    assert_agree(w, settings, tmp_path)


def test_long_prompt_is_admitted_with_max_new_tokens_clipped(tmp_path):
    """The agentic divergence: a prompt that fits the pool but not with its ``max_new_tokens``.
    sglang's Scheduler clips ``max_new_tokens`` at arrival (``init_req_max_new_tokens``:
    row width and ``max_new_tokens_for_memory``), so admission reserves the clipped budget and
    the request runs; the mirror used to keep the raw value, refuse it and abort it."""
    rows = [req(0, 0.0, blocks("short", 8), out=8, max_new=16),
            req(1, 50.0, blocks("long", 188), out=12, max_new=2048)]  # 3,008-token prompt, 4,096 pool
    settings = SglangSettings(page_size=16, sliding_window_tokens=0, full_pool_tokens=4096,
                              chunked_prefill_size=1024, max_prefill_tokens=2048, max_running_requests=4)
    w = workload(tmp_path, rows)
    assert_agree(w, settings, tmp_path)
    from replay.backends.sglang.loop import run_backend

    result = run_backend(w, settings, check_integrity_every=1)
    assert (result.num_finished, result.num_aborted) == (2, 0)


def test_hicache_agrees(tmp_path):
    """HiCache (host pool, write_through, direct I/O on CPU) through sglang's own Scheduler: the
    Scheduler builds the host pool and cache controller itself (``init_hicache``)."""
    w = _truncated("shared_prefix", 24)
    settings = SglangSettings(**dict(SMALL, host_pool_tokens=65536))
    views = assert_agree(w, settings, tmp_path)
    pools = {row[1] for row in views["stats"]}
    assert any(p.startswith("host") for p in pools), pools
    assert any(row[3] > 0 for row in views["cache"]), "no host hit: the case does not exercise HiCache"


def _request_rows(trace_dir: Path) -> list[tuple]:
    from replay.trace import open_trace

    return open_trace(trace_dir).lazy("request").sort("seq").collect().drop("seq").rows()


def test_real_scheduler_survives_an_oom_abort(tmp_path):
    """Differential case s1 (full pool 24, SWA 18, page 1): ``retract_decode`` aborts request 3,
    out of memory even alone. sglang reports it only through ``send_abort_output`` (an
    ``AbortReq`` to the tokenizer); the real-Scheduler backend reads it there and completes the
    request as ``retract_oom`` where the mirror does, so the run ends as the mirror's does (it
    used to stall with the request still active) and the traces agree."""
    from replay.runs.replay import MEASURED, replay_run
    from tests.differential.cases import CASES, write_case_workload

    case = next(c for c in CASES if c.name.startswith("s1-"))
    write_case_workload(case, tmp_path / "wl")
    runs = {}
    for sched in ("mirror", "real"):
        summary = replay_run(tmp_path / "wl", tmp_path / sched, policy="swa-fixes",
                             sets=[*case.sets(), f"scheduler={sched}"])
        assert summary.settings["scheduler"] == sched
        runs[sched] = summary.to_dict()
        for key in (*MEASURED, "run", "settings"):
            runs[sched].pop(key)
    mirror, real = runs["mirror"], runs["real"]
    assert (mirror["requests"], mirror["finished"], mirror["aborted"], mirror["retractions"],
            mirror["steps"]) == (24, 23, 1, 2, 285)
    assert real == mirror
    vm, vr = _views(tmp_path / "mirror"), _views(tmp_path / "real")
    for view in ("admissions", "steps", "cache", "stats"):
        assert vm[view] == vr[view], f"{view} differ: {_first_difference(vm[view], vr[view])}"
    retracts = [row for row in vm["admissions"] if row[0] == "retract"]
    assert [(row[1], row[7]) for row in retracts] == [(3, "none"), (5, "none")]
    assert _request_rows(tmp_path / "mirror") == _request_rows(tmp_path / "real")


def test_swa_pool_larger_than_full_pool_agrees(tmp_path):
    """An SWA pool above the full pool (differential cases s4/s5): sglang refuses
    ``--swa-full-tokens-ratio`` > 1, which only sizes the model runner's pools; the replay
    Scheduler gets the settings' pools (SWA 96 tokens, full 64) and agrees with the mirror."""
    settings = SglangSettings(page_size=1, sliding_window_tokens=24, full_pool_tokens=64, swa_pool_tokens=96,
                              chunked_prefill_size=8, max_prefill_tokens=16, max_running_requests=8,
                              swa_eviction_interval_tokens=8)
    w = workload(tmp_path, [req(0, 0.0, blocks("a", 1), out=6, max_new=8),
                            req(1, 5.0, blocks("a", 1) + blocks("b", 1), out=9, max_new=12),
                            req(2, 10.0, blocks("c", 1), out=4, max_new=8)])
    views = assert_agree(w, settings, tmp_path)
    assert {row[1]: row[2] for row in views["stats"]} == {"full": 64, "swa": 96}


def test_replays_in_one_process_leave_no_descriptors_and_disarm_the_watchdog(tmp_path, monkeypatch):
    """Each real-Scheduler replay used to leave its ZMQ context (~11 descriptors), a /dev/shm load
    snapshot and an armed sglang watchdog (which SIGQUITs the PARENT process once forward_ct stands
    still with a batch in cur_batch_for_debug) behind: a notebook or a test worker running many
    replays ran out of select()-able descriptors. Two replays: the second leaves no descriptor."""
    import os

    import replay.backends.sglang.scheduler as real

    seen = []
    close = real._close_ipc
    monkeypatch.setattr(real, "_close_ipc", lambda sched: (seen.append(sched), close(sched)))
    settings = SglangSettings(page_size=1, sliding_window_tokens=24, full_pool_tokens=256, swa_pool_tokens=64,
                              chunked_prefill_size=8, max_prefill_tokens=16, max_running_requests=8,
                              scheduler="real")
    w = workload(tmp_path, [req(0, 0.0, blocks("a", 2), out=6, max_new=8),
                            req(1, 1.0, blocks("a", 2) + blocks("b", 1), out=5, max_new=8)])

    def fds() -> set[int]:
        return {int(f) for f in os.listdir("/proc/self/fd")}

    _record(w, settings, tmp_path / "r1")
    before = fds()
    _record(w, settings, tmp_path / "r2")
    assert fds() - before == set()
    assert len(seen) == 2
    for sched in seen:
        assert sched.watchdog.is_active() is False and sched.cur_batch_for_debug is None
        assert sched.load_snapshot_writer is None
