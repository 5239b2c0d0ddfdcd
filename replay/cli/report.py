"""``kvtrace report``: thin wrapper over :func:`replay.report.build_report`."""

from __future__ import annotations

import json

import click


@click.command("report")
@click.argument("target", metavar="TRACE_OR_RUNS", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HTML file to write.")
@click.option("--resample", default="1s", show_default=True, help="Time bucket of the figures.")
@click.option("--no-diagnosis", is_flag=True, help="Skip the diagnosis section.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, figure titles).")
def report(target: str, out: str, resample: str, no_diagnosis: bool, as_json: bool) -> None:
    """Write one self-contained HTML report (Plotly inlined, opens offline) of a trace, a run or a
    sweep directory: figures, each run's summary, the manifest and the diagnosis."""
    from replay.report import build_report
    from replay.trace import TraceError

    try:
        res = build_report(target, out, resample=resample, diagnose=not no_diagnosis)
    except (TraceError, ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(res) if as_json else f"wrote {res['out']} ({len(res['figures'])} figures)")
