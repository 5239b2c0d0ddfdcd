"""``kvtrace plan``: thin wrapper over :func:`replay.runs.plan.plan`."""

from __future__ import annotations

import click

from replay.cli.grid import grid_options, run_grid


@click.command("plan")
@click.argument("source", metavar="TRACE_OR_WORKLOAD", type=click.Path(exists=True, file_okay=False))
@click.option("--kv-gb", type=float, required=True, help="Device KV budget in GB (10^9 bytes) to split.")
@click.option("--host-gb", type=float, default=None, help="HiCache host pool in GB (default: no host pool).")
@click.option("--objective", type=click.Choice(["hit_ratio", "ttft_p99"]), default="hit_ratio", show_default=True,
              help="What the best split maximizes (prefix-hit ratio) or minimizes (TTFT p99).")
@click.option("--ratios", default=None, metavar="R1,R2,...",
              help="swa_full_tokens_ratio values to try (default: 13 values from 0.02 to 1.0).")
@click.option("--confirm", is_flag=True,
              help="Re-run the winner and its two neighbours on the real sglang backend (~8x real time here).")
@click.option("--no-early-stop", is_flag=True,
              help="Replay every ratio (no stop at 99 % of the attainable hit ratio, nor once the splits past "
                   "the best have done worse twice in a row).")
@click.option("--run-infeasible", is_flag=True,
              help="Replay an infeasible split to its end (default: its replay ends at its first retraction or "
                   "abort, which already rules it out; reference backend).")
@click.option("--traces", is_flag=True,
              help="Keep each split's trace (for kvtrace report's evidence figures, diff, doctor). Default: "
                   "the splits run figures-only, their summaries computed as they replay and no trace written "
                   "(the same figures, in about half the CPU on small workloads).")
@grid_options("split", "Plan directory: a sweep (re-running resumes) plus plan.json.",
              "Print one JSON object (the plan).")
def plan_cmd(source: str, kv_gb: float, host_gb: float | None, objective: str, ratios: str | None, policy: str,
             model: str | None, out: str, jobs: int, executor: str, confirm: bool, no_early_stop: bool,
             run_infeasible: bool, traces: bool, quiet: bool, force: bool, as_json: bool) -> None:
    """Split a device KV budget between the full and SWA pools for TRACE_OR_WORKLOAD.

    Each swa_full_tokens_ratio gives the full and SWA pool sizes the budget buys; each split is
    replayed (reference backend, in parallel, resumable); the best split that finishes every
    request without retractions or aborts is recommended with its server arguments. Stops
    early once a split reaches 99 % of the attainable hit ratio, or once the two splits past the
    best each did worse than the one before (docs/capacity.md). Exit 1 when
    no split is feasible at the budget.
    """
    from replay.runs.plan import plan
    from replay.errors import DataLostError
    from replay.runs.summary import RunError

    try:
        rs = [float(x) for x in ratios.split(",") if x.strip()] if ratios else None
    except ValueError:
        raise RunError(f"--ratios {ratios!r}: expected numbers, e.g. 0.1,0.2,0.5") from None
    res = run_grid(source, out, force, lambda: plan(
        source, out, kv_gb=kv_gb, host_gb=host_gb, objective=objective, ratios=rs, policy=policy, model=model,
        jobs=jobs, executor=executor, confirm=confirm, early_stop=not no_early_stop,
        stop_infeasible=not run_infeasible, traces=traces, progress=not (quiet or as_json)), as_json, plan_lines)
    if res.failed:  # an incomplete plan is an error, not an answer (the table or JSON says which)
        raise DataLostError(f"{out}: {res.notes[0]}")
    if res.best is None:  # nothing to recommend: a script must not take the plan for an answer
        raise SystemExit(1)


_WHY = {"attainable": "a split reached 99 % of the attainable hit ratio",
        "declining": "the splits past the best each did worse", "failed": "a split failed",
        "": "99 % of the attainable hit ratio"}


def plan_lines(res) -> list[str]:
    """The plan as a table and the recommended server arguments."""
    c = res.config
    out = [f"plan {c.source}: {c.kv_gb:g} GB of device KV"
           + (f", {c.host_gb:g} GB host" if c.host_gb else "")
           + f", objective {c.objective}; bytes/token full {res.bytes_per_token['full']:g}, "
             f"swa {res.bytes_per_token['swa']:g}; attainable hit ratio {res.attainable_hit_ratio:.3f}"]
    out.append(f"{'ratio':>6} {'full tok':>10} {'swa tok':>9} {'full GB':>8} {'swa GB':>7} {'hit':>6} "
               f"{'ttft p99':>9} {'retract':>7} {'aborted':>7} {'peak swa':>9}  ")
    for r in res.rows:
        mark = ("*" if res.best and r["swa_full_tokens_ratio"] == res.best["swa_full_tokens_ratio"] else " ") + \
            ("r" if res.recorded_ratio is not None and abs(r["swa_full_tokens_ratio"] - res.recorded_ratio) < 1e-9 else " ")
        if r.get("status") == "stopped":
            out.append(f"{r['swa_full_tokens_ratio']:>6g} {r['full_pool_tokens']:>10,} {r['swa_pool_tokens']:>9,} "
                       f"{r['full_gb']:>8.3f} {r['swa_gb']:>7.3f}  infeasible: first "
                       f"{'abort' if r['aborted'] and not r['retractions'] else 'retraction'} at "
                       f"{r['stopped_at_s']:,.1f} s (replay stopped there) {mark}")
            continue
        if r.get("status") != "ok":
            out.append(f"{r['swa_full_tokens_ratio']:>6g} {r['full_pool_tokens']:>10,} {r['swa_pool_tokens']:>9,} "
                       f"{r['full_gb']:>8.3f} {r['swa_gb']:>7.3f}  "
                       f"{'infeasible: refused' if r.get('status') == 'refused' else 'failed'} {mark} {r.get('error', '')}")
            continue
        out.append(f"{r['swa_full_tokens_ratio']:>6g} {r['full_pool_tokens']:>10,} {r['swa_pool_tokens']:>9,} "
                   f"{r['full_gb']:>8.3f} {r['swa_gb']:>7.3f} {r['prefix_hit_ratio']:>6.3f} "
                   f"{r['ttft_p99_ms']:>9.1f} {r['retractions']:>7} {r['aborted']:>7} {r['peak_swa_used']:>9,} {mark}")
    out.append(("* recommended" if res.best else "nothing recommended") + (" (the real backend's view: confirm)" if res.reference_best else "") + (f", r recorded ({res.recorded_ratio:g})" if res.recorded_ratio is not None else "")
               + (f"; stopped early ({_WHY.get(res.early_stop_reason, res.early_stop_reason)})"
                  if res.early_stopped else ""))
    if res.best:
        out.append("server arguments: " + " ".join(res.server_args))
    for c_ in res.confirm:
        out.append(f"confirm ratio {c_['swa_full_tokens_ratio']:g}: "
                   + (f"hit {c_['reference_hit_ratio']:.3f} -> real {c_['real_hit_ratio']:.3f}, peak swa "
                      f"{c_['reference_peak_swa']:,} -> {c_['real_peak_swa']:,}: "
                      f"{'agrees' if c_['agrees'] else 'PARTS'}" if "real_hit_ratio" in c_ else c_.get("error", "")))
    out += [f"note: {n}" for n in res.notes]
    return out
