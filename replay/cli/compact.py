"""``kvtrace compact TRACE``: thin wrapper over :func:`replay.compact.compact_trace`."""

from __future__ import annotations

import json

import sys

import click

from replay.cli.text import force_out

from replay.compact import compact_trace


@click.command("compact")
@click.argument("trace", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(), default=None,
              help="New directory for the compacted copy (refused if it exists, unless --force).")
@click.option("--force", is_flag=True, help="Replace --out if it holds a kvtrace trace or workload (nothing else).")
@click.option("--in-place", is_flag=True, help="Compact TRACE itself (new files verified, then swapped in atomically).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--quiet", is_flag=True, help="No progress bar (there is none when stderr is not a terminal).")
def compact_cmd(trace: str, out: str | None, force: bool, in_place: bool, as_json: bool, quiet: bool) -> None:
    """Store TRACE's prompt chains as positions (schema 1.2): every repeated block a reference,
    new blocks a count, no hash values except each prompt's last (tip_hash).

    Readers see the same equality structure (each new block gets a synthesized value, distinct
    within its rank). Exact or refused: the written files are expanded and compared with the
    original chains before anything is replaced; a damaged, live, already compacted trace or
    one whose blocks are shared across ranks is refused. A run directory compacts too (its
    summary.json and other families are kept).
    """
    if out is not None and force:
        force_out(out, force, inputs=(trace,))  # --out TRACE --force is refused: --in-place does that
    progress = not quiet and not as_json and sys.stderr.isatty()  # a bar only on a terminal
    res = compact_trace(trace, out, in_place=in_place, progress=progress)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    mbh = lambda v: f"{v:,.2f} MB per rank-hour" if v is not None else "no span"  # noqa: E731
    click.echo(f"compacted  {res.trace}  ({res.seconds:.1f} s)")
    click.echo(f"request    {res.rows:,} rows, {res.arrivals:,} chains, {res.blocks:,} blocks "
               f"({res.distinct_blocks:,} distinct; {res.hashes_stored_before:,} hashes stored before, 0 now)")
    click.echo(f"disk       {res.bytes_before:,} -> {res.bytes_after:,} bytes "
               f"(request {res.request_bytes_before:,} -> {res.request_bytes_after:,})")
    click.echo(f"rank-hour  {mbh(res.mb_per_rank_hour_before)} -> {mbh(res.mb_per_rank_hour_after)}")
