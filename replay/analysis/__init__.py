"""Query library over schema-v1 traces and runs: Polars LazyFrames / DuckDB relations, no plotting.

Every function takes a trace directory (or an opened :class:`replay.trace.Trace`) and reads it
only through ``replay.trace``. Captures, recordings and replay runs all work (a run is a trace
plus ``summary.json``). See ``docs/analysis.md``.
"""

from replay.analysis.capacity import CapacityCurve, capacity_curve
from replay.analysis.churn import churn
from replay.analysis.cpu import AllocatorCpu, host_allocator_cpu
from replay.analysis.occupancy import occupancy
from replay.analysis.requests import holdings, lifetimes, prefix_hit_ratio, prefix_hits, reuse_intervals
from replay.analysis.runs import compare_runs, find_runs

__all__ = ["AllocatorCpu", "CapacityCurve", "capacity_curve", "churn", "compare_runs", "find_runs",
           "holdings", "host_allocator_cpu", "lifetimes", "occupancy", "prefix_hit_ratio",
           "prefix_hits", "reuse_intervals"]
