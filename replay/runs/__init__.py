"""Runs: a replay of a trace's requests under a policy, written as a trace plus ``summary.json``.

    from replay.runs import replay_run, sweep, compare
    s = replay_run("data/workloads/multi_turn", "/tmp/r", policy="swa-fixes")
    sweep("data/workloads/multi_turn", "/tmp/R", policies=["baseline", "swa-fixes"], jobs=2)
    compare("/tmp/R", base="baseline")   # polars DataFrame: policies as rows, deltas vs base

Modules: ``replay`` (one run), ``metrics`` (figures from a trace), ``sweep`` (cross product,
hive layout, local or Ray executor), ``compare`` (the table).
"""

from replay.runs.replay import MEASURED, RunError, RunSummary, SUMMARY_FILE, read_summary, replay_run, resolve_settings

__all__ = ["MEASURED", "RunError", "RunSummary", "SUMMARY_FILE", "read_summary", "replay_run", "resolve_settings"]
