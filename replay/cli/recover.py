"""``kvtrace recover TRACE``: convert open segments a crash left behind into Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracer.schema.storage import OPEN_SUFFIX, recover_segment


def recover(path: str) -> dict:
    """Convert every ``*.arrows`` segment under ``path``; returns the ``--json`` object."""
    root = Path(path)
    if not (root / "manifest.json").is_file():
        raise click.ClickException(f"{root / 'manifest.json'}: missing; expected a kvtrace trace directory")
    found = sorted(root.glob(f"*/rank=*/part-*{OPEN_SUFFIX}"))
    segments, rows, notes = 0, 0, []
    for f in found:
        n, note = recover_segment(f)
        segments += 1
        rows += n
        if note:
            notes.append(f"{f}: {note}")
    return {"segments_recovered": segments, "rows_recovered": rows, "torn": notes}


@click.command("recover")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def recover_cmd(trace: str, as_json: bool) -> None:
    """Convert the open Arrow IPC segments a crashed recorder left in TRACE into Parquet.

    Every record batch completed before the crash is kept; a torn last batch is reported.
    """
    out = recover(trace)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"recovered {out['segments_recovered']} segments, {out['rows_recovered']:,} rows")
    for n in out["torn"]:
        click.echo(f"torn tail: {n}")
