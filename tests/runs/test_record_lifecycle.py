"""The one recording lifecycle (replay.backends.base.record_trace) under both backends'
``record_run`` and under ``record_workload``; the one ``find_runs``."""

from __future__ import annotations

import json

import pytest

from replay import knobs
from replay.errors import Interrupted, KvtraceError
from replay.runs.replay import RunError
from tests.runs.conftest import SMALL


def _reference(values=()):
    from replay.backends.reference.run import settings_from_knobs

    return settings_from_knobs(knobs.defaults() | knobs.parse_sets(SMALL + tuple(values)))


def test_reference_record_run_interrupted_keeps_the_trace_marked(small_workload, tmp_path):
    from replay.backends.reference.run import record_run
    from replay.workloads import read_workload

    wl = read_workload(small_workload)

    def stop_after_three(done, clock_ns):
        if done >= 3:
            raise KeyboardInterrupt("SIGTERM")

    out = tmp_path / "t"
    with pytest.raises(Interrupted) as e:
        record_run(wl, _reference(), out, on_progress=stop_after_three)
    assert e.value.signal_name == "SIGTERM"
    assert str(e.value) == (f"{out}: interrupted by SIGTERM after 3 of 12 requests; what was recorded is "
                            "kept and its rank file says interrupted")
    assert json.loads((out / "ranks" / "rank=0.json").read_text())["state"] == "interrupted"
    with pytest.raises(ValueError, match="already holds a trace; choose a new --out"):
        record_run(wl, _reference(), out)


def test_reference_record_run_times_every_request(small_workload, tmp_path):
    from replay.backends.reference.run import record_run
    from replay.workloads import read_workload

    wl = read_workload(small_workload)
    seen = []
    rec = record_run(wl, _reference(), tmp_path / "t", manifest_extra={"run": {"policy": "x"}},
                     on_progress=lambda done, clock: seen.append(done))
    assert sorted(rec.times) == list(range(12)) and rec.first_arrival_ns == 0
    assert all(t.reason == "finished" and t.arrival_ns <= t.scheduled_ns < t.first_token_ns <= t.finish_ns
               for t in rec.times.values())
    assert seen == sorted(seen) and seen[-1] == 12 == rec.result.num_finished
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["run"] == {"policy": "x"}
    assert (rec.patches, rec.hook_failures, rec.sglang_version, rec.backend_info, rec.incident) == ([], {}, "", {}, {})


def test_record_workload_reference_writes_backend_json(small_workload, tmp_path):
    from replay.record import record_workload

    s = record_workload(small_workload, tmp_path / "t", backend="reference", overrides=SMALL)
    assert json.loads((tmp_path / "t" / "backend.json").read_text()) == json.loads(json.dumps(s))
    assert (s["backend"], s["end_state"], s["patches"], s["hook_failures"]) == ("reference", "complete", [], {})
    assert s["settings"]["full_pool_tokens"] == 16384 and "scheduler" not in s["settings"]
    assert s["result"]["num_requests"] == 12 == s["result"]["num_finished"]
    with pytest.raises(KvtraceError, match="--incident lost_free: bugs are planted in the real sglang classes"):
        record_workload(small_workload, tmp_path / "u", backend="reference", incident="lost_free")
    with pytest.raises(KvtraceError, match=r"--set max_context_tokens=64: a request row that small"):
        record_workload(small_workload, tmp_path / "v", backend="reference", overrides=("max_context_tokens=64",))
    with pytest.raises(KvtraceError, match="--set: page_size='0': expected a number >= 1"):
        record_workload(small_workload, tmp_path / "w", backend="reference", overrides=("page_size=0",))


def test_find_runs_is_one_function(tmp_path):
    from replay.analysis import find_runs as analysis_find_runs
    from replay.runs.compare import RunsNotFound, find_runs

    assert analysis_find_runs is find_runs
    for rel in ("policy=b/x=1", "policy=a/x=2", ".partial/policy=a__x=3"):
        (tmp_path / "S" / rel).mkdir(parents=True)
        (tmp_path / "S" / rel / "summary.json").write_text("{}")
    runs = [tmp_path / "S" / "policy=a" / "x=2", tmp_path / "S" / "policy=b" / "x=1"]
    assert find_runs(tmp_path / "S") == runs
    assert find_runs(str(runs[1])) == [runs[1]]
    assert find_runs([runs[1], tmp_path / "S"]) == [runs[1]] + runs
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunsNotFound, match="empty: no summary.json below it") as e:
        find_runs(tmp_path / "empty")
    assert isinstance(e.value, RunError) and isinstance(e.value, FileNotFoundError)
    with pytest.raises(RunsNotFound, match="missing: not a directory"):
        find_runs([runs[0], tmp_path / "missing"])
