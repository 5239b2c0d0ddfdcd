"""``kvtrace report``: thin wrapper over :func:`replay.report.build_report`."""

from __future__ import annotations

import json

import click


@click.command("report")
@click.argument("target", metavar="TRACE_OR_RUNS", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="HTML file to write.")
@click.option("--replay", "do_replay", is_flag=True,
              help="Replay the trace under its recorded and the recommended settings and show the "
                   "result beside the headline (a directory of runs shows its runs without this).")
@click.option("--backend", type=click.Choice(["reference", "sglang"]), default="reference", show_default=True,
              help="Backend of the --replay runs.")
@click.option("--resample", default="1s", show_default=True, help="Time bucket of the figures.")
@click.option("--no-diagnosis", is_flag=True, help="Skip the diagnosis (no headline verdict).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, verdict, figures, proof).")
def report(target: str, out: str, do_replay: bool, backend: str, resample: str, no_diagnosis: bool,
           as_json: bool) -> None:
    """Write one self-contained HTML incident report (Plotly inlined, opens offline) of a trace, a
    run or a directory of them: the verdict, cause and fix first (with the replayed proof), then
    the evidence figures, then the details as tables. Workloads are refused (exit 2)."""
    from replay.errors import KvtraceError
    from replay.report import build_report

    try:
        res = build_report(target, out, resample=resample, diagnose=not no_diagnosis, replay=do_replay,
                           backend=backend)
    except (ValueError, FileNotFoundError) as e:
        if isinstance(e, KvtraceError):
            raise
        raise KvtraceError(str(e)) from None
    if as_json:
        click.echo(json.dumps(res, default=str))
        return
    verdict = f"{res['verdict']}" + (f" ({res['primary_cause']})" if res["primary_cause"] else "")
    plan = res.get("plan")
    if not res["diagnosis"] and (plan or res.get("capacity")):  # a plan's or curve's sections only
        if not plan:
            what = "capacity curves"
        elif plan.get("server_args"):
            what = f"capacity plan, recommended {' '.join(plan['server_args'])}"
        else:
            what = "capacity plan, no feasible split"
        click.echo(f"wrote {res['out']}: {what}")
    else:
        click.echo(f"wrote {res['out']}: verdict {verdict if res['verdict'] else 'not diagnosed'}, "
                   f"{len(res['figures'])} figures" + (", replayed proof" if res["proof"] else ""))
    if res["proof"]:
        click.echo(f"proof: {res['proof']['conclusion']}")
    for c in res.get("codes") or []:
        where = f"code {c['name']}" + (f" ({c['run']})" if c.get("run") else "")
        click.echo(f"{where}: " + (f"{c.get('target')}, spec {c.get('spec')}, fingerprint {c.get('fingerprint')}"
                                   if c.get("status", "ok") == "ok" else f"failed: {c.get('error')}"))
    if res.get("code_axis"):
        ax = res["code_axis"]
        click.echo(f"codes compared against {ax['base']} at each point of {' x '.join(['code', *ax['keys']])} "
                   "(section 'Codes compared')")
