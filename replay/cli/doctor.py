"""``kvtrace doctor TRACE``: thin wrapper over :func:`replay.diagnosis.doctor.doctor`."""

from __future__ import annotations

import json

import click


@click.command("doctor")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Rank to diagnose.")
@click.option("--replay", "do_replay", is_flag=True,
              help="Re-run the trace's workload under the recorded and the recommended settings "
                   "(real sglang backend) and say whether the growth disappears.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def doctor(trace: str, rank: int, do_replay: bool, as_json: bool) -> None:
    """Explain SWA growth and leaks in TRACE: identity violations, growth trend, who holds SWA
    outside the window and why, and the knobs that stop it."""
    from replay.diagnosis.doctor import doctor as run

    rep = run(trace, rank=rank, replay=do_replay, progress=not as_json)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1, default=str))
        return
    click.echo(f"trace      {rep.trace}")
    click.echo(f"verdict    {rep.verdict}" + (f" (primary cause: {rep.primary_cause})" if rep.primary_cause else ""))
    for v in rep.identity_violations:
        click.echo(f"leak       {v['pool']}: identity broken at {v['rows']} rows from step {v['first_step']} "
                   f"(seq {v['first_seq']}), {v['last_unaccounted']} slots unaccounted, +{v['growth_pages']} pages")
    for pool, g in rep.growth.items():
        eta = f", exhausted in {g['hours_to_exhaustion']} h" if g["hours_to_exhaustion"] is not None else ""
        click.echo(f"growth     {pool:<9} {g['verdict']:<8} {g['slope_tokens_per_hour']:>12,.0f} tokens/h "
                   f"(p={g['p_value']:.3g}, {g['samples']} samples at {g['sampled_at']}){eta}")
    for c in rep.causes:
        click.echo(f"cause      {c['cause']}: {c['holders']} holders, {c['slot_seconds']:,.1f} slot-s "
                   f"({100 * c['share_of_swa_capacity']:.1f}% of SWA capacity x span), requests {c['rids'][:8]}")
    for h in rep.holders[:5]:
        click.echo(f"holder     {h['holder']}: {h['slots']} slots, {h['slot_seconds']:,.1f} slot-s ({h['detail']})")
    for r in rep.recommendations:
        knobs = ", ".join(r["knobs"]) or "no knob"
        click.echo(f"recommend  {r['cause']}: {knobs}; {r['text']}")
    if rep.replay:
        click.echo(f"replay     {rep.replay.get('summary')}")
    for n in rep.notes:
        click.echo(f"note       {n}", err=True)
