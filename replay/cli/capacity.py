"""``kvtrace capacity``: thin wrapper over :func:`replay.runs.capacity.capacity_sweep`."""

from __future__ import annotations

import click

from replay.cli.grid import grid_options, run_grid


@click.command("capacity")
@click.argument("source", metavar="TRACE_OR_WORKLOAD", type=click.Path(exists=True, file_okay=False))
@click.option("--pool", default="swa", show_default=True, metavar="swa|host|full",
              help="The pool whose size is swept (swa_pool_tokens, host_pool_tokens or full_pool_tokens).")
@click.option("--sizes", default=None, metavar="T1,T2,...", help="Pool sizes in tokens (whole pages).")
@click.option("--points", type=int, default=None,
              help="Instead of --sizes: this many log-spaced sizes from --min-tokens to --max-tokens (default 6).")
@click.option("--min-tokens", type=int, default=None, help="Smallest size of --points (default: max / 16).")
@click.option("--max-tokens", type=int, default=None,
              help="Largest size of --points (default: the pool's resolved size; host: four full pools).")
@click.option("--full-pool-tokens", type=int, default=None, help="Fixed full pool (default: the source's).")
@click.option("--swa-pool-tokens", type=int, default=None, help="Fixed SWA pool (default: the source's).")
@click.option("--host-pool-tokens", type=int, default=None, help="Fixed host pool (default: the source's, 0 = none).")
@click.option("--traces", is_flag=True,
              help="Keep each size's trace (for kvtrace report's evidence figures, diff, doctor). Default: the "
                   "sizes run figures-only, their summaries computed as they replay and no trace written.")
@grid_options("size", "Sweep directory (re-running resumes; more sizes may be added) plus capacity.json.",
              "Print one JSON object (config, rows, notes).")
def capacity_cmd(source: str, pool: str, sizes: str | None, points: int | None, min_tokens: int | None,
                 max_tokens: int | None, full_pool_tokens: int | None, swa_pool_tokens: int | None,
                 host_pool_tokens: int | None, policy: str, model: str | None, out: str, jobs: int, executor: str,
                 traces: bool, quiet: bool, force: bool, as_json: bool) -> None:
    """Capacity curves of TRACE_OR_WORKLOAD: replay it at each size of one pool (reference backend,
    in parallel, resumable) and tabulate prefix-hit ratio, host hit ratio, TTFT p50/p99,
    retractions and peak/mean SWA used against the size in tokens and GB.

    The SWA and host pools have no one-pass curve (SWA survival depends on tombstones, window
    locks and admission), hence the replays; the full pool's one-pass LRU hit ratio is shown
    beside them as the fast bound (docs/capacity.md, "Capacity curves").
    """
    from replay.runs.capacity import capacity_sweep
    from replay.runs.summary import RunError

    if sizes is not None and points is not None:
        raise RunError("give --sizes or --points, not both")
    parsed = None
    if sizes is not None:
        parsed = [s.strip() for s in sizes.split(",") if s.strip()]
        if not parsed:
            raise RunError(f"--sizes {sizes!r}: expected token counts, e.g. 8192,16384,32768")
    res = run_grid(source, out, force, lambda: capacity_sweep(
        source, out, pool=pool, sizes_tokens=parsed, points=points, min_tokens=min_tokens, max_tokens=max_tokens,
        full_pool_tokens=full_pool_tokens, swa_pool_tokens=swa_pool_tokens, host_pool_tokens=host_pool_tokens,
        policy=policy, model=model, jobs=jobs, executor=executor, traces=traces, progress=not (quiet or as_json)),
        as_json, capacity_lines)
    failed = [r for r in res.rows if r["status"] != "ok"]
    if failed:  # a curve with holes is printed, and is an error for a script
        from replay.errors import DataLostError

        raise DataLostError(f"{out}: {len(failed)} of {len(res.rows)} size(s) failed (first: {failed[0].get('error', '')}); "
                            "the curve above has holes there; re-run the same command to retry them")


def _f(v, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"


def capacity_lines(res) -> list[str]:
    """The sweep as a table, one line per size."""
    c = res.config
    fixed = ", ".join(f"{k} {getattr(c, k):,}" for k in ("full_pool_tokens", "swa_pool_tokens", "host_pool_tokens")
                      if not k.startswith(c.pool))
    out = [f"capacity {c.source}: {c.pool} pool swept ({fixed}; policy {c.policy}); bytes/token "
           + ", ".join(f"{k} {v:g}" for k, v in res.bytes_per_token.items()) + f" ({res.kv_bytes_source})",
           f"{'tokens':>10} {'GB':>8} {'hit':>6} {'host hit':>8} {'ttft p50':>9} {'ttft p99':>9} {'retract':>7} "
           f"{'aborted':>7} {'peak swa':>9} {'mean swa':>9} {'1-pass':>6}"]
    for r in res.rows:
        head = f"{r['size_tokens']:>10,} {_f(r['size_gb'], '.3f', 8)}"
        if r["status"] != "ok":
            out.append(f"{head}  failed: {r.get('error', '')}")
            continue
        out.append(f"{head} {_f(r['prefix_hit_ratio'], '.3f', 6)} {_f(r['host_hit_ratio'], '.3f', 8)} "
                   f"{_f(r['ttft_p50_ms'], '.1f', 9)} {_f(r['ttft_p99_ms'], '.1f', 9)} {_f(r['retractions'], '', 7)} "
                   f"{_f(r['aborted'], '', 7)} {_f(r['peak_swa_used'], ',', 9)} {_f(r['mean_swa_used'], ',.0f', 9)} "
                   f"{_f(r['one_pass_hit_ratio'], '.3f', 6)}")
    out.append("TTFT in ms; 1-pass: the full pool's one-pass LRU hit ratio"
               + (" at each size (the fast bound)" if c.pool == "full" else f" at {c.full_pool_tokens:,} tokens")
               + f"; runs and capacity.json in {res.out}")
    out += [f"note: {n}" for n in res.notes]
    return out
