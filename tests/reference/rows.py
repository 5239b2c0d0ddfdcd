"""Every row of a reference run, for row-by-row comparisons of two runs (exactness tests).

:func:`reference_rows` records ``workload`` under ``policy`` + ``sets`` on the reference backend
and returns each family's rows in ``seq`` order with every column but the measured ones
(``dur_ns``: wall time an operation took); two runs of the same code are equal row for row.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MEASURED_COLUMNS = ("dur_ns",)


def trace_rows(trace: str | Path) -> dict[str, list[dict]]:
    """{family: rows sorted by seq} of a trace directory, measured columns dropped."""
    out = {}
    for fam_dir in sorted(p for p in Path(trace).iterdir() if p.is_dir()):
        files = sorted(fam_dir.rglob("*.parquet"))
        if not files:
            continue
        table = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("seq")
        cols = [c for c in table.column_names if c not in MEASURED_COLUMNS]
        out[fam_dir.name] = table.select(cols).to_pylist()
    return out


def reference_rows(workload: str | Path, out: str | Path, policy: str, sets=(), max_requests: int | None = None
                   ) -> dict[str, list[dict]]:
    """Record ``workload`` (its first ``max_requests`` arrivals when given) on the reference
    backend at ``out`` and return :func:`trace_rows` of the run."""
    from replay.backends.reference.run import record_run, settings_from_knobs
    from replay.runs.replay import resolve_settings
    from replay.workloads import read_workload

    values, _ = resolve_settings(workload, policy, list(sets), "reference")
    wl = read_workload(workload)
    if max_requests is not None:
        # the first arrivals only (``requests`` is a cached property; the row width stays the
        # whole workload's, ``max_seq_tokens``)
        wl.__dict__["requests"] = wl.requests[:max_requests]
    record_run(wl, settings_from_knobs(values), out)
    return trace_rows(out)


def first_difference(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> str | None:
    """None when ``a`` and ``b`` hold the same rows; else where they first part."""
    if sorted(a) != sorted(b):
        return f"families {sorted(a)} vs {sorted(b)}"
    for fam in sorted(a):
        ra, rb = a[fam], b[fam]
        for i, (x, y) in enumerate(zip(ra, rb)):
            if x != y:
                return f"{fam} row {i}: {x} != {y}"
        if len(ra) != len(rb):
            return f"{fam}: {len(ra)} rows vs {len(rb)}"
    return None
