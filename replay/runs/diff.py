"""``diff_runs``: the first step where two runs' trajectories diverge, metric by metric.

A run's trajectory is one row per scheduler step: the run's ``sched`` step rows in order, step
``n`` being the ``n``-th (counted from 1). Steps are aligned by that position, not by the rows'
``forward_ct``: with sglang's own ``Scheduler`` (a server's trace, or the sglang backend's default
``scheduler=real``) ``forward_ct`` is the Scheduler's count of batches run, so an idle iteration's
row repeats the number of the batch step before it, while the mirror and the reference number
every step. Each step keeps its ``forward_ct`` (shown, not compared). Every other row belongs to a
step by its place in the trace (``seq``):

| metric | source |
|---|---|
| ``mode``, ``batch_size``, ``num_tokens`` | the step row |
| ``admitted`` | ``sched`` admit rows with ``chunk_admitted > 0`` before the step row (since the previous one): "rid:tokens" list |
| ``retracted`` | ``sched`` retract rows before the step row (since the previous one): rid list |
| ``evicted_full``, ``evicted_swa`` | ``cache`` evict rows before the step row (since the previous one): sums |
| ``<pool>_used`` (full, swa, host_full, host_swa) | the last ``stats`` row after the step row (before the next one): capacity - available, carried forward over steps without a sample |

Per request (:func:`request_hits`): device and host hit tokens of its last ``cache`` match before
each admission, and ``cached_len`` of its finish row. Used by ``kvtrace diff`` and by the
differential suite (``tests/differential``) that holds the two backends to each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from replay.steps import number_steps, step_of_rows

POOLS = ("full", "swa", "host_full", "host_swa")
STEP_METRICS = ("mode", "batch_size", "num_tokens", "admitted", "retracted", "evicted_full", "evicted_swa",
                *(f"{p}_used" for p in POOLS))


@dataclass(frozen=True)
class MetricDivergence:
    """The first step where one metric differs."""

    metric: str
    step: int
    a: object
    b: object


@dataclass(frozen=True)
class RunDiff:
    """What :func:`diff_runs` returns.

    Attributes:
        first_step: the first step where any compared metric differs (None: identical trajectories).
        metrics: per metric, its first divergence (only diverging metrics).
        context: rows of both trajectories around ``first_step``: {"step": n, "a": {...}, "b": {...}}.
        steps_a, steps_b: steps in each run.
    """

    run_a: str
    run_b: str
    steps_a: int
    steps_b: int
    first_step: int | None
    metrics: list[MetricDivergence] = field(default_factory=list)
    context: list[dict] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.first_step is None

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """Human-readable report."""
        if self.identical:
            return f"identical trajectories over {self.steps_a} steps"
        lines = [f"first divergence at step {self.first_step} ({self.steps_a} vs {self.steps_b} steps)"]
        for m in self.metrics:
            lines.append(f"  {m.metric:<14} step {m.step:>7}: A={m.a!s:<24} B={m.b!s}")
        lines.append("around it:")
        for row in self.context:
            mark = ">" if row["step"] == self.first_step else " "
            lines.append(f"{mark} step {row['step']}")
            for side in ("a", "b"):
                vals = row[side] or {}
                lines.append(f"    {side.upper()}: " + ", ".join(f"{k}={vals.get(k)}"
                                                              for k in ("forward_ct", *STEP_METRICS)))
        return "\n".join(lines)


def _step_rows(sched):
    """Split ``sched`` rows (sorted by ``seq``) into step rows and the others, each with ``step``:
    the position of a step row, and of the step row an admit/retract row precedes (null after
    the last step row)."""
    import polars as pl

    kind = pl.col("kind").cast(pl.Utf8)
    steps = number_steps(sched.filter(kind == "step"), offset=1)
    return steps, step_of_rows(sched.filter(kind != "step"), steps)


def sched_rows(path: str | Path, kind: str = "admit"):
    """The run's ``sched`` rows of ``kind`` (``admit`` or ``retract``), all columns plus ``step``:
    the trajectory step (see the module docstring) each belongs to, whatever the run's
    ``forward_ct`` numbering. Rows after the last step row are left out."""
    import polars as pl

    from replay.trace import open_trace

    _, other = _step_rows(open_trace(path, strict=False).lazy("sched").collect().sort("seq"))
    return other.filter((pl.col("kind").cast(pl.Utf8) == kind) & pl.col("step").is_not_null())


def trajectory(path: str | Path):
    """One row per step of the run at ``path`` (polars DataFrame with ``step``, ``forward_ct`` and
    :data:`STEP_METRICS`)."""
    import polars as pl

    from replay.trace import open_trace

    tr = open_trace(path, strict=False)
    sched = (tr.lazy("sched").select("seq", "kind", "forward_ct", pl.col("mode").cast(pl.Utf8), "batch_size",
                                     "num_tokens", "rid", "chunk_admitted").collect().sort("seq"))
    steps, other = _step_rows(sched)
    other = other.with_columns(pl.col("kind").cast(pl.Utf8))
    admits = (other.filter((pl.col("kind") == "admit") & (pl.col("chunk_admitted") > 0))
              .group_by("step")
              .agg(admitted=pl.concat_str(pl.col("rid").cast(pl.Utf8), pl.lit(":"),
                                          pl.col("chunk_admitted").cast(pl.Utf8)).sort().str.join(" ")))
    retracts = (other.filter(pl.col("kind") == "retract").group_by("step")
                .agg(retracted=pl.col("rid").sort().cast(pl.Utf8).str.join(" ")))
    evict = (tr.lazy("cache").filter(pl.col("op") == "evict").select("seq", "full_tokens", "swa_tokens")
             .collect().sort("seq"))
    ev = (step_of_rows(evict, steps)
          .group_by("step").agg(evicted_full=pl.col("full_tokens").sum(), evicted_swa=pl.col("swa_tokens").sum()))
    out = (steps.select("step", "forward_ct", "mode", "batch_size", "num_tokens")
           .join(admits, on="step", how="left").join(retracts, on="step", how="left")
           .join(ev, on="step", how="left")
           .with_columns(pl.col("admitted").fill_null(""), pl.col("retracted").fill_null(""),
                         pl.col("evicted_full").fill_null(0), pl.col("evicted_swa").fill_null(0)))
    stats = (step_of_rows(tr.lazy("stats").select(pl.col("pool").cast(pl.Utf8), "seq",
                                                  used=pl.col("capacity") - pl.col("available")).collect(),
                          steps, before=False)
             .filter(pl.col("step").is_not_null()).unique(["step", "pool"], keep="last"))
    for pool in POOLS:
        col = f"{pool}_used"
        s = stats.filter(pl.col("pool") == pool).select("step", pl.col("used").alias(col))
        out = out.join(s, on="step", how="left").sort("step").with_columns(pl.col(col).forward_fill())
    return out.sort("step")


def request_hits(path: str | Path):
    """Per request: device/host hit of each admission's match and the finish row's ``cached_len``."""
    import polars as pl

    from replay.trace import open_trace

    tr = open_trace(path, strict=False)
    matches = (tr.lazy("cache").filter((pl.col("op") == "match") & (pl.col("rid") >= 0))
               .select("rid", "seq", "device_hit", "host_hit").collect().sort("seq"))
    hits = matches.group_by("rid").agg(pl.col("device_hit").last(), pl.col("host_hit").last())
    fin = (tr.lazy("request").filter(pl.col("event") == "finish").select("rid", "cached_len", "output_len")
           .collect())
    return fin.join(hits, on="rid", how="left").sort("rid")


def diff_runs(run_a: str | Path, run_b: str | Path, *, metrics=STEP_METRICS, context: int = 2) -> RunDiff:
    """Compare two runs' trajectories step by step.

    Args:
        run_a, run_b: run (or any trace) directories.
        metrics: which of :data:`STEP_METRICS` to compare.
        context: steps shown on each side of the first divergence.
    Returns:
        :class:`RunDiff`.
    Raises:
        ValueError: a path is not a trace, or an unknown metric.
    """
    import polars as pl

    bad = [m for m in metrics if m not in STEP_METRICS]
    if bad:
        raise ValueError(f"unknown metric(s) {', '.join(bad)}; expected some of {', '.join(STEP_METRICS)}")
    ta, tb = trajectory(run_a), trajectory(run_b)
    both = ta.join(tb, on="step", how="full", suffix="_b", coalesce=True).sort("step")
    divs: list[MetricDivergence] = []
    for m in metrics:
        a, b = both[m], both[f"{m}_b"]
        neq = ~((a == b).fill_null(False) | (a.is_null() & b.is_null()))
        if neq.any():
            i = int(neq.arg_max())
            divs.append(MetricDivergence(m, int(both["step"][i]), a[i], b[i]))
    first = min((d.step for d in divs), default=None)
    rows = []
    if first is not None:
        near = both.filter((pl.col("step") >= first - context) & (pl.col("step") <= first + context))
        for r in near.iter_rows(named=True):
            rows.append({"step": r["step"], "a": {"forward_ct": r["forward_ct"], **{m: r[m] for m in STEP_METRICS}},
                         "b": {"forward_ct": r["forward_ct_b"], **{m: r[f"{m}_b"] for m in STEP_METRICS}}})
    divs.sort(key=lambda d: (d.step, STEP_METRICS.index(d.metric)))
    return RunDiff(str(run_a), str(run_b), ta.height, tb.height, first, divs, rows)


__all__ = ["POOLS", "STEP_METRICS", "MetricDivergence", "RunDiff", "diff_runs", "request_hits", "sched_rows",
           "trajectory"]
