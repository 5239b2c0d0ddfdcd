"""``bench/sglang_overhead.py --target fork-post659`` runs end to end and prints the figures issue 23
names (a smoke run: 3 requests, 1 round; the figures themselves come from a quiet machine, see
bench/fork_overhead.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fork.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("fork-driver")]


def test_fork_overhead_bench_json(fork_codes):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sglang_overhead.py"), "--target", "fork-post659",
                          "--workload", str(ROOT / "data" / "workloads" / "mixed"), "--requests", "3",
                          "--repeat", "1", "--breakdown", "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=850)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["target"] == "fork-post659" and r["kind"] == "dsv4" and r["target_ratio"] == 1.3
    for side in ("sglang-0.5.23", "fork"):
        v = r[side]
        assert v["num_steps"] > 10 and v["rows_per_step"] > 1
        assert {"us_per_step", "us_per_step_trimmed", "us_per_step_median", "backend_step_us",
                "noise_us_per_step_trimmed"} <= set(v)
    # the same requests on both codes: step counts within a few percent (the fork's page is 256)
    a, b = r["sglang-0.5.23"]["num_steps"], r["fork"]["num_steps"]
    assert abs(a - b) / a < 0.1, (a, b)
    assert isinstance(r["resolved"], bool)
    bd = r["breakdown"]["fork"]
    names = {h["name"] for h in bd["hooks"]}
    assert {"Scheduler.get_next_batch_to_run", "PagedTokenToKVPoolAllocator.alloc_decode"} <= names
