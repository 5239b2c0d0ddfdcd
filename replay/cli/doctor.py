"""``kvtrace doctor TRACE``: thin wrapper over :func:`replay.diagnosis.doctor.doctor`.

Exit status (the rule of docs/diagnosis.md, shared with ``kvtrace verify``): 0 stable, 1 a leak
or growth found (verdict ``leak`` or ``growing``), 2 refused input.
"""

from __future__ import annotations

import json

import click

from replay.cli.text import plural


@click.command("doctor")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Rank to diagnose.")
@click.option("--replay", "do_replay", is_flag=True,
              help="Re-run the trace's workload under the recorded and the recommended settings "
                   "(real sglang backend) and say whether the growth disappears.")
@click.option("--code", "code", default=None, metavar="SPEC",
              help="With --replay: re-run on this code, in its own process (a tarball, a directory holding "
                   "python/sglang or sglang/, sglang==X); its policy knobs are its own, so only the "
                   "recommended SGLANG_* switches are applied. See docs/diagnosis.md.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="With --replay --code: environment of the code's process over the recorded switches (repeatable).")
@click.option("--verbose", is_flag=True, help="With --replay: show sglang's log lines and warnings on the terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def doctor(trace: str, rank: int, do_replay: bool, code: str | None, env: tuple[str, ...], verbose: bool,
           as_json: bool) -> None:
    """Explain SWA growth and leaks in TRACE: identity violations, growth trend, who holds SWA
    outside the window and why, and the knobs that stop it (less those already recorded).

    Exit status: 0 stable; 1 a leak or growth found (verdict leak or growing); 2 refused input.
    """
    from replay.diagnosis.doctor import doctor as run

    rep = run(trace, rank=rank, replay=do_replay, progress=not as_json, verbose=verbose, code=code, env=env)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1, default=str))
    else:
        for line in text_lines(rep):
            click.echo(line)
        for n in rep.notes:
            click.echo(f"note       {n}", err=True)
    if rep.verdict != "stable":
        raise SystemExit(1)


def _signed(x: float, unit: str) -> str:
    return f"{x:+,.1f} {unit}"


def text_lines(rep) -> list[str]:
    """The human report of a :class:`~replay.diagnosis.doctor.DoctorReport`, one line each."""
    out = [f"trace      {rep.trace}"]
    out.append(f"verdict    {rep.verdict}" + (f" (primary cause: {rep.primary_cause})" if rep.primary_cause else ""))
    for v in rep.identity_violations:
        gap = v["last_unaccounted"]
        end = (f"{plural(gap, 'slot')} owned by nobody at the end" if gap >= 0 else
               f"the tree counts {plural(-gap, 'slot')} the allocator holds free at the end")
        out.append(f"leak       {v['pool']}: identity broken at {plural(v['rows'], 'row')} from step {v['first_step']} "
                   f"(seq {v['first_seq']}), {end} ({_signed(v['growth_pages'], 'pages')})")
    for pool, g in rep.growth.items():
        eta = f", exhausted in {g['hours_to_exhaustion']:,.3g} h" if g["hours_to_exhaustion"] is not None else ""
        out.append(f"growth     {pool:<9} {g['verdict']:<8} {g['slope_tokens_per_hour']:>12,.0f} tokens/h "
                   f"(p={g['p_value']:.3g}, {plural(g['samples'], 'sample')} at {g['sampled_at']}){eta}")
    for c in rep.causes:
        rids = c["rids"][:8]
        who = (f", requests {', '.join(map(str, rids))}" + (" ..." if len(c["rids"]) > 8 else "")) if rids else ""
        out.append(f"cause      {c['cause']}: {plural(c['holders'], 'holder')}, {c['slot_seconds']:,.1f} slot-s "
                   f"({100 * c['share_of_swa_capacity']:.1f} % of SWA capacity x span){who}")
    for h in rep.holders[:5]:
        out.append(f"holder     {h['holder']}: {plural(h['slots'], 'slot')}, {h['slot_seconds']:,.1f} slot-s ({h['detail']})")
    recommended = False
    for r in rep.recommendations:
        if r["already_on"]:
            out.append(f"already on {r['cause']}: {', '.join(r['already_on'])} "
                       f"{'is' if len(r['already_on']) == 1 else 'are'} recorded in this trace, so not recommended"
                       + ("; next cause" if r["status"] == "already_on" else ""))
        if r["status"] == "no_knob":
            out.append(f"no knob    {r['cause']}: {r['text']}")
        elif r["status"] == "recommended":
            recommended = True
            args = " ".join(f"--set {s}" for s in r["sets"])
            env = " ".join(f"{k}={v}" for k, v in r["env"].items())
            how = "; ".join(x for x in (args, f"environment {env}" if env else "") if x)
            out.append(f"recommend  {r['cause']}: {how}; {r['text']}")
    if rep.causes and not recommended:
        out.append("recommend  none: every knob that addresses these causes is already on in this trace"
                   if any(r["status"] == "already_on" for r in rep.recommendations)
                   else "recommend  none: the causes above are bugs, not policies (no knob stops them)")
    if rep.replay:
        out.append(f"replay     {rep.replay.get('summary')}")
    return out
