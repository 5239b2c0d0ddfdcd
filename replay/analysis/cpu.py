"""``host_allocator_cpu``: CPU time of allocator ops (per-op distribution, share of step time,
against the free-list size at the time of the op).

``pool`` rows carry ``dur_ns`` (CPU time of the op, 0 when not measured). Ops are attributed to
the scheduling step whose ``sched`` step row is the first one after them in ``seq`` order (the
hooks write a step row at the end of its step). Steps are told apart by their place in the trace,
not by ``forward_ct``: sglang's own ``Scheduler`` counts batches run, so an idle step's row
repeats the ``forward_ct`` of the batch step before it (each keeps its own row and ops here). The free-list size of an op is the pool's
``available`` in the last ``stats`` sample before it (host pools: free + released slots).
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.analysis._base import as_trace, pool_list
from replay.steps import number_steps, step_of_rows

HOST_POOLS = ("host_full", "host_swa")


@dataclass(frozen=True)
class AllocatorCpu:
    """Three Polars LazyFrames.

    Attributes:
        per_op: one row per (pool, op): ``ops, total_ns, mean_us, p50_us, p90_us, p99_us, max_us,
            share_of_step_pct`` (op CPU over the trace's total step time).
        per_step: one row per step row, in trace order: ``forward_ct, ts_ns, step_ns,
            alloc_cpu_ns, ops, share_of_step`` (allocator CPU of the selected pools / step time;
            ``forward_ct`` as recorded, which may repeat, see the module docstring).
        vs_free_list: one row per op: ``pool, op, seq, ts_ns, num_slots, dur_ns, free_list_slots``.
    """

    per_op: object
    per_step: object
    vs_free_list: object


def host_allocator_cpu(trace, pools=HOST_POOLS) -> AllocatorCpu:
    """Allocator CPU of ``pools`` (default the HiCache host pools; ``None`` = all KV pools)."""
    import polars as pl

    t = as_trace(trace)
    pools = pool_list(pools)
    ops = (t.lazy("pool")
           .select("seq", "ts_ns", pl.col("pool").cast(pl.String), pl.col("op").cast(pl.String),
                   pl.col("num_slots").cast(pl.Int64), "dur_ns")
           .filter(pl.col("pool").is_in(pools) & (pl.col("dur_ns") > 0)))
    steps = (t.lazy("sched").filter(pl.col("kind").cast(pl.String) == "step")
             .select("seq", "forward_ct", pl.col("ts_ns").alias("step_ts_ns"), "step_ns"))
    pos = number_steps(steps, "_step")  # the n-th step row: forward_ct may repeat
    total_step_ns = steps.select(pl.col("step_ns").sum())
    dur_us = pl.col("dur_ns") / 1e3
    per_op = (ops.group_by("pool", "op")
              .agg(ops=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(), mean_us=dur_us.mean(),
                   p50_us=dur_us.quantile(0.5, "nearest"), p90_us=dur_us.quantile(0.9, "nearest"),
                   p99_us=dur_us.quantile(0.99, "nearest"), max_us=dur_us.max())
              .join(total_step_ns, how="cross")
              .with_columns(share_of_step_pct=pl.when(pl.col("step_ns") > 0)
                            .then(100.0 * pl.col("total_ns") / pl.col("step_ns")).otherwise(None))
              .drop("step_ns")
              .sort("pool", "op"))
    per_step = (step_of_rows(ops, pos, "_step")
                .filter(pl.col("_step").is_not_null())
                .group_by("_step").agg(alloc_cpu_ns=pl.col("dur_ns").sum(), ops=pl.len().cast(pl.Int64)))
    per_step = (pos.join(per_step, on="_step", how="left")
                .with_columns(pl.col("alloc_cpu_ns", "ops").fill_null(0))
                .sort("_step")
                .select("forward_ct", pl.col("step_ts_ns").alias("ts_ns"), "step_ns", "alloc_cpu_ns", "ops")
                .with_columns(share_of_step=pl.when(pl.col("step_ns") > 0)
                              .then(pl.col("alloc_cpu_ns") / pl.col("step_ns")).otherwise(None)))
    stats = (t.lazy("stats").select("seq", pl.col("pool").cast(pl.String),
                                    pl.col("available").alias("free_list_slots"))
             .filter(pl.col("pool").is_in(pools)).sort("seq"))
    vs_free = (ops.filter(pl.col("op").is_in(("alloc", "free"))).sort("seq")
               .join_asof(stats, on="seq", by="pool", strategy="backward", check_sortedness=False)
               .select("pool", "op", "seq", "ts_ns", "num_slots", "dur_ns", "free_list_slots"))
    return AllocatorCpu(per_op, per_step, vs_free)
