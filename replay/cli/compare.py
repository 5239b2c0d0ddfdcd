"""``kvtrace compare``: thin wrapper over :func:`replay.runs.compare.compare`."""

from __future__ import annotations

import json

import click


@click.command("compare")
@click.argument("runs", type=click.Path(exists=True, file_okay=False))
@click.option("--base", default=None, help="Policy to compute deltas against (default: baseline, else the first).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: a list of rows.")
def compare_cmd(runs: str, base: str | None, as_json: bool) -> None:
    """Compare the runs under RUNS (a sweep or a run): policies as rows, summary figures as
    columns, each with its change (%) against the base policy at the same grid point."""
    from replay.runs.compare import compare, format_table

    df = compare(runs, base=base)
    if as_json:
        click.echo(json.dumps({"base": base, "rows": df.to_dicts()}, default=str))
        return
    click.echo(format_table(df))
