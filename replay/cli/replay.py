"""``kvtrace replay``: thin wrapper over :func:`replay.runs.replay_run`."""

from __future__ import annotations

import json

import click

from replay.cli.text import closing_log, force_out
from replay.console import third_party_to_log


@click.command("replay")
@click.argument("source", metavar="TRACE_OR_WORKLOAD", type=click.Path(exists=True, file_okay=False))
@click.option("--policy", default="recorded", show_default=True,
              help="Preset (see `kvtrace policies`): recorded, baseline, swa-fixes, baseline+<fix>, "
                   "swa-fixes-<pre-fix value>, eic.")
@click.option("--set", "sets", multiple=True, metavar="KNOB=VALUE",
              help="Override a knob over the preset (repeatable), e.g. --set full_pool_tokens=65536.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Run directory to create.")
@click.option("--backend", default="sglang", show_default=True, type=click.Choice(["sglang", "reference"]),
              help="sglang: the real sglang 0.5.23 classes on CPU.")
@click.option("--detail", type=click.Choice(["steps", "counts", "pages", "figures"]), default="counts", show_default=True,
              help="Capture level of the run's trace: steps (request, step and stats rows), counts, pages (counts plus page ids); "
                   "figures: no trace, only summary.json, its figures computed as the replay runs (reference backend).")
@click.option("--code", "code", default=None, metavar="SPEC",
              help="Run on this code: a tarball (../shared/targets/...), a directory holding python/sglang "
                   "or sglang/, or `installed` (default: the installed sglang 0.5.23, in-process). See "
                   "docs/replay.md, 'Runs on a code'.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="Environment of the code's process over the source's recorded SGLANG_* switches "
                   "(repeatable; with --code).")
@click.option("--model", default=None, metavar="NAME",
              help="Model preset giving each pool's bytes per token for the GB figures (replay.models: "
                   "llama-3.1-8b, mellum-like-swa, deepseek-v4-class, dsv4-tiny); default: the bytes the "
                   "trace records, if any (docs/capacity.md).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--force", is_flag=True, help="Replace --out if it holds a kvtrace run or trace (nothing else).")
@click.option("--verbose", is_flag=True, help="Show sglang's log lines and warnings on the terminal "
                                              "(default: OUT/sglang.log).")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json as one JSON object.")
def replay_cmd(source: str, policy: str, sets: tuple[str, ...], out: str, backend: str, detail: str,
               code: str | None, env: tuple[str, ...], model: str | None, quiet: bool, force: bool, verbose: bool,
               as_json: bool) -> None:
    """Replay the requests of TRACE_OR_WORKLOAD under a policy; write the run to OUT.

    A run is a trace written by the hooks on the real code plus summary.json (occupancy, hits,
    TTFT, host allocator CPU, ...); `kvtrace compare` and every analysis read it.
    """
    import time

    from replay.record import signals_as_interrupts
    from replay.runs import replay_run

    t0 = time.perf_counter()  # the command's wall time: start-up (imports, sglang) included
    force_out(out, force, inputs=(source,))
    with signals_as_interrupts(), third_party_to_log(f"{out}/sglang.log", verbose=verbose) as log:
        s = replay_run(source, out, policy=policy, sets=sets, backend=backend, detail=detail,
                       progress=not (quiet or as_json), code=code, env=env, model=model)
    total_s = time.perf_counter() - t0
    if as_json:
        click.echo(json.dumps(dict(s.to_dict(), command_wall_s=round(total_s, 3),
                                   log=str(log.path) if log.path else None), default=str))
        return
    if s.code:
        click.echo(f"code {s.code['name']}: {s.code['target']} ({s.code['spec']}, sha {s.code.get('sha') or '-'})")
    click.echo(f"run {out}: policy {policy}, {s.finished}/{s.requests} finished, {s.retractions} retractions, "
               f"{s.sim_s:,.1f} s simulated in {s.wall_s:,.1f} s of replay ({s.sim_s_per_wall_s:,.1f}x); "
               f"{total_s:,.1f} s wall in all, start-up included")
    if not s.traced:
        click.echo("  figures only (--detail figures): no trace written, only summary.json")
    if s.stopped:
        click.echo(f"  stopped at its first retraction or abort ({s.aborted} aborted; stop_on_retraction=on): "
                   "the figures cover the trace up to there")
    click.echo(f"  peak swa {s.peak_swa_used:,}  mean swa {s.mean_swa_used:,.0f}  "
               f"swa slope {s.swa_used_slope_tokens_per_hour:,.0f} tok/h  peak full {s.peak_full_used:,}")
    if s.peak_swa_used_gb is not None or s.peak_full_used_gb is not None:
        kb = s.kv_bytes
        click.echo(f"  GB ({kb.get('source')}{' ' + kb['model'] if kb.get('model') else ''}): "
                   + "  ".join(f"{label} {v:,.3f}" for label, v in (
                       ("peak full", s.peak_full_used_gb), ("peak swa", s.peak_swa_used_gb),
                       ("mean swa", s.mean_swa_used_gb), ("full pool", s.full_pool_gb),
                       ("swa pool", s.swa_pool_gb), ("host pool", s.host_pool_gb)) if v is not None))
    click.echo(f"  prefix hit {s.prefix_hit_ratio:.3f}  host hit {s.host_hit_ratio:.3f}  "
               f"ttft p50/p99 {s.ttft_p50_ms:,.1f}/{s.ttft_p99_ms:,.1f} ms  queue p99 {s.queue_p99_ms:,.1f} ms")
    click.echo(f"  host alloc/free cpu {s.host_alloc_cpu_ns / 1e6:,.2f}/{s.host_free_cpu_ns / 1e6:,.2f} ms  "
               f"sched cpu {s.sched_cpu_ns / 1e9:,.2f} s")
    if s.assumed:
        click.echo(f"  assumed (not in the source's manifest): {', '.join(s.assumed)}")
    if log.path:
        click.echo(f"  {closing_log(log).lstrip('; ')}")
