"""bench/live_overhead.py: the per-level step cost measured on a live CPU sglang server.

The live check runs the smallest useful pair (hooks off, then ``steps``; three waves) and checks
the result's keys and facts, not the figures (a shared machine makes them noisy); the others test
the comparison on made-up iterations and the refusal of a bad level (no server).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.live import live_util as lu

sys.path.insert(0, str(lu.REPO / "bench"))
import live_overhead as lo  # noqa: E402


def _rows(cpu_us, n, mode=lo.DECODE, bs=8, fwd_us=0.0):
    return [[int((cpu_us + i % 3) * 1e3), int(2 * cpu_us * 1e3), int(fwd_us * 1e3), mode, bs, bs]
            for i in range(n)]


def test_excess_compares_like_groups_and_weights_by_the_hooked_counts():
    base = _rows(100, 10) + _rows(300, 10, bs=4)
    hooked = _rows(110, 30) + _rows(320, 10, bs=4) + _rows(900, 5, bs=2)  # bs 2: not in base
    ex = lo.excess(base, hooked)
    assert ex["steps_compared"] == 40
    assert ex["min"] == pytest.approx((30 * 10 + 10 * 20) / 40)
    assert ex["median"] == pytest.approx((30 * 10 + 10 * 20) / 40)
    sched = lo.excess(_rows(100, 5, fwd_us=90), _rows(100, 5, fwd_us=80), sched=True)
    assert sched["min"] == pytest.approx(10)
    assert lo.excess(base, _rows(5, 2, bs=1))["min"] is None  # nothing comparable


def test_paired_needs_the_same_batch_sequence():
    base = _rows(100, 4, fwd_us=50)
    assert lo.paired(base, _rows(120, 4, fwd_us=60)) == pytest.approx(10)
    assert lo.paired(base, _rows(120, 4, bs=4)) is None


def test_a_bad_level_is_refused_before_any_server_starts():
    p = subprocess.run([sys.executable, str(lu.REPO / "bench" / "live_overhead.py"),
                        "--levels", "everything"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "unknown level" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_live_measurement_of_one_level_has_sane_keys(tmp_path):
    res = lo.measure_live(("steps",), waves=3, batch=4, new_tokens=12, noise=False,
                          work=tmp_path)
    assert res["server_step_us"] > 0 and res["server_step_cpu_us"] > 0
    assert res["off"]["kvtrace_recording"] is False
    assert res["off"]["requests"] == 12 and res["off"]["step_modes"]["decode"] >= 3 * 10
    lv = res["levels"]["steps"]
    assert lv["kvtrace_recording"] is True  # the hooks really ran in the scheduler process
    assert lv["requests"] == 12 and lv["step_modes"]["extend"] >= 3
    assert 0 < lv["steps_compared"] <= lv["steps"]
    for key in ("us_per_step", "us_per_step_median", "us_per_step_mean", "us_per_step_sched",
                "pct_of_server_step"):
        assert isinstance(lv[key], float) and math.isfinite(lv[key]), (key, lv)
    paired = lv["us_per_step_paired_sched"]  # None only if the two runs batched differently
    assert paired is None or math.isfinite(paired)
    assert lv["noise_us_per_step"] is None  # no off2 run asked for
    assert (tmp_path / "steps" / "trace").is_dir()  # recorded by kvtrace launch
