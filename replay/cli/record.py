"""``kvtrace record``: thin wrapper over :func:`replay.record.record_workload` (``--code``: on a code
of its own process, :func:`replay.runs.code.record_code`)."""

from __future__ import annotations

import json

import click

from replay.cli.text import closing_log, force_out
from replay.console import third_party_to_log
from replay.errors import KvtraceError
from replay.record import BACKENDS, record_workload, signals_as_interrupts


@click.command("record")
@click.option("--workload", "workload", required=True, type=click.Path(exists=True, file_okay=False),
              help="Workload trace directory (request family only).")
@click.option("--backend", type=click.Choice(BACKENDS), default="sglang", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Trace directory to write.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Backend setting (repeatable), e.g. --set page_size=64 --set host_pool_tokens=262144.")
@click.option("--detail", type=click.Choice(["steps", "counts", "pages"]), default="counts", show_default=True,
              help="Capture level: steps (request, step and stats rows; cheapest), counts (every pool and cache op), pages (counts plus page ids).")
@click.option("--check-every", "check_every", type=int, default=0, show_default=True,
              help="Check the occupancy identity every N steps (0 = never).")
@click.option("--incident", default="", metavar="NAME",
              help="Plant a listed upstream-bug reproduction (replay/backends/sglang/incidents.py), "
                   "e.g. lost_free, swa_mapping_race, lost_unlock, all_tombstone_leaf_insert.")
@click.option("--incident-every", "incident_every", type=int, default=7, show_default=True,
              help="The planted bug fires on every N-th eligible call.")
@click.option("--code", "code", default=None, metavar="SPEC",
              help="Record on this code, in its own process: a tarball (../shared/targets/...), a directory "
                   "holding python/sglang or sglang/, sglang==X (a PyPI release), or `installed` (default: the "
                   "installed sglang 0.5.23, in-process). See docs/replay.md, 'Runs on a code'.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="Environment of the code's process over the workload's recorded SGLANG_* switches "
                   "(repeatable; with --code).")
@click.option("--force", is_flag=True, help="Replace --out if it holds a kvtrace trace or workload (nothing else).")
@click.option("--verbose", is_flag=True, help="Show sglang's log lines and warnings on the terminal "
                                              "(default: OUT/sglang.log).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (backend.json).")
def record(workload: str, backend: str, out: str, overrides: tuple[str, ...], detail: str,
           check_every: int, incident: str, incident_every: int, code: str | None, env: tuple[str, ...],
           force: bool, verbose: bool, as_json: bool) -> None:
    """Run WORKLOAD through BACKEND (sglang: the real classes with the tracer hooks on; reference: the
    reference model emitting the same rows); write the trace to OUT.

    sglang's log lines and Python warnings go to OUT/sglang.log (named in the last line).
    """
    if incident:
        from replay.backends.sglang.incidents import check_incident

        problem = check_incident(incident, incident_every, overrides)
        if problem:
            raise KvtraceError(f"--incident {incident}: {problem}")
    force_out(out, force, inputs=(workload,))
    log = None
    try:
        with signals_as_interrupts(), third_party_to_log(f"{out}/sglang.log", verbose=verbose) as log:
            summary = record_workload(workload, out, backend=backend, overrides=overrides, detail=detail,
                                      progress=not as_json, check_integrity_every=check_every,
                                      incident=incident, incident_every=incident_every, code=code, env=env)
    except KvtraceError:
        raise
    except ValueError as e:  # a setting the backend refused
        raise KvtraceError(str(e)) from None
    if as_json:
        click.echo(json.dumps(dict(summary, log=str(log.path) if log.path else None), default=str))
        return
    r = summary["result"]
    if summary.get("code"):
        c = summary["code"]
        click.echo(f"code {c['name']}: {c['target']} ({c['spec']}, sha {c.get('sha') or '-'})")
    click.echo(f"recorded {out}: {r['num_finished']} finished, {r['num_aborted']} aborted, "
               f"{r['num_retractions']} retractions, {r['num_steps']} steps "
               f"({r['num_prefill_steps']} prefill, {r['num_decode_steps']} decode){closing_log(log)}")
    if summary["hook_failures"]:
        click.echo(f"hook failures: {summary['hook_failures']}", err=True)
