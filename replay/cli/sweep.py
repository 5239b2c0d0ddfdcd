"""``kvtrace sweep``: thin wrapper over :func:`replay.runs.sweep.sweep`."""

from __future__ import annotations

import json

import click

from replay.cli.text import force_out
from replay.console import third_party_to_log


@click.command("sweep")
@click.argument("source", metavar="TRACE_OR_WORKLOAD", type=click.Path(exists=True, file_okay=False))
@click.option("--policies", default=None,
              help="Comma-separated presets, e.g. baseline,swa-fixes (default with --code: recorded).")
@click.option("--code", "codes", multiple=True, metavar="NAME=SPEC,...",
              help="Codes to cross with the policies: a code=NAME level above policy=; SPEC is a tarball, a "
                   "directory holding python/sglang or sglang/, or `installed` (docs/replay.md).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="Environment of every code's process (repeatable); per grid point: --grid env.NAME=V1,V2.")
@click.option("--grid", multiple=True, metavar="KNOB=V1,V2",
              help="Knob values to cross with the policies (repeatable), e.g. --grid full_pool_tokens=65536,131072; "
                   "with --code, env.NAME=V1,V2 sets the SGLANG_*/KVTRACE_* switch NAME of the code's process per "
                   "grid point (a level env.NAME=V).")
@click.option("--set", "sets", multiple=True, metavar="KNOB=VALUE", help="Override applied to every run.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Sweep directory (re-running resumes: completed runs are skipped).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs at a time.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process per run; ray: Ray tasks (RAY_ADDRESS or a local Ray).")
@click.option("--backend", default="sglang", show_default=True, type=click.Choice(["sglang", "reference"]))
@click.option("--model", default=None, metavar="NAME",
              help="Model preset giving each pool's bytes per token for every run's GB figures (as kvtrace replay "
                   "--model); default: the bytes the trace records.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--force", is_flag=True,
              help="Start over: remove --out first if it holds a kvtrace sweep, run or trace (nothing else).")
@click.option("--verbose", is_flag=True, help="Show sglang's log lines and warnings on the terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the runs and their status).")
def sweep_cmd(source: str, policies: str | None, codes: tuple[str, ...], env: tuple[str, ...], grid: tuple[str, ...], sets: tuple[str, ...], out: str, jobs: int,
              executor: str, backend: str, model: str | None, quiet: bool, force: bool, verbose: bool,
              as_json: bool) -> None:
    """Replay TRACE_OR_WORKLOAD under every policy x grid point, each run in its own process.

    Layout: OUT/policy=<p>/<knob>=<v>/ (one run each; with --code, OUT/code=<name>/policy=...) and
    OUT/summary.parquet (one row per run).
    A failed run is reported and does not stop the others; the exit status is then 1.
    Re-running into OUT resumes (completed runs are kept); --force starts over. Each run's
    output (sglang's log lines, warnings) is in OUT/.partial/<run>.log, the sweep's own in
    OUT/sglang.log.
    """
    from replay.runs.sweep import sweep

    from replay.record import signals_as_interrupts

    force_out(out, force, check=False, inputs=(source,))
    with signals_as_interrupts(), third_party_to_log(f"{out}/sglang.log", verbose=verbose) as log:  # SIGTERM: like SIGINT
        if policies is None and not codes:
            raise click.UsageError("--policies is required (e.g. --policies baseline,swa-fixes), or give --code")
        df = sweep(source, out, policies=(policies or "recorded").split(","), grid=grid, sets=sets, jobs=jobs,
                   executor=executor, backend=backend, progress=not (quiet or as_json), codes=list(codes) or None,
                   env=env, model=model)
    failed = df.filter(df["status"] != "ok")
    if as_json:
        click.echo(json.dumps({"out": out, "runs": df.select("run", "status", "error").to_dicts(),
                               "failed": failed.height, "log": str(log.path) if log.path else None,
                               "run_logs": f"{out}/.partial/<run>.log"}, default=str))
    else:
        click.echo(f"sweep {out}: {df.height - failed.height}/{df.height} runs complete "
                   f"(summary.parquet); compare with: kvtrace compare {out}; run logs (sglang, warnings): "
                   f"{out}/.partial/<run>.log" + (f" and {log.path}" if log.path else ""))
        for row in failed.iter_rows(named=True):
            click.echo(f"failed {row['run']}: {row['error']}", err=True)
    if failed.height:
        raise SystemExit(1)
