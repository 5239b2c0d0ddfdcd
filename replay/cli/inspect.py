"""``kvtrace inspect TRACE``: thin wrapper over :func:`replay.inspection.summarize`."""

from __future__ import annotations

import json

import click

from replay.errors import DataLostError
from replay.inspection import summarize


@click.command("inspect")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--strict", is_flag=True,
              help="Run every check (seq order and duplicates, ranks vs manifest, rows vs rank files, "
                   "uncounted gaps, end state, drops, hook coverage); exit with status 1 when any "
                   "fails or the coverage is not full (partial, uncovered).")
def inspect(trace: str, as_json: bool, strict: bool) -> None:
    """Summarize TRACE: manifest, how it ended, rows per family, ranks, span, drops, bytes on disk."""
    s = summarize(trace, strict=strict)
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
    else:
        _print(s)
    if strict and s["problems"]:
        raise DataLostError(f"{trace}: {len(s['problems'])} problem(s) found by the strict checks "
                            f"(first: {s['problems'][0]})")
    if strict and s["state"] in ("partial", "uncovered"):
        raise DataLostError(f"{trace}: state {s['state']}: the hooks did not cover the code fully "
                            "(the coverage table above; `kvtrace hooks check`)")


def _print(s: dict) -> None:
    prod = s["producer"] or {}
    click.echo(f"trace      {s['path']}")
    click.echo(f"schema     {s['schema_version']}  producer {prod.get('name')} {prod.get('version')} "
               f"({prod.get('source')})" + ("  chains as positions (compacted)"
                                            if s.get("chain_storage") == "positions" else ""))
    if s["server"]:
        click.echo("server     " + ", ".join(f"{k}={v}" for k, v in sorted(s["server"].items())))
    states = s["rank_states"]
    detail = ", ".join(f"rank {r} {st}" for r, st in states.items()) if len(states) > 1 else ""
    click.echo(f"state      {s['state']}" + (f" ({detail})" if detail else ""))
    click.echo(f"ranks      {s['ranks']}")
    click.echo(f"span       {s['span_ns'] / 1e9:.3f} s")
    click.echo(f"{'family':<10} {'rows':>12}")
    for fam, n in s["families"].items():
        click.echo(f"{fam:<10} {n:>12,}")
    click.echo(f"drops      {s['drops']:,} events lost")
    bpe = s["bytes_per_event"]
    mbh = s.get("mb_per_rank_hour")
    click.echo(f"disk       {s['bytes']:,} bytes" + (f", {bpe:.2f} bytes/event" if bpe else "")
               + (f", {mbh:,.2f} MB per rank-hour" if mbh is not None else ""))
    _print_coverage(s)
    for f in s["unreadable_files"]:
        click.echo(f"unreadable {f} (bytes recovery could not read, kept aside)")
    for p in s["problems"]:
        click.echo(f"problem    {p}", err=True)


def _print_coverage(s: dict) -> None:
    """The hooks' coverage per rank (rank files' ``coverage``) and the uncovered processes."""
    from replay.inspection import coverage_lines

    covs = s.get("coverage") or {}
    seen: dict[str, list[str]] = {}
    for r, cov in covs.items():  # ranks with the same coverage are shown once
        key = json.dumps({k: v for k, v in cov.items() if k != "sglang_root"}, sort_keys=True,
                         default=str)
        seen.setdefault(key, []).append(r)
    for key, ranks in seen.items():
        click.echo(f"coverage   rank(s) {', '.join(ranks)}")
        for line in coverage_lines(json.loads(key)):
            click.echo("  " + line)
    for u in s.get("uncovered") or []:
        click.echo(f"uncovered  pid {u.get('pid')} ({' '.join(u.get('argv') or [])}): "
                   f"{u.get('reason')}")
