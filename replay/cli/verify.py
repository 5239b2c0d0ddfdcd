"""``kvtrace verify TRACE``: thin wrapper over :func:`replay.diagnosis.verify.verify`."""

from __future__ import annotations

import json

import click

from replay.cli.text import plural


@click.command("verify")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, default=0, show_default=True, help="Rank to verify.")
@click.option("--counts", "counts_only", is_flag=True, help="Check counts only, even when the trace has page ids.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def verify(trace: str, rank: int, counts_only: bool, as_json: bool) -> None:
    """Re-execute TRACE's allocator ops against fresh pools and check every stats row.

    Exit status (the rule of docs/diagnosis.md, shared with `kvtrace doctor`): 0 only when
    nothing diverges (verdict ok); 1 when the ledger diverges, page ops conflict, the occupancy
    identity breaks (a leak) or events were dropped (gaps); 2 refused input.
    """
    from replay.diagnosis.verify import verify as run

    rep = run(trace, rank=rank, pages=False if counts_only else None)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=1, default=str))
    else:
        _print(rep)
    if not rep.ok:
        raise SystemExit(1)


def _print(rep) -> None:
    t = rep.totals
    click.echo(f"trace      {rep.trace}  ({rep.level} level, {plural(rep.events, 'event')}, "
               f"{plural(rep.stats_rows_checked, 'stats row')}, {rep.wall_s:.2f} s)")
    click.echo(f"verdict    {rep.verdict}")
    click.echo(f"ledger     {plural(t.get('divergences', 0), 'divergence')}; "
               f"{plural(t.get('identity_violations', 0), 'identity violation')}; "
               f"{plural(t.get('double_frees', 0), 'double free')}, "
               f"{plural(t.get('unallocated_frees', 0), 'free')} of unallocated slots, "
               f"{plural(t.get('allocs_in_use', 0), 'alloc')} of slots in use")
    f = rep.first_divergence
    if f:
        where = ", ".join(x for x in (f.get("kind") and str(f["kind"]),
                                       f.get("pool") is not None and f"pool {f['pool']}",
                                       f.get("rid") is not None and f.get("rid", -1) >= 0 and f"rid {f['rid']}") if x)
        click.echo(f"first      seq {f['seq']}" + (f" ({where})" if where else "") + f": {f['message']}")
        for op in f.get("request_ops") or []:
            click.echo(f"  request  seq {op['seq']} {op['pool']} {op['op']} {plural(op['num_slots'], 'slot')}")
    if rep.identity_violations:
        v = rep.identity_violations[0]
        click.echo(f"identity   first at seq {v['seq']} (step {v['step']}, pool {v['pool']}): {v['message']}")
    for g in rep.drop_gaps:
        click.echo(f"gap        seq {g['first_seq']}..{g['last_seq']}: {plural(g['num_events'], 'event')} lost "
                   f"({g['reason']}); ledger re-anchored after it", err=True)
