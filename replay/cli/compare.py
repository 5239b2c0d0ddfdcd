"""``kvtrace compare``: thin wrapper over :func:`replay.runs.compare.compare`."""

from __future__ import annotations

import json

import click


@click.command("compare")
@click.argument("runs", type=click.Path(exists=True, file_okay=False))
@click.option("--base", default=None, help="Policy or code (--code sweeps) to compute deltas against (default: the first code; else "
                   "baseline, else the first policy).")
@click.option("--width", type=click.IntRange(min=20), default=None,
              help="Table width in characters (default: COLUMNS or the terminal's width).")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object: {"base": the base policy used, "signed": figures with absolute '
                   'deltas only, "rows": one per run: run, policy, grid knobs, every figure F with F_delta '
                   '(value - base) and F_delta_pct (null for signed figures and a zero base)}.')
def compare_cmd(runs: str, base: str | None, width: int | None, as_json: bool) -> None:
    """Compare the runs under RUNS (a sweep or a run): policies as rows, summary figures as
    columns, each with its change against the base policy at the same grid point: a percentage,
    or for signed figures (slopes) the absolute change. A table wider than the terminal is shown
    transposed (figures as rows), in blocks of runs that fit."""
    from replay.runs.compare import SIGNED, compare, format_table

    df = compare(runs, base=base)
    used = df["base"][0]  # the base policy (or code) the deltas are against
    if as_json:
        click.echo(json.dumps({"base": used, "signed": sorted(SIGNED), "rows": df.to_dicts()}, default=str))
        return
    click.echo(format_table(df, width=width))
