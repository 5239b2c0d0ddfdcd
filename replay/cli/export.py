"""``kvtrace export perfetto``: thin wrapper over :func:`replay.analysis.perfetto.export_perfetto`."""

from __future__ import annotations

import json

import click


@click.group("export")
def export() -> None:
    """Export a trace to other tools' formats."""


@export.command("perfetto")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="JSON file to write (open it in ui.perfetto.dev or chrome://tracing).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path and event counts).")
def perfetto(trace: str, out: str, as_json: bool) -> None:
    """Write TRACE as Chrome trace-event JSON: pool counters, step and request-phase slices,
    eviction/retraction/drop instants."""
    from replay.analysis.perfetto import export_perfetto
    from replay.trace import TraceError

    try:
        res = export_perfetto(trace, out)
    except (TraceError, ValueError, KeyError) as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"wrote {res['out']}: {res['events']} events "
                   + ", ".join(f"{k} {v}" for k, v in sorted(res["counts"].items())))
