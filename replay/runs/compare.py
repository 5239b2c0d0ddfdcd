"""``compare``: runs side by side, policies as rows, the summary figures as columns, and each
figure's change against a base policy (at the same grid point).

Signed figures (:data:`SIGNED`: slopes, which are negative when occupancy falls) get absolute
deltas only: a percentage of a signed base says nothing (-80,034 -> 241,723 tokens/h is not
"+402 %"), so their ``<figure>_delta_pct`` is null and the table shows ``(+321,757)``.
:func:`format_table` fits a width (``COLUMNS`` or the terminal's): policies as rows when that
fits, else figures as rows and runs as columns, in blocks of runs that fit.
"""

from __future__ import annotations

import os
from pathlib import Path

from replay.runs.replay import SUMMARY_FILE, RunError, read_summary
from replay.runs.jobs import PARTIAL_DIR

#: the figures ``compare`` shows, in order (``summary.json`` keys)
FIGURES = ("requests", "finished", "peak_full_used", "peak_swa_used", "mean_swa_used",
           "swa_used_slope_tokens_per_hour", "prefix_hit_ratio", "host_hit_ratio", "ttft_p50_ms",
           "ttft_p99_ms", "queue_p99_ms", "throughput_tokens_per_s", "retractions", "swa_evicted_tokens",
           "host_alloc_cpu_ns", "host_free_cpu_ns", "sched_cpu_ns", "sim_s", "wall_s",
           "peak_full_used_gb", "peak_swa_used_gb", "mean_swa_used_gb")
#: GB figures the table adds when some run knows its bytes per token (``replay.runs.kv_gb``)
GB_TABLE_FIGURES = ("peak_swa_used_gb", "mean_swa_used_gb")


#: figures that can be negative: deltas are absolute (no percentage)
SIGNED = frozenset({"swa_used_slope_tokens_per_hour"})


class RunsNotFound(RunError, FileNotFoundError):
    """No run where one was expected: a path that is neither a run nor a folder holding runs."""


def find_runs(runs) -> list[Path]:
    """Run directories (trace + ``summary.json``) from a run, a sweep or any folder of runs, or an
    iterable of these; a folder's runs are sorted, a sweep's unfinished ``.partial`` runs left out.

    Raises:
        RunsNotFound: a path that is not a directory, or a folder without any run below it.
    """
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    out: list[Path] = []
    for r in runs:
        root = Path(r)
        if not root.is_dir():
            raise RunsNotFound(f"{root}: not a directory; expected a run (kvtrace replay --out) or a sweep")
        if (root / SUMMARY_FILE).is_file():
            out.append(root)
            continue
        found = sorted(p.parent for p in root.rglob(SUMMARY_FILE) if PARTIAL_DIR not in p.parts)
        if not found:
            raise RunsNotFound(f"{root}: no {SUMMARY_FILE} below it; expected a run (kvtrace replay --out) "
                               "or a sweep directory of runs")
        out.extend(found)
    return out


def compare(path, *, base: str | None = None):
    """The comparison table of the runs under ``path`` (or a list of run directories).

    Args:
        path: a sweep directory, a run, or a list of run directories.
        base: policy, or code (the ``code=`` level of a ``--code`` sweep), to take deltas
            against (default: the first code of a code sweep; else ``baseline`` if present, else
            the first policy). Against a code, deltas are at the same policy and grid point;
            against a policy, at the same code and grid point.
    Returns:
        polars DataFrame: one row per run with ``policy`` (``code``), grid columns, ``base``, every figure of
        :data:`FIGURES`, and ``<figure>_delta`` / ``<figure>_delta_pct`` against the base run at the
        same grid point.
    Raises:
        RunError: no runs, or ``base`` is not among their policies.
    """
    import polars as pl

    dirs = find_runs(path)
    roots = Path(path) if not isinstance(path, (list, tuple)) else None
    rows = []
    for d in dirs:
        s = read_summary(d)
        grid = _grid_of(d, roots)
        rows.append({"run": str(d), "policy": s.policy} | grid | {f: getattr(s, f) for f in FIGURES})
    df = pl.DataFrame(rows, infer_schema_length=None)
    df = df.with_columns(pl.col(f).cast(pl.Float64) for f in FIGURES if f.endswith("_gb"))  # (all null: no bytes)
    policies = df["policy"].unique(maintain_order=True).to_list()
    codes = _code_order(df, roots)
    if base is None:
        base = codes[0] if codes else ("baseline" if "baseline" in policies else policies[0])
    if codes and base in codes:
        axis = "code"
    elif base in policies:
        axis = "policy"
    else:
        raise RunError(f"base {base!r} is not among the runs' policies ({', '.join(policies)})"
                       + (f" nor codes ({', '.join(codes)})" if codes else ""))
    df = df.with_columns(pl.lit(base).alias("base"))
    keys = [c for c in df.columns if c not in ("run", axis, "base") and c not in FIGURES]
    base_df = df.filter(pl.col(axis) == base).select(keys + list(FIGURES))
    base_df = base_df.rename({f: f"{f}__base" for f in FIGURES})
    joined = df.join(base_df, on=keys, how="left") if keys else df.join(base_df, how="cross")
    deltas = []
    for f in FIGURES:
        b = pl.col(f"{f}__base")
        deltas.append((pl.col(f) - b).alias(f"{f}_delta"))
        if f in SIGNED:
            deltas.append(pl.lit(None, dtype=pl.Float64).alias(f"{f}_delta_pct"))
            continue
        deltas.append(pl.when(b != 0).then((pl.col(f) - b) / b.abs() * 100).otherwise(None)
                      .round(2).alias(f"{f}_delta_pct"))
    out = joined.with_columns(deltas).drop([f"{f}__base" for f in FIGURES])
    values = codes if axis == "code" else policies
    order = {p: i for i, p in enumerate([base] + [p for p in values if p != base])}
    return (out.with_columns(pl.col(axis).replace_strict(order, return_dtype=pl.Int64).alias("__o"))
            .sort(["__o"] + keys).drop("__o"))


def _code_order(df, root: Path | None) -> list[str]:
    """The runs' codes (the ``code=`` level), in the sweep's ``--code`` order; [] without codes."""
    if "code" not in df.columns:
        return []
    found = [c for c in df["code"].unique(maintain_order=True).to_list() if c is not None]
    order: list[str] = []
    if root is not None and (root / "sweep.json").is_file():
        import json

        try:
            order = list((json.loads((root / "sweep.json").read_text()).get("codes") or {}))
        except ValueError:
            order = []
    return [c for c in order if c in found] + [c for c in found if c not in order]


def _grid_of(run: Path, root: Path | None) -> dict:
    """The hive levels of ``run`` under ``root`` (``code=``, grid knobs); ``policy=`` is the summary's."""
    if root is None:
        return {}
    try:
        rel = run.relative_to(root)
    except ValueError:
        return {}
    return {k: v for k, _, v in (part.partition("=") for part in rel.parts) if v and k != "policy"}


TABLE_FIGURES = ("finished", "peak_swa_used", "mean_swa_used", "swa_used_slope_tokens_per_hour",
                 "prefix_hit_ratio", "host_hit_ratio", "ttft_p50_ms", "ttft_p99_ms", "queue_p99_ms",
                 "throughput_tokens_per_s", "retractions", "swa_evicted_tokens", "host_free_cpu_ns",
                 "sched_cpu_ns")


def _cell(row: dict, f: str) -> str:
    v, pct, d = row[f], row.get(f"{f}_delta_pct"), row.get(f"{f}_delta")
    text = _num(v)
    if f in SIGNED:
        if d is not None and d != 0:
            text += f" ({'+' if d > 0 else '-'}{_num(abs(d))})"
    elif pct is not None and pct != 0:
        text += f" ({pct:+.1f}%)"
    return text


def _grid(rows: list[list[str]], right_from: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda cells: "  ".join(c.rjust(w) if i >= right_from else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [fmt(rows[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows[1:]]


def format_table(df, *, figures=None, base: str | None = None, width: int | None = None) -> str:
    """A plain-text table of :func:`compare`'s frame, each figure with its change against the
    base (``%``; signed figures: the absolute change), at most ``width`` characters wide
    (default: ``COLUMNS`` or the terminal's width).

    Policies are rows when that fits; otherwise figures are rows and runs columns (labelled by
    policy and grid point), in as many blocks of runs as the width needs."""
    import shutil

    figures = figures or TABLE_FIGURES + tuple(f for f in GB_TABLE_FIGURES if df[f].null_count() < df.height)
    width = width or shutil.get_terminal_size((100, 24)).columns
    heads = ["code", "policy"] if "code" in df.columns else ["policy"]
    keys = [c for c in df.columns if c not in ("run", "base", *heads) and c not in FIGURES
            and not c.endswith(("_delta", "_delta_pct"))]
    rows = list(df.iter_rows(named=True))
    wide = _grid([heads + keys + list(figures)]
                 + [[str(r[h]) for h in heads] + [str(r[k]) for k in keys] + [_cell(r, f) for f in figures]
                    for r in rows],
                 right_from=len(heads) + len(keys))
    if max(map(len, wide)) <= width:
        return "\n".join(wide)
    labels = [" ".join([str(r[h]) for h in heads] + [f"{k}={r[k]}" for k in keys]) for r in rows]
    cols = [[labels[i]] + [_cell(r, f) for f in figures] for i, r in enumerate(rows)]
    names = ["figure"] + list(figures)
    blocks, start = [], 0
    while start < len(cols):
        end = start + 1
        while end < len(cols) and max(map(len, _grid([[n] + [c[i] for c in cols[start:end + 1]]
                                                       for i, n in enumerate(names)]))) <= width:
            end += 1
        blocks.append("\n".join(_grid([[n] + [c[i] for c in cols[start:end]] for i, n in enumerate(names)])))
        start = end
    return "\n\n".join(blocks)


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4f}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


__all__ = ["FIGURES", "GB_TABLE_FIGURES", "SIGNED", "TABLE_FIGURES", "RunsNotFound", "compare", "find_runs", "format_table"]
