"""``compare_runs``: one row per run from each run's ``summary.json``.

A run is a trace directory plus ``summary.json`` (written by ``replay.runs``, found by
:func:`replay.runs.compare.find_runs`). A sweep directory holds runs in a hive layout
``RUNS/policy=<p>/<k>=<v>/``; the ``k=v`` parts of a run's path become columns (as strings)
next to the summary's metrics and its flattened ``settings`` (``set.<name>``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from replay.runs.compare import find_runs
from replay.runs.replay import SUMMARY_FILE


def load_summary(run: Path) -> dict:
    path = Path(run) / SUMMARY_FILE
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); expected a run summary") from None


def compare_runs(runs, base: str | None = None):
    """Polars DataFrame of runs side by side.

    Args:
        runs: a run directory, a sweep directory, or a list of them.
        base: the ``run`` value (relative path) of the baseline; when given, every numeric metric
            also gets a ``<metric>_vs_base`` column (run / base).
    Returns:
        columns ``run``, hive keys, ``policy``, ``backend``, the numeric metrics, ``set.<name>``.
    """
    import polars as pl

    paths = find_runs(runs)
    root = _common_root(paths)
    rows = []
    for p in paths:
        s = load_summary(p)
        rel = str(p.resolve().relative_to(root.resolve())) if root and p.resolve() != root.resolve() else p.name
        row = {"run": rel}
        for part in Path(rel).parts:
            if "=" in part:
                k, v = part.split("=", 1)
                row[k] = v
        for k, v in s.items():
            if k == "settings" and isinstance(v, dict):
                row.update({f"set.{sk}": (sv if isinstance(sv, (int, float, str, bool)) else str(sv))
                            for sk, sv in v.items()})
            elif isinstance(v, (int, float, str, bool)) or v is None:
                row.setdefault(k, v)
        rows.append(row)
    df = pl.from_dicts(rows, infer_schema_length=None)
    if base is not None:
        if base not in df["run"].to_list():
            raise ValueError(f"base={base!r}: not one of the runs {df['run'].to_list()}")
        numeric = [c for c, d in df.schema.items() if d.is_numeric() and not c.startswith("set.")]
        b = df.filter(pl.col("run") == base).row(0, named=True)
        df = df.with_columns((pl.col(c) / b[c]).alias(f"{c}_vs_base") for c in numeric if b[c])
    return df


def _common_root(paths: list[Path]) -> Path | None:
    if not paths:
        return None
    if len(paths) == 1:
        return paths[0].parent
    return Path(os.path.commonpath([str(p.resolve()) for p in paths]))
