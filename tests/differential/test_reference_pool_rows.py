"""The reference backend's traces carry ``pool`` rows (alloc/free per device and host pool), so
``kvtrace verify`` replays its allocator ops against every ``stats`` row and the host-allocator CPU
metrics are measured, as on real runs."""

from __future__ import annotations

import json

import polars as pl

from tests.differential.cases import CASES, write_case_workload


def test_reference_pool_rows_verify_against_every_stats_row(tmp_path):
    from replay.diagnosis.verify import verify
    from replay.runs.replay import replay_run
    from replay.trace import open_trace

    case = next(c for c in CASES if c.host_pool_tokens and c.page_size == 16)
    write_case_workload(case, tmp_path / "wl")
    run = tmp_path / "run"
    replay_run(tmp_path / "wl", run, policy="swa-fixes", sets=case.sets(), backend="reference", progress=False)
    rep = verify(run)
    assert rep.verdict == "ok", rep.to_dict()
    assert rep.stats_rows_checked > 100 and not rep.divergences and not rep.identity_violations
    pool = open_trace(run, strict=False).lazy("pool").collect()
    per_pool = {r["pool"]: r for r in pool.group_by("pool").agg(
        pl.len().alias("rows"), (pl.col("num_slots") * (pl.col("op") == "alloc")).sum().alias("alloc"),
        (pl.col("num_slots") * (pl.col("op") == "free")).sum().alias("free")).to_dicts()}
    assert {"full", "swa", "host_full"} <= set(per_pool)
    assert all(r["alloc"] >= r["free"] > 0 for p, r in per_pool.items() if p in ("full", "swa"))
    # page-aligned: slots = pages * page_size on the device pools
    dev = pool.filter(pl.col("pool").is_in(["full", "swa"]))
    assert (dev["num_slots"] == dev["num_pages"] * case.page_size).all()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["host_alloc_cpu_ns"] > 0
