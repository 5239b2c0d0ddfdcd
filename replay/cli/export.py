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
    """Write TRACE as Chrome trace-event JSON: pool counters (from stats rows, else from the
    allocator ledger), step and request-phase slices, eviction/retraction/drop instants.
    Workloads (no pool or stats rows) are refused (exit 2)."""
    from replay.analysis.perfetto import export_perfetto
    from replay.errors import KvtraceError

    try:
        res = export_perfetto(trace, out)
    except (ValueError, KeyError) as e:
        if isinstance(e, KvtraceError):
            raise
        raise KvtraceError(str(e)) from None
    if as_json:
        click.echo(json.dumps(res))
    else:
        click.echo(f"wrote {res['out']}: {res['events']} events "
                   + ", ".join(f"{k} {v}" for k, v in sorted(res["counts"].items())))
