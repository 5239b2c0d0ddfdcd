"""Every bundled workload records through real sglang code with zero drops, every family but
``drops`` non-empty, and the occupancy identity and pool ledger intact at every stats row."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.record import record_workload
from replay.trace import open_trace
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches

DATA = Path(__file__).resolve().parents[2] / "data" / "workloads"
SAMPLES = sorted(p.name for p in DATA.iterdir() if (p / "manifest.json").is_file() and p.name != "production_1h")


def test_samples_are_bundled():
    assert {"multi_turn", "agentic", "shared_prefix", "long_context", "mixed"} <= set(SAMPLES)


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.parametrize("sample", SAMPLES)
def test_bundled_workload_records_cleanly(sample, tmp_path):
    out = tmp_path / sample
    summary = record_workload(DATA / sample, out)
    assert summary["hook_failures"] == {}
    res = summary["result"]
    assert res["num_finished"] + res["num_aborted"] == res["num_requests"]
    tr = open_trace(out)
    assert tr.check() == []
    assert tr.num_dropped == 0
    empty = [f for f in ("request", "sched", "cache", "pool", "stats") if tr.rows(f) == 0]
    assert empty == []
    n, bad = identity_mismatches(out)
    assert n > 0 and bad == []
    n, bad = ledger_mismatches(out)
    assert n > 0 and bad == []


_MEASURED = {"pool": ["dur_ns"], "cache": ["dur_ns"], "sched": ["step_ns"]}


@pytest.mark.sglang
def test_recording_is_deterministic_on_the_virtual_clock(tmp_path):
    """Two recordings of a workload are row-for-row equal except measured CPU durations."""
    from click.testing import CliRunner

    from replay.cli import main as cli

    w = tmp_path / "w"
    res = CliRunner().invoke(cli, ["workload", "generate", "--shape", "multi_turn", "--requests", "30",
                                   "--seed", "5", "--out", str(w)])
    assert res.exit_code == 0, res.output
    for name in ("a", "b"):
        record_workload(w, tmp_path / name)
    a, b = open_trace(tmp_path / "a"), open_trace(tmp_path / "b")
    for fam in ("request", "sched", "cache", "pool", "stats"):
        ta = a.table(fam).drop_columns(_MEASURED.get(fam, []))
        tb = b.table(fam).drop_columns(_MEASURED.get(fam, []))
        assert ta.num_rows > 0 and ta.equals(tb), fam
