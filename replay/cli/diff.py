"""``kvtrace diff``: thin wrapper over :func:`replay.runs.diff.diff_runs`."""

from __future__ import annotations

import json

import click


@click.command("diff")
@click.argument("run_a", type=click.Path(exists=True, file_okay=False))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False))
@click.option("--metric", "metrics", multiple=True,
              help="Compare only this metric (repeatable): mode, batch_size, num_tokens, admitted, retracted, "
                   "evicted_full, evicted_swa, full_used, swa_used, host_full_used, host_swa_used.")
@click.option("--context", default=2, show_default=True, type=click.IntRange(0, 100),
              help="Steps shown on each side of the first divergence.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def diff_cmd(run_a: str, run_b: str, metrics: tuple, context: int, as_json: bool) -> None:
    """The first step where the trajectories of RUN_A and RUN_B diverge (two runs of the same
    workload: two policies, or the two backends), metric by metric, with the steps around it.
    Exits 1 when they diverge."""
    from replay.runs.diff import STEP_METRICS, diff_runs

    try:
        d = diff_runs(run_a, run_b, metrics=metrics or STEP_METRICS, context=context)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(json.dumps(d.to_dict(), default=str))
    else:
        click.echo(d.text())
    raise SystemExit(0 if d.identical else 1)
