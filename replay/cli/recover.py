"""``kvtrace recover TRACE``: thin wrapper over :func:`replay.recovery.recover`."""

from __future__ import annotations

import json

import click

from replay.errors import DataLostError
from replay.recovery import recover


@click.command("recover")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--force", is_flag=True,
              help="Recover even ranks that are still recording (their later writes are lost).")
def recover_cmd(trace: str, as_json: bool, force: bool) -> None:
    """Convert the open Arrow IPC segments a stopped recorder left in TRACE into Parquet.

    Refuses a trace that is still being recorded. Every record batch completed before the
    recorder died is kept; torn or unreadable streams are moved aside (*.arrows.unreadable) and
    the events that are not on disk are counted in the drops family. Exit status 1 when
    anything was lost.
    """
    out = recover(trace, force=force)
    if as_json:
        click.echo(json.dumps(out.to_dict(), indent=2))
    else:
        click.echo(f"recovered {out.segments_recovered} segments, {out.rows_recovered:,} rows"
                   + (f"; ranks marked recovered: {out.ranks_marked}" if out.ranks_marked else ""))
        for n in out.torn:
            click.echo(f"torn: {n}")
        for p in out.moved_aside:
            click.echo(f"moved aside: {p}")
        for p in out.stale_temporaries:
            click.echo(f"removed a dead recorder's half-written rank file: {p}")
    if out.lost:
        lost = sum(out.lost_events.values())
        raise DataLostError(f"{trace}: {lost} events could not be recovered (counted in the drops "
                            f"family)" + (f"; unreadable bytes kept in {', '.join(out.moved_aside)}"
                                          if out.moved_aside else ""))
